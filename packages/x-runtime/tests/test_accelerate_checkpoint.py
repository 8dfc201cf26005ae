"""x's ``load_state`` resumes a folder Accelerate's ``save_state`` wrote.

The side-by-side test (``workers/accelerate_resume_worker.py``, on 1 and 2 processes, a loader
in order and a shuffled one) trains a small model (AdamW, StepLR, a registered object) under
Accelerate 1.15.0, saves at step 7, and finishes; then a fresh Accelerate process and a fresh x
process each resume that folder and finish. x's resumed weights must equal Accelerate's resumed
weights bit for bit; every generator's next draw after ``load_state`` must be the one after
``save_state``. Accelerate is a test-only tool here (never a dependency): without it those
tests skip.

Shuffled (``use_seedable_sampler=False``, Accelerate's default) x's resume still ends with
Accelerate's resumed weights, but those differ from the uninterrupted run's: Accelerate's own
resume does not reproduce the uninterrupted order (for a map-style dataset its checkpoint holds no
loader position or sampler state), and x, reading that checkpoint, resumes as Accelerate does.
In order, all three agree. The
training draws nothing from the global generator: Accelerate's resume starts a DataLoader
iterator after the restore, which takes one draw from it (x's loaders have their own generator),
so noise or dropout would differ by that draw, not by the checkpoint; the generators' next draws
right after ``load_state`` are compared directly instead. With ``use_seedable_sampler=True`` the
orders differ uninterrupted already (Accelerate seeds its sampler with ``torch.initial_seed()``,
x draws a seed): an expected failure below until ``data/`` agrees.

The in-process tests need no Accelerate: they write its layout by hand (as its ``save_state``
names and writes the files) and pin the refusals: a tampered ``random_states_0.pkl`` is refused
without being run, a missing weights file is named, an interrupted x save is still called one.
"""

from __future__ import annotations

import json
import os
import pickle
import re
from importlib.util import find_spec
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from x_runtime import Accelerator, ProjectConfiguration
from x_runtime.checkpoint import MANIFEST, written_by_accelerate

needs_accelerate = pytest.mark.skipif(
    find_spec("accelerate") is None,
    reason="Accelerate is not installed in this venv (a test-only tool, never a dependency of x): "
    "pip install accelerate==1.15.0 to run the side-by-side resume",
)
RUNS = (("accelerate", "save"), ("accelerate", "resume"), ("x", "resume"))


def _resume_all(launch, root: Path, processes: int, shuffle: str) -> dict[str, list]:
    """Each run's (weights, report, stderr) per rank: Accelerate saves, then both resume."""
    found: dict[str, list] = {"folder": [root / "ckpt"]}
    for framework, mode in RUNS:
        out = root / f"{framework}-{mode}"
        out.mkdir()
        result = launch(
            "accelerate_resume_worker.py", processes, str(out), framework, mode, str(root / "ckpt"), shuffle, "0"
        )
        found[f"{framework}-{mode}"] = [
            (
                torch.load(out / f"{framework}-{mode}-rank{rank}.pt", weights_only=True),
                json.loads((out / f"rank{rank}.json").read_text()),
                result.stderr,
            )
            for rank in range(processes)
        ]
    return found


CASES = [(1, "0"), (2, "0"), (1, "1"), (2, "1")]


@pytest.fixture(
    scope="module", params=CASES, ids=[f"{n}proc-{'shuffled' if s == '1' else 'in-order'}" for n, s in CASES]
)
def resumed(request, tmp_path_factory, launch) -> dict[str, list]:
    processes, shuffle = request.param
    root = tmp_path_factory.mktemp(f"accelerate-resume-{processes}-{shuffle}")
    found = _resume_all(launch, root, processes, shuffle)
    found["shuffle"] = [shuffle == "1"]
    return found


def _assert_same_weights(got: dict, want: dict, what: str) -> None:
    assert got.keys() == want.keys()
    different = [name for name in want if not torch.equal(got[name], want[name])]
    assert not different, f"{what}: {different} differ"


@needs_accelerate
def test_x_resumes_accelerate_folder_to_accelerate_weights(resumed) -> None:
    assert written_by_accelerate(resumed["folder"][0])
    for rank, (x_weights, x_report, x_err) in enumerate(resumed["x-resume"]):
        acc_weights, acc_report, _ = resumed["accelerate-resume"][rank]
        full_weights, full_report, _ = resumed["accelerate-save"][rank]
        _assert_same_weights(x_weights, acc_weights, f"rank {rank}: x's resume vs Accelerate's")
        if not resumed["shuffle"][0]:  # shuffled, Accelerate's own resume reshuffles (see the docstring)
            _assert_same_weights(acc_weights, full_weights, f"rank {rank}: Accelerate's resume vs uninterrupted")
        # Steps, the registered counter, the scheduler's lr, and Python/NumPy/torch's next draws.
        assert x_report == acc_report == full_report
        assert x_err.count("written by Accelerate") == 1  # one line, from the main process only


