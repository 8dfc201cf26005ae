"""``register_tracker_class``: a tracker class named in ``log_with`` like a built-in one, and
``LOGGER_TYPE_TO_CLASS``, the table the names resolve through."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from x_runtime import LOGGER_TYPE_TO_CLASS, Accelerator, GeneralTracker, TensorBoardTracker, register_tracker_class
from x_runtime.tracking.registry import filter_trackers


class Recording(GeneralTracker):
    name = "recording"
    requires_logging_directory = False

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        super().__init__()
        self.run_name, self.kwargs = run_name, kwargs
        self.config: dict = {}
        self.values: list = []

    @property
    def tracker(self) -> Any:
        return self

    def store_init_configuration(self, values: dict) -> None:
        self.config.update(values)

    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        self.values.append((values, step))


class InFolder(Recording):
    name = "in_folder"
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: str, **kwargs: Any) -> None:
        super().__init__(run_name, **kwargs)
        self.logging_dir = logging_dir


@pytest.fixture(autouse=True)
def _restore_registry() -> Iterator[None]:
    saved = dict(LOGGER_TYPE_TO_CLASS)
    yield
    LOGGER_TYPE_TO_CLASS.clear()
    LOGGER_TYPE_TO_CLASS.update(saved)


def test_builtin_trackers_are_in_the_table() -> None:
    assert LOGGER_TYPE_TO_CLASS["tensorboard"] is TensorBoardTracker


def test_registered_class_is_built_by_name_with_init_kwargs() -> None:
    register_tracker_class(Recording)
    accelerator = Accelerator(cpu=True, log_with="Recording")
    accelerator.init_trackers("proj", {"lr": 0.1}, init_kwargs={"recording": {"mode": "offline"}})
    accelerator.log({"loss": 1.5}, step=2)
    tracker = accelerator.get_tracker("recording")
    accelerator.end_training()
    assert isinstance(tracker, Recording)
    assert (tracker.run_name, tracker.kwargs, tracker.config, tracker.values) == (
        "proj",
        {"mode": "offline"},
        {"lr": 0.1},
        [({"loss": 1.5}, 2)],
    )


def test_registered_class_needing_a_folder_gets_it(tmp_path: Path) -> None:
    register_tracker_class(InFolder)
    with pytest.raises(ValueError, match="Logging with `in_folder` requires a `logging_dir`"):
        Accelerator(cpu=True, log_with="in_folder")
    accelerator = Accelerator(cpu=True, log_with="in_folder", project_dir=str(tmp_path))
    accelerator.init_trackers("run")
    tracker = accelerator.get_tracker("in_folder")
    assert (tracker.run_name, tracker.logging_dir) == ("run", str(tmp_path))


def test_invalid_classes_are_refused() -> None:
    class Nameless(GeneralTracker):
        requires_logging_directory = False

    class NoFlag(GeneralTracker):
        name = "no_flag"

    for bad in (dict, Nameless, NoFlag):
        with pytest.raises(ValueError, match="register_tracker_class"):
            register_tracker_class(bad)  # type: ignore[arg-type]
    assert "no_flag" not in LOGGER_TYPE_TO_CLASS


def test_overwriting_warns_and_shadows_a_builtin(tmp_path: Path) -> None:
    class Shadow(Recording):
        name = "tensorboard"

    with pytest.warns(UserWarning, match="'tensorboard' was taken by TensorBoardTracker"):
        register_tracker_class(Shadow)
    assert filter_trackers("tensorboard") == ["tensorboard"]  # no directory needed any more
    accelerator = Accelerator(cpu=True, log_with="tensorboard")
    accelerator.init_trackers("p")
    assert isinstance(accelerator.get_tracker("tensorboard"), Shadow)


def test_unknown_names_list_registered_ones() -> None:
    register_tracker_class(Recording)
    with pytest.raises(
        ValueError,
        match=r"did you mean 'recording'\?.*mlflow, aim, comet_ml, clearml, dvclive, swanlab, trackio, recording",
    ):
        filter_trackers("recordin")


def test_tensorboard_without_a_folder_fails_when_the_accelerator_is_built() -> None:
    with pytest.raises(ValueError, match="Logging with `tensorboard` requires a `logging_dir`"):
        Accelerator(cpu=True, log_with="tensorboard")


def test_names_match_whatever_their_case() -> None:
    class MixedCase(Recording):
        name = "MixedCase"

    register_tracker_class(MixedCase)
    with pytest.warns(UserWarning, match="'MixedCase' was taken by MixedCase"):
        register_tracker_class(MixedCase)
    assert [key for key in LOGGER_TYPE_TO_CLASS if key.lower() == "mixedcase"] == ["MixedCase"]
    accelerator = Accelerator(cpu=True, log_with="mixedcase")
    accelerator.init_trackers("p", init_kwargs={"MixedCase": {"flag": True}})
    assert accelerator.get_tracker("MixedCase").kwargs == {"flag": True}
