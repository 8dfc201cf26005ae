"""Trackers write what was logged (TensorBoard read back from its event files), and log_with is validated."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import logging
import sys
import time
import types
from pathlib import Path

import pytest
import torch

from x_runtime.tracking import (
    GeneralTracker,
    LoggerType,
    MLflowTracker,
    TensorBoardTracker,
    WandBTracker,
    available_trackers,
    build_trackers,
    filter_trackers,
)

# tensorboard is a test-only dependency here: without it only the TensorBoard tests are skipped.
needs_tensorboard = pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="needs tensorboard")


def _events(path: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(path))
    accumulator.Reload()
    return accumulator


def _fake_module(monkeypatch: pytest.MonkeyPatch, name: str, **attrs) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)  # find_spec needs one
    for key, value in attrs.items():
        setattr(module, key, value)
    monkeypatch.setitem(sys.modules, name, module)
    return module


# The packages of every built-in tracker but TensorBoard.
OPTIONAL_BACKENDS = ("wandb", "mlflow", "aim", "comet_ml", "clearml", "dvclive", "swanlab", "trackio")


@pytest.fixture
def no_optional_backends(monkeypatch: pytest.MonkeyPatch) -> None:
    # None in sys.modules makes both find_spec and import fail, whatever is installed.
    for name in OPTIONAL_BACKENDS:
        monkeypatch.setitem(sys.modules, name, None)


class RecordingTracker(GeneralTracker):
    name = "recording"
    requires_logging_directory = False

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple] = []

    @property
    def tracker(self):
        return self.calls

    def start(self) -> None:
        self.calls.append(("start",))


# --- TensorBoard, read back from disk ----------------------------------------------------------


@needs_tensorboard
def test_tensorboard_scalars_text_and_groups(tmp_path: Path) -> None:
    tracker = TensorBoardTracker("run", tmp_path)
    assert tracker.tracker is tracker.writer
    tracker.log({"loss": 1.5, "acc": torch.tensor(0.25), "note": "warmup", "lr": {"head": 0.1, "body": 2}}, step=3)
    tracker.log({"loss": 0.5}, step=7)
    # Readable before finish(): log() flushes.
    events = _events(tmp_path / "run")
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(3, 1.5), (7, 0.5)]
    assert [(e.step, e.value) for e in events.Scalars("acc")] == [(3, 0.25)]
    (text,) = events.Tensors("note/text_summary")
    assert (text.step, list(text.tensor_proto.string_val)) == (3, [b"warmup"])
    head = _events(tmp_path / "run" / "lr_head").Scalars("lr")
    body = _events(tmp_path / "run" / "lr_body").Scalars("lr")
    assert [(e.step, pytest.approx(e.value)) for e in head] == [(3, 0.1)]
    assert [(e.step, e.value) for e in body] == [(3, 2.0)]
    tracker.finish()


@needs_tensorboard
def test_tensorboard_hparams_in_the_run_itself(tmp_path: Path) -> None:
    tracker = TensorBoardTracker("run", tmp_path)
    tracker.store_init_configuration({"lr": 0.001, "optimizer": {"name": "adamw", "betas": [0.9, 0.99]}, "seed": None})
    tracker.finish()
    # The event file is the run's own; the one folder beside it holds hparams.yml alone (below).
    (folder,) = [p for p in (tmp_path / "run").iterdir() if p.is_dir()]
    assert [p.name for p in folder.iterdir()] == ["hparams.yml"]
    from tensorboard.plugins.hparams import plugin_data_pb2

    content = _events(tmp_path / "run").PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    hparams = start.session_start_info.hparams
    assert hparams["lr"].number_value == pytest.approx(0.001)
    assert hparams["optimizer/name"].string_value == "adamw"
    assert hparams["optimizer/betas"].string_value == "[0.9, 0.99]"
    assert hparams["seed"].string_value == "None"


@needs_tensorboard
def test_tensorboard_writes_hparams_yml_where_and_as_accelerate_does(tmp_path: Path) -> None:
    before = time.time()
    tracker = TensorBoardTracker("run", tmp_path)
    tracker.store_init_configuration({"lr": 0.001, "optimizer": {"name": "adamw", "betas": [0.9, 0.99]}, "seed": None})
    tracker.finish()
    # Accelerate 1.15.0: <logging_dir>/<run>/<str(time.time())>/hparams.yml, yaml.dump of the values.
    (path,) = (tmp_path / "run").glob("*/hparams.yml")
    assert before <= float(path.parent.name) <= time.time()
    assert path.read_text() == ("lr: 0.001\noptimizer:\n  betas:\n  - 0.9\n  - 0.99\n  name: adamw\nseed: null\n")


@needs_tensorboard
def test_tensorboard_skips_unsupported_values_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tracker = TensorBoardTracker("run", tmp_path)
    with caplog.at_level(logging.WARNING, logger="x_runtime.tracking"):
        for step in range(3):
            tracker.log({"loss": float(step), "sizes": [1, 2], "mixed": {"a": 1, "b": "x"}}, step=step)
    tracker.finish()
    assert len(caplog.records) == 2
    assert "'sizes' (a list)" in caplog.records[0].getMessage()
    assert [e.step for e in _events(tmp_path / "run").Scalars("loss")] == [0, 1, 2]


@needs_tensorboard
def test_tensorboard_passes_writer_options(tmp_path: Path) -> None:
    tracker = TensorBoardTracker("run", tmp_path, filename_suffix=".custom")
    tracker.log({"x": 1})
    tracker.finish()
    assert [p.name.endswith(".custom") for p in (tmp_path / "run").iterdir()] == [True]


# --- wandb and MLflow: missing packages and calls through fakes ---------------------------------


@pytest.mark.parametrize(
    ("cls", "args", "package"), [(WandBTracker, ("p",), "wandb"), (MLflowTracker, ("e",), "mlflow")]
)
def test_missing_backend_names_the_install_command(no_optional_backends: None, cls, args, package: str) -> None:
    with pytest.raises(ImportError, match=rf"pip install {package}$"):
        cls(*args)


def test_wandb_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple] = []

    class Config:
        def update(self, values, allow_val_change=False):
            calls.append(("config", values, allow_val_change))

    class Run:
        config = Config()

        def log(self, values, step=None, **kwargs):
            calls.append(("log", values, step, kwargs))

        def finish(self):
            calls.append(("finish",))

    run = Run()

    def init(**kwargs):
        calls.append(("init", kwargs))
        return run

    _fake_module(monkeypatch, "wandb", init=init)
    (tracker,) = build_trackers("wandb", "proj", init_kwargs={"wandb": {"entity": "me"}})
    assert tracker.tracker is run
    tracker.store_init_configuration({"lr": 0.1})
    tracker.log({"loss": 1.0}, step=2, commit=False)
    tracker.finish()
    assert calls == [
        ("init", {"project": "proj", "entity": "me"}),
        ("config", {"lr": 0.1}, True),
        ("log", {"loss": 1.0}, 2, {"commit": False}),
        ("finish",),
    ]


def test_mlflow_calls(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    calls: list[tuple] = []
    validation = types.SimpleNamespace(MAX_PARAM_VAL_LENGTH=10, MAX_PARAMS_TAGS_PER_BATCH=2)
    _fake_module(
        monkeypatch,
        "mlflow",
        get_experiment_by_name=lambda name: None,
        create_experiment=lambda name, **kw: calls.append(("create", name, kw)) or "exp-1",
        start_run=lambda **kw: calls.append(("start", kw)) or "run",
        log_params=lambda params: calls.append(("params", params)),
        log_metrics=lambda metrics, step=None: calls.append(("metrics", metrics, step)),
        end_run=lambda: calls.append(("end",)),
        utils=types.SimpleNamespace(validation=validation),
    )
    tracker = MLflowTracker("exp", logging_dir="/artifacts", run_name="r1")
    assert tracker.tracker is None and calls == []  # the run opens in start(), as Accelerate's
    tracker.start()
    assert tracker.tracker == "run"
    with caplog.at_level(logging.WARNING, logger="x_runtime.tracking"):
        tracker.store_init_configuration({"a": 1, "b": 2, "c": 3, "long": "x" * 11})
        tracker.log({"loss": torch.tensor(0.5), "note": "text"}, step=4)
    tracker.finish()
    assert calls == [
        ("create", "exp", {"artifact_location": "/artifacts", "tags": None}),
        (
            "start",
            {
                "run_id": None,
                "experiment_id": "exp-1",
                "run_name": "r1",
                "nested": False,
                "tags": None,
                "description": None,
            },
        ),
        ("params", {"a": 1, "b": 2}),
        ("params", {"c": 3}),
        ("metrics", {"loss": 0.5}, 4),
        ("end",),
    ]
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        "MLflow cannot record 'long'",
        "MLflow cannot record 'note'",
    ]


# --- filter_trackers ----------------------------------------------------------------------------


@needs_tensorboard
def test_filter_accepts_names_enums_instances_and_lists(tmp_path: Path) -> None:
    custom = RecordingTracker()
    assert filter_trackers(None) == []
    assert filter_trackers("TensorBoard", tmp_path) == [LoggerType.TENSORBOARD]
    assert filter_trackers(LoggerType.TENSORBOARD, tmp_path) == ["tensorboard"]
    assert filter_trackers(custom) == [custom]
    assert filter_trackers([custom, "tensorboard", LoggerType.TENSORBOARD, custom], tmp_path) == [
        custom,
        LoggerType.TENSORBOARD,
    ]


@needs_tensorboard
def test_filter_all_means_every_installed_tracker(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in OPTIONAL_BACKENDS:
        monkeypatch.setitem(sys.modules, name, None)
    _fake_module(monkeypatch, "wandb")
    custom = RecordingTracker()
    assert available_trackers() == [LoggerType.TENSORBOARD, LoggerType.WANDB]
    assert filter_trackers([custom, "all"], tmp_path) == [custom, LoggerType.TENSORBOARD, LoggerType.WANDB]


def test_filter_unknown_name_suggests_the_nearest() -> None:
    with pytest.raises(ValueError, match=r"unknown tracker 'tensorbord'; did you mean 'tensorboard'\?") as excinfo:
        filter_trackers("tensorbord")
    assert "all, tensorboard, wandb, mlflow" in str(excinfo.value)
    with pytest.raises(ValueError, match=r"unknown tracker 'zzz' Valid trackers: all, "):
        filter_trackers(["zzz"])


def test_filter_tensorboard_needs_a_directory() -> None:
    with pytest.raises(ValueError, match="pass project_dir \\(or logging_dir\\)"):
        filter_trackers("tensorboard")


def test_filter_missing_package_is_an_error(no_optional_backends: None) -> None:
    with pytest.raises(ImportError, match=r"log_with='wandb' needs the wandb package: pip install wandb"):
        filter_trackers(["wandb"])


def test_filter_rejects_other_objects() -> None:
    with pytest.raises(TypeError, match="got int"):
        filter_trackers([3])

    class Incomplete(GeneralTracker):
        name = "incomplete"

    with pytest.raises(NotImplementedError, match="`requires_logging_directory`, `tracker`"):
        Incomplete()
    blank = Incomplete(_blank=True)
    with pytest.raises(TypeError, match="lacks `requires_logging_directory`, `tracker`"):
        filter_trackers(blank)


# --- build_trackers -----------------------------------------------------------------------------


@needs_tensorboard
def test_build_creates_starts_and_passes_through(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    custom = RecordingTracker()
    with caplog.at_level(logging.WARNING, logger="x_runtime.tracking"):
        trackers = build_trackers(
            [custom, "tensorboard"],
            "proj",
            tmp_path,
            {LoggerType.TENSORBOARD: {"filename_suffix": ".tb"}, "comet_ml": {}},
        )
    assert trackers[0] is custom and custom.calls == [("start",)]
    assert isinstance(trackers[1], TensorBoardTracker)
    assert trackers[1].logging_dir == str(tmp_path / "proj")
    trackers[1].log({"x": 1.0}, step=1)
    trackers[1].finish()
    assert [p.suffix for p in (tmp_path / "proj").iterdir()] == [".tb"]
    assert [r.getMessage() for r in caplog.records] == ["init_kwargs for comet_ml ignored: no such tracker is in use"]


@needs_tensorboard
def test_build_closes_opened_trackers_when_a_later_one_fails(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    closed = []
    monkeypatch.setattr(TensorBoardTracker, "finish", lambda self: closed.append(self.run_name) or self.writer.close())

    def broken_init(**kwargs):
        raise RuntimeError("no network")

    _fake_module(monkeypatch, "wandb", init=broken_init)
    with pytest.raises(RuntimeError, match="no network"):
        build_trackers(["tensorboard", "wandb"], "proj", tmp_path)
    assert closed == ["proj"]
