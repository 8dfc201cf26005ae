"""Aim, Comet, ClearML, DVCLive, MLflow, SwanLab and trackio trackers: real packages where installed, read back.

Each backend that is installed runs offline through ``Accelerator(log_with=NAME, project_dir=...)``:
``init_trackers`` with a config, ``log`` at given steps, ``end_training``; then what the backend
wrote is read back with its own files or reader, and compared with the same run under Accelerate
1.15.0 when that is installed. Without a backend's package only its missing-package error and its
signature parity with Accelerate's class are checked.
"""

from __future__ import annotations

import inspect
import json
import logging
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

import x_runtime
from x_runtime import Accelerator
from x_runtime.tracking import (
    AimTracker,
    ClearMLTracker,
    CometMLTracker,
    DVCLiveTracker,
    LoggerType,
    MLflowTracker,
    SwanLabTracker,
    TrackioTracker,
    filter_trackers,
)

# name in log_with, x's class, the module imported, the pip package named in the error
BACKENDS = [
    ("aim", AimTracker, "aim", "aim"),
    ("comet_ml", CometMLTracker, "comet_ml", "comet_ml"),
    ("clearml", ClearMLTracker, "clearml", "clearml"),
    ("dvclive", DVCLiveTracker, "dvclive", "dvclive"),
    ("mlflow", MLflowTracker, "mlflow", "mlflow"),
    ("swanlab", SwanLabTracker, "swanlab", "swanlab"),
    ("trackio", TrackioTracker, "trackio", "trackio"),
]
CONFIG = {"num_iterations": 12, "learning_rate": 1e-2, "some_boolean": False, "some_string": "some_value"}


def _accelerate_tracking() -> Any:
    return pytest.importorskip("accelerate.tracking", reason="compares with Accelerate 1.15.0")


def _accelerators() -> list[tuple[str, Any]]:
    """x's Accelerator, and Accelerate's when installed (the same run on both)."""
    found: list[tuple[str, Any]] = [("x", Accelerator)]
    try:
        from accelerate import Accelerator as AccelerateAccelerator
    except ImportError:
        pass
    else:
        found.append(("accelerate", AccelerateAccelerator))
    return found


# --- every backend, installed or not ------------------------------------------------------------