@needs_accelerate
def test_shuffled_seedable_resume_matches_accelerate(tmp_path, launch) -> None:
    found = _resume_all(launch, tmp_path, 1, "seedable")
    _assert_same_weights(found["x-resume"][0][0], found["accelerate-resume"][0][0], "x's resume vs Accelerate's")


# --- Going back: Accelerate's load_state resumes a folder x wrote ---------------------------------


@pytest.fixture(scope="module", params=[1, 2], ids=["1proc", "2proc"])
def went_back(request, tmp_path_factory, launch) -> dict[str, list]:
    """x saves at step 12, and Accelerate and x resume from its folder.

    Every step draws noise from the restored generator. Step 12 ends an epoch on 1 and on 2 processes:
    the resumed runs then start a loader iterator where the uninterrupted one did (mid-epoch,
    Accelerate's ``skip_first_batches`` starts one more, which draws from the global generator).
    """
    processes = request.param
    root = tmp_path_factory.mktemp(f"back-to-accelerate-{processes}")
    found: dict[str, list] = {}
    for framework, mode in (("x", "save"), ("accelerate", "resume"), ("x", "resume")):
        out = root / f"{framework}-{mode}"
        out.mkdir()
        result = launch(
            "accelerate_resume_worker.py", processes, str(out), framework, mode, str(root / "ckpt"), "0", "1", "12"
        )
        found[f"{framework}-{mode}"] = [
            (
                torch.load(out / f"{framework}-{mode}-rank{rank}.pt", weights_only=True),
                json.loads((out / f"rank{rank}.json").read_text()),
                result.stderr,
            )
            for rank in range(processes)
        ]
    found["folder"] = [root / "ckpt"]
    return found


@needs_accelerate
def test_accelerate_resumes_x_folder_as_x_does(went_back) -> None:
    folder = went_back["folder"][0]
    assert (folder / MANIFEST).is_file() and not written_by_accelerate(folder)
    ranks = len(went_back["x-save"])
    assert sorted(p.name for p in folder.glob("random_states_*.pkl")) == [
        f"random_states_{r}.pkl" for r in range(ranks)
    ]
    for rank in range(ranks):
        acc_weights, acc_report, acc_err = went_back["accelerate-resume"][rank]
        x_weights, x_report, _ = went_back["x-resume"][rank]
        full_weights, full_report, _ = went_back["x-save"][rank]
        assert "Could not load random states" not in acc_err
        # Equal to x's own resume and to the uninterrupted run, to the bit (0.0 apart).
        _assert_same_weights(acc_weights, x_weights, f"rank {rank}: Accelerate's resume vs x's")
        _assert_same_weights(acc_weights, full_weights, f"rank {rank}: Accelerate's resume vs uninterrupted")
        # Steps, the registered counter (custom_checkpoint_0.pkl), the lr, and every generator's next draw.
        assert acc_report == x_report == full_report


# --- Accelerate's layout written by hand: refusals and naming ------------------------------------


class Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight


def _prepared(project: Path | None = None) -> tuple[Accelerator, torch.nn.Module, torch.optim.Optimizer]:
    config = ProjectConfiguration(project_dir=str(project), automatic_checkpoint_naming=True) if project else None
    accelerator = Accelerator(cpu=True, project_config=config)
    torch.manual_seed(0)
    model = Tied()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    return accelerator, model, optimizer


def _accelerate_folder(folder: Path, model: torch.nn.Module, optimizer, *, weights: str = "model.safetensors") -> Path:
    """What Accelerate's save_state writes for one model and optimizer, one process."""
    folder.mkdir()
    state = {f"module.{k}": v.clone() for k, v in model.state_dict().items() if k != "head.weight"}  # tie once
    if weights == "model.safetensors":
        save_file(state, str(folder / weights), metadata={"format": "pt"})
    elif weights:
        torch.save(state, folder / weights)
    torch.save(optimizer.state_dict(), folder / "optimizer.bin")
    torch.save({"step": 5, "torch_manual_seed": torch.get_rng_state()}, folder / "random_states_0.pkl")
    return folder


@pytest.mark.parametrize("weights", ["model.safetensors", "pytorch_model.bin"])
def test_loads_prefixed_names_and_dropped_ties(tmp_path, weights) -> None:
    accelerator, model, optimizer = _prepared()
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    folder = _accelerate_folder(tmp_path / "ckpt", model, optimizer, weights=weights)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    assert written_by_accelerate(folder)
    assert accelerator.load_state(folder) == str(folder)
    _assert_same_weights(model.state_dict(), saved, "loaded weights")
    assert model.head.weight is model.embed.weight  # the tie survives
    assert accelerator.step == 5  # Accelerate records the step in random_states_<rank>.pkl