@pytest.mark.parametrize(("name", "cls", "module", "package"), BACKENDS)
def test_missing_package_is_one_line_naming_pip_install(
    monkeypatch: pytest.MonkeyPatch, name: str, cls: type, module: str, package: str
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # import and find_spec both fail
    with pytest.raises(ImportError, match=rf"^log_with={name!r} needs the {package} package: pip install {package}$"):
        filter_trackers(name, "runs")
    args: tuple[str, ...] = ("run", "runs") if cls.requires_logging_directory else ("run",)
    with pytest.raises(
        ImportError, match=rf"^the {module} tracker needs the {package} package: pip install {package}$"
    ):
        cls(*args)


def test_logger_types_and_names_are_accelerates() -> None:
    tracking = _accelerate_tracking()
    assert {member.value for member in LoggerType} == {member.value for member in tracking.LoggerType}
    for member in tracking.LoggerType:
        assert LoggerType[member.name].value == member.value  # same member names too (COMETML = "comet_ml")
    assert set(x_runtime.LOGGER_TYPE_TO_CLASS) == set(tracking.LOGGER_TYPE_TO_CLASS)
    for name, cls, _, _ in BACKENDS:
        assert x_runtime.LOGGER_TYPE_TO_CLASS[name] is cls
        assert getattr(x_runtime, cls.__name__) is cls


def _parameters(function: Any) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


@pytest.mark.parametrize(("name", "cls", "module", "package"), BACKENDS)
def test_signatures_match_accelerates_class(name: str, cls: type, module: str, package: str) -> None:
    theirs = getattr(_accelerate_tracking(), cls.__name__)
    for attribute in ("name", "requires_logging_directory", "main_process_only"):
        assert getattr(cls, attribute) == getattr(theirs, attribute), attribute
    assert _parameters(cls.__init__) == _parameters(theirs.__init__)
    public = {n for n in vars(theirs) if not n.startswith("_")}
    assert public <= set(dir(cls))
    for method in public - {"name", "requires_logging_directory", "main_process_only", "tracker"}:
        assert _parameters(getattr(cls, method)) == _parameters(getattr(theirs, method)), method


# --- DVCLive: params.yaml, metrics.json and one .tsv per metric ----------------------------------


def _dvclive_run(accelerator_class: Any, folder: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.setattr("dvclive.live.get_dvc_repo", lambda: None)  # no DVC repository around the test
    accelerator = accelerator_class(log_with="dvclive", project_dir=str(folder))
    live_dir = folder / "dvclive"
    accelerator.init_trackers(
        "proj", CONFIG, {"dvclive": {"dir": str(live_dir), "save_dvc_exp": False, "dvcyaml": None}}
    )
    values = {"total_loss": 0.1, "iteration": 1, "my_text": "some_value"}
    accelerator.log(values)  # step 0
    accelerator.log(values)  # step 1
    accelerator.log({**values, "total_loss": 0.05}, step=3)
    accelerator.end_training()
    tables = {}
    for tsv in sorted((live_dir / "plots" / "metrics").glob("*.tsv")):
        rows = [line.split("\t") for line in tsv.read_text().splitlines()]
        tables[tsv.stem] = [dict(zip(rows[0], row, strict=True)) for row in rows[1:]]
    return {
        "params": yaml.safe_load((live_dir / "params.yaml").read_text()),
        "latest": json.loads((live_dir / "metrics.json").read_text()),
        "tables": {key: [(row["step"], row[key]) for row in table] for key, table in tables.items()},
    }


def test_dvclive_writes_params_and_metrics_as_accelerate_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("dvclive")
    runs = {label: _dvclive_run(cls, tmp_path / label, monkeypatch) for label, cls in _accelerators()}
    ours = runs["x"]
    assert ours["params"] == CONFIG
    assert ours["latest"] == {"step": 3, "total_loss": 0.05, "iteration": 1, "my_text": "some_value"}
    assert ours["tables"]["total_loss"] == [("0", "0.1"), ("1", "0.1"), ("3", "0.05")]
    assert ours["tables"]["iteration"] == [("0", "1"), ("1", "1"), ("3", "1")]
    if "accelerate" in runs:
        assert ours == runs["accelerate"]


def test_dvclive_skips_what_it_cannot_record_with_one_warning_per_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("dvclive")
    import torch

    monkeypatch.setattr("dvclive.live.get_dvc_repo", lambda: None)
    tracker = DVCLiveTracker(dir=str(tmp_path / "live"), save_dvc_exp=False, dvcyaml=None)
    with caplog.at_level(logging.WARNING, logger="x_runtime.tracking"):
        tracker.log({"loss": torch.tensor(0.5), "tokens": [1, 2]}, step=0)
        tracker.log({"loss": 0.25, "tokens": [3]})
    tracker.finish()
    assert [r.getMessage() for r in caplog.records] == [
        "DVCLive cannot record 'tokens' (a list); it accepts numbers and strings, so this key is skipped"
    ]
    assert json.loads((tmp_path / "live" / "metrics.json").read_text()) == {"step": 1, "loss": 0.25}
    assert (tmp_path / "live" / "plots" / "metrics" / "loss.tsv").read_text().splitlines()[1:] == ["0\t0.5", "1\t0.25"]


# --- Comet: the offline experiment's zip, messages.json ------------------------------------------


def _comet_messages(folder: Path) -> dict[str, Any]:
    (archive,) = folder.glob("*.zip")
    with zipfile.ZipFile(archive) as opened:
        lines = opened.read("messages.json").decode("utf-8").splitlines()
    params, metrics, others = {}, [], {}
    for line in lines:
        payload = json.loads(line)["payload"]
        if "param" in payload and payload["param"]["source"] == "manual":
            params[payload["param"]["paramName"]] = payload["param"]["paramValue"]
        if "metric" in payload and not payload["metric"]["metricName"].startswith("sys."):
            metric = payload["metric"]
            if metric["metricName"] != "process duration":
                metrics.append((metric["metricName"], metric["metricValue"], metric["step"]))
        if "key" in payload and "value" in payload:  # Experiment.log_other
            others[payload["key"]] = payload["value"]
    return {"params": params, "metrics": sorted(metrics), "others": others}


def _comet_run(accelerator_class: Any, folder: Path) -> dict[str, Any]:
    from comet_ml import ExperimentConfig

    config = ExperimentConfig(
        offline_directory=str(folder), log_code=False, log_git_metadata=False, log_env_details=False
    )
    accelerator = accelerator_class(log_with="comet_ml", project_dir=str(folder))
    accelerator.init_trackers("proj", CONFIG, {"comet_ml": {"online": False, "experiment_config": config}})
    accelerator.log({"total_loss": 0.1, "iteration": 1, "my_text": "some_value"}, step=0)
    accelerator.log({"total_loss": 0.05, "group": {"a": 1.5, "b": 2.5}}, step=4)
    accelerator.end_training()
    return _comet_messages(folder)


def test_comet_offline_experiment_holds_params_metrics_and_text_as_accelerate_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COMET_ERROR_TRACKING_ENABLE", "false")  # no error reports sent from a test
    pytest.importorskip("comet_ml")
    runs = {label: _comet_run(cls, tmp_path / label) for label, cls in _accelerators()}
    ours = runs["x"]
    assert {k: ours["params"][k] for k in CONFIG} == CONFIG
    assert ours["params"]["curr_step"] == 4  # set_step(step) before logging
    assert ("total_loss", 0.1, 0) in ours["metrics"] and ("total_loss", 0.05, 4) in ours["metrics"]
    assert ("iteration", 1, 0) in ours["metrics"]
    assert ("a", 1.5, 4) in ours["metrics"] and ("b", 2.5, 4) in ours["metrics"]
    assert ours["others"]["my_text"] == "some_value"
    if "accelerate" in runs:
        assert ours == runs["accelerate"]


# --- ClearML: the offline session's task.json and metrics.jsonl ----------------------------------


def _clearml_run(accelerator_class: Any, folder: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    from clearml import Task
    from clearml.config import get_offline_dir
    from clearml.utilities.config import text_to_config_dict

    monkeypatch.setenv("CLEARML_CACHE_DIR", str(folder))
    Task.set_offline(True)
    accelerator = accelerator_class(log_with="clearml", project_dir=str(folder))
    options = {"auto_connect_frameworks": {"detect_repository": False}, "auto_resource_monitoring": False}
    accelerator.init_trackers("proj", CONFIG, {"clearml": options})
    accelerator.log({"should_be_under_train": 1, "eval_value": 2, "test_value": 3.1, "train_value": 4.1}, step=1)
    accelerator.log({"single_value_1": 1.1, "single_value_2": 2.2})
    offline = Path(get_offline_dir(task_id=accelerator.get_tracker("clearml", unwrap=True).id))
    accelerator.end_training()
    task = json.loads((offline / "task.json").read_text())
    metrics = []
    for line in (offline / "metrics.jsonl").read_text().splitlines():
        for event in json.loads(line):
            metrics.append((event["metric"], event["variant"], event.get("iter"), event["value"]))
    return {
        "config": text_to_config_dict(task["configuration"]["General"]["value"]),
        "metrics": sorted(metrics, key=repr),
    }


def test_clearml_offline_session_holds_config_and_series_as_accelerate_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("clearml")
    runs = {label: _clearml_run(cls, tmp_path / label, monkeypatch) for label, cls in _accelerators()}
    ours = runs["x"]
    assert ours["config"] == CONFIG
    scalars = {(m, v, i, value) for m, v, i, value in ours["metrics"] if m != "Summary"}
    assert scalars == {
        ("should_be_under_train", "train", 1, 1),
        ("value", "eval", 1, 2),
        ("value", "test", 1, 3.1),
        ("value", "train", 1, 4.1),
    }
    single = {(v, value) for m, v, _, value in ours["metrics"] if m == "Summary"}
    assert single == {("single_value_1", 1.1), ("single_value_2", 2.2)}
    if "accelerate" in runs:
        assert ours == runs["accelerate"]


# --- MLflow: a local file store, read back with MLflow's own client -------------------------------


def _mlflow_run(accelerator_class: Any, folder: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    mlflow = pytest.importorskip("mlflow")
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"file://{folder / 'mlruns'}")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow >= 3.7 refuses a file store unless told
    files = folder / "files"
    (files / "nested").mkdir(parents=True)
    (files / "notes.txt").write_text("one file")
    (files / "nested" / "a.json").write_text("{}")
    accelerator = accelerator_class(log_with="mlflow", project_dir=str(folder))
    accelerator.init_trackers("experiment", {**CONFIG, "too_long": "x" * 6001})
    accelerator.log({"loss": 0.5, "note": "text"}, step=1)
    accelerator.log({"loss": 0.25}, step=2)
    tracker = accelerator.get_tracker("mlflow")
    tracker.log_artifact(str(files / "notes.txt"))
    tracker.log_artifact(str(files / "notes.txt"), artifact_path="copies")
    tracker.log_artifacts(str(files), artifact_path="all")
    figure = pyplot.figure(figsize=(2, 2))
    pyplot.plot([0, 1], [1, 0])
    tracker.log_figure(figure, "plots/loss.png")
    run_id = tracker.tracker.info.run_id
    accelerator.end_training()
    client = mlflow.MlflowClient()
    run = client.get_run(run_id)

    def listing(path: str | None = None) -> list[str]:
        found = []
        for item in client.list_artifacts(run_id, path):
            found += listing(item.path) if item.is_dir else [item.path]
        return found

    image = Path(
        mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="plots/loss.png", dst_path=str(folder / "got"))
    )
    return {
        "experiment": mlflow.get_experiment(run.info.experiment_id).name,
        "params": run.data.params,
        "loss": [(m.step, m.value) for m in client.get_metric_history(run_id, "loss")],
        "metrics": sorted(run.data.metrics),
        "artifacts": sorted(listing()),
        "png": image.read_bytes()[:8],
        "status": run.info.status,
    }


def test_mlflow_run_holds_params_metrics_and_artifacts_as_accelerate_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = {label: _mlflow_run(cls, tmp_path / label, monkeypatch) for label, cls in _accelerators()}
    ours = runs["x"]
    assert ours["experiment"] == "experiment"
    assert ours["params"] == {key: str(value) for key, value in CONFIG.items()}  # too_long skipped
    assert ours["loss"] == [(1, 0.5), (2, 0.25)] and ours["metrics"] == ["loss"]
    assert ours["artifacts"] == [
        "all/nested/a.json",
        "all/notes.txt",
        "copies/notes.txt",
        "notes.txt",
        "plots/loss.png",
    ]
    assert ours["png"] == b"\x89PNG\r\n\x1a\n" and ours["status"] == "FINISHED"
    if "accelerate" in runs:
        assert ours == runs["accelerate"]


def test_mlflow_environment_overrides_arguments_as_accelerate_reads_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "from-env")
    monkeypatch.setenv("MLFLOW_TAGS", '{"team": "vision"}')
    monkeypatch.setenv("MLFLOW_NESTED_RUN", "yes")
    tracker = MLflowTracker("from-argument", tags={"team": "nlp"})
    assert (tracker.experiment_name, tracker.tags, tracker.nested_run) == ("from-env", {"team": "vision"}, True)
    assert tracker.active_run is None  # no run until start(), as Accelerate's: building one logs nothing
    monkeypatch.setenv("MLFLOW_NESTED_RUN", "maybe")
    with pytest.raises(ValueError, match=r"^MLFLOW_NESTED_RUN='maybe' is not a boolean: set it to true or false"):
        MLflowTracker("e")


# --- SwanLab: the run folder of an offline run ---------------------------------------------------


def test_swanlab_offline_run_stores_the_config(tmp_path: Path) -> None:
    pytest.importorskip("swanlab")
    accelerator = Accelerator(log_with="swanlab", project_dir=str(tmp_path))
    accelerator.init_trackers("proj", CONFIG, {"swanlab": {"mode": "offline", "logdir": str(tmp_path / "swanlog")}})
    accelerator.log({"loss": 0.5}, step=1)
    accelerator.log({"loss": 0.25}, step=2)
    tracker = accelerator.get_tracker("swanlab")
    accelerator.end_training()
    assert tracker.run_name == "proj"
    (config_file,) = (tmp_path / "swanlog").glob("run-*/files/config.yaml")
    stored = {key: entry["value"] for key, entry in yaml.safe_load(config_file.read_text()).items()}
    assert stored == CONFIG  # only what was given: no allow_val_change or FRAMEWORK entries
    (records,) = (tmp_path / "swanlog").glob("run-*/run-*.swanlab")
    assert b"loss" in records.read_bytes()


# --- trackio: the project's local database -------------------------------------------------------


def test_trackio_logs_to_its_local_database(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))
    trackio = pytest.importorskip("trackio")
    accelerator = Accelerator(log_with="trackio", project_dir=str(tmp_path))
    accelerator.init_trackers("proj", CONFIG, {"trackio": {"name": "run-a"}})
    accelerator.log({"loss": 0.5}, step=1)
    accelerator.log({"loss": 0.25}, step=2)
    accelerator.end_training()
    logs = trackio.SQLiteStorage.get_logs(project="proj", run="run-a")
    assert [(row["step"], row["loss"]) for row in logs if "loss" in row] == [(1, 0.5), (2, 0.25)]


# --- Aim: the repository's run and metric sequences ----------------------------------------------


def test_aim_tracks_hparams_and_metrics_in_its_repository(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    aim = pytest.importorskip("aim")
    accelerator = Accelerator(log_with="aim", project_dir=str(tmp_path))
    accelerator.init_trackers("proj", {"lr": 0.01, "optimizer": {"name": "adamw"}})
    with caplog.at_level(logging.WARNING, logger="x_runtime.tracking"):
        accelerator.log({"loss": 0.5, "note": "warmup"}, step=1)  # Aim itself raises on a string
        accelerator.log({"loss": 0.25, "note": "steady"}, step=2)
    run_hash = accelerator.get_tracker("aim", unwrap=True).hash
    accelerator.end_training()
    assert [r.getMessage() for r in caplog.records] == [
        "Aim cannot record 'note' (a str); it accepts numbers and Aim objects (aim.Text for text), so this key is skipped"
    ]
    run = aim.Run(run_hash=run_hash, repo=str(tmp_path))  # reopened: a read-only Run does not see it yet
    try:
        assert run.name == "proj"
        assert run["hparams"] == {"lr": 0.01, "optimizer": {"name": "adamw"}}
        (loss,) = [metric for metric in run.metrics() if metric.name == "loss"]
        assert [(step, value) for step, (value, *_) in loss.data.items()] == [(1, 0.5), (2, 0.25)]
        assert not [metric for metric in run.metrics() if metric.name == "note"]
    finally:
        run.close()