class _RunsShell:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")  # pickle.dump's protocol, not torch.save's
@pytest.mark.parametrize("writer", ["torch.save", "pickle protocol 2", "pickle default protocol"])
def test_tampered_random_states_refused_without_running(tmp_path, writer) -> None:
    accelerator, model, optimizer = _prepared()
    folder = _accelerate_folder(tmp_path / "ckpt", model, optimizer)
    marker = tmp_path / "ran"
    payload = {"step": 1, "random_state": _RunsShell(marker)}
    if writer == "torch.save":
        torch.save(payload, folder / "random_states_0.pkl")
    else:
        protocol = 2 if writer == "pickle protocol 2" else pickle.DEFAULT_PROTOCOL
        (folder / "random_states_0.pkl").write_bytes(pickle.dumps(payload, protocol=protocol))
    with pytest.raises(
        pickle.UnpicklingError, match=r"^refused \S*random_states_0\.pkl: .*nothing in it was run"
    ) as caught:
        accelerator.load_state(folder)
    assert not marker.exists()
    assert "\n" not in str(caught.value)  # one line
    if writer != "pickle default protocol":  # protocol 4+ is refused at its first opcode, before the call
        assert re.search(r"a call to (posix|nt)\.system", str(caught.value))


def test_missing_weights_file_is_named(tmp_path) -> None:
    accelerator, model, optimizer = _prepared()
    folder = _accelerate_folder(tmp_path / "ckpt", model, optimizer, weights="")
    with pytest.raises(FileNotFoundError, match=r"no weights for model 0: neither model\.safetensors nor pytorch"):
        accelerator.load_state(folder)


def test_more_models_saved_than_prepared_is_refused(tmp_path) -> None:
    accelerator, model, optimizer = _prepared()
    folder = _accelerate_folder(tmp_path / "ckpt", model, optimizer)
    (folder / "model_1.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    with pytest.raises(ValueError, match="holds 2 models but 1 are prepared"):
        accelerator.load_state(folder)


def test_interrupted_x_save_is_still_called_incomplete(tmp_path) -> None:
    accelerator, _model, _optimizer = _prepared()
    folder = Path(accelerator.save_state(tmp_path / "x"))
    assert not written_by_accelerate(folder)
    (folder / MANIFEST).unlink()  # x's own files are there: an x save, not Accelerate's
    assert not written_by_accelerate(folder)
    with pytest.raises(FileNotFoundError, match=r"not a complete checkpoint \(no x_checkpoint\.json\); was its save"):
        accelerator.load_state(folder)


def test_automatic_naming_resumes_accelerate_checkpoint_n(tmp_path) -> None:
    """Accelerate names its automatic checkpoints as x does: load_state() finds the latest."""
    accelerator, model, optimizer = _prepared(tmp_path)
    (tmp_path / "checkpoints").mkdir()
    _accelerate_folder(tmp_path / "checkpoints" / "checkpoint_0", model, optimizer)
    _accelerate_folder(tmp_path / "checkpoints" / "checkpoint_1", model, optimizer)
    assert accelerator.load_state() == str(tmp_path / "checkpoints" / "checkpoint_1")
    assert accelerator.project_configuration.iteration == 2  # the next save_state writes checkpoint_2


def test_a_resumed_accelerate_folder_is_saved_into_in_place(tmp_path) -> None:
    """Accelerate's save_state overwrites its folder: resume from it, train, save there; x replaces it whole."""
    accelerator, model, optimizer = _prepared()
    folder = _accelerate_folder(tmp_path / "ckpt", model, optimizer)
    (folder / "sampler.bin").write_bytes(b"")  # its other files (here one x does not read) go too
    accelerator.load_state(folder)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5)
    trained = {k: v.clone() for k, v in model.state_dict().items()}
    assert accelerator.save_state(folder) == str(folder)
    assert (folder / MANIFEST).is_file() and not written_by_accelerate(folder)
    assert not (folder / "sampler.bin").exists()  # nothing of Accelerate's save is left to be misread
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no staging or old copy beside it
    fresh, model2, _ = _prepared()
    fresh.load_state(folder)
    _assert_same_weights(model2.state_dict(), trained, "the weights saved in place")


def test_an_accelerate_folder_with_other_files_is_not_replaced(tmp_path) -> None:
    accelerator, model, optimizer = _prepared()
    folder = _accelerate_folder(tmp_path / "ckpt", model, optimizer)
    (folder / "notes.txt").write_text("lr 0.01 was too high")
    before = sorted(p.name for p in folder.iterdir())
    with pytest.raises(ValueError) as caught:
        accelerator.save_state(folder)
    assert str(caught.value) == (
        f"cannot save a checkpoint to {folder}: it holds Accelerate's checkpoint and files it did not write "
        "(notes.txt), which replacing the folder would delete; move them, or save to another folder"
    )
    assert sorted(p.name for p in folder.iterdir()) == before
    assert (folder / "notes.txt").read_text() == "lr 0.01 was too high"


def test_a_folder_that_is_no_checkpoint_is_never_replaced(tmp_path) -> None:
    accelerator, _model, _optimizer = _prepared()
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "model.pt").write_bytes(b"the user's own")
    with pytest.raises(ValueError) as caught:
        accelerator.save_state(folder)
    assert str(caught.value) == (
        f"cannot save a checkpoint to {folder}: the folder holds files and is not a checkpoint "
        f"(no {MANIFEST}); choose another folder, or empty it"
    )
    assert [p.name for p in folder.iterdir()] == ["model.pt"] and (
        folder / "model.pt"
    ).read_bytes() == b"the user's own"
