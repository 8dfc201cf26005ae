"""Every distribution is a well-formed, separately versioned package that declares what it imports."""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.resources
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("x-common", "x-launch", "x-runtime", "x-bigmodel", "x-estimate")
SCRIPTS = {"x-launch": "x_launch.cli:main", "x-estimate": "x_estimate.cli:main"}
REPOSITORY = "https://github.com/x-project/x"
URL_LABELS = ("Homepage", "Documentation", "Source", "Issues", "Changelog")


def module_of(dist: str) -> str:
    return dist.replace("-", "_")


def third_party_imports(src: Path) -> set[str]:
    """Top-level modules imported anywhere under ``src``, stdlib and x's own left out."""
    found: set[str] = set()
    for path in src.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return {m for m in found if m not in sys.stdlib_module_names and not m.startswith("x_") and m != "__future__"}


@pytest.mark.parametrize("dist", PACKAGES)
def test_installed_version_is_the_package_version_and_in_its_changelog(dist: str) -> None:
    module = __import__(module_of(dist))
    version = importlib.metadata.version(dist)
    assert module.__version__ == version
    changelog = (ROOT / "packages" / dist / "CHANGELOG.md").read_text()
    assert re.search(rf"^## {re.escape(version)}\b", changelog, re.M), f"{dist} {version} missing from its CHANGELOG"


@pytest.mark.parametrize("dist", PACKAGES)
def test_layout_readme_and_typed_marker(dist: str) -> None:
    pkg = ROOT / "packages" / dist
    assert (pkg / "src" / module_of(dist) / "__init__.py").is_file()
    assert importlib.resources.files(module_of(dist)).joinpath("py.typed").is_file()
    readme = (pkg / "README.md").read_text()
    assert f"pip install {dist}" in readme, f"{dist}'s README must say how to install just it"


@pytest.mark.parametrize("dist", [d for d in PACKAGES if d != "x-common"])
def test_depends_on_x_common_by_a_range_that_admits_the_current_x_common(dist: str) -> None:
    requirements = [Requirement(r) for r in importlib.metadata.requires(dist) or []]
    common = [r for r in requirements if r.name == "x-common"]
    assert len(common) == 1 and not common[0].marker
    spec = common[0].specifier
    assert any(s.operator == "<" for s in spec), f"{dist} needs an upper bound on x-common: {spec}"
    assert Version(importlib.metadata.version("x-common")) in spec


@pytest.mark.parametrize("dist", PACKAGES)
def test_every_third_party_import_is_a_declared_dependency(dist: str) -> None:
    declared = {Requirement(r).name.lower().replace("_", "-") for r in importlib.metadata.requires(dist) or []}
    providers = importlib.metadata.packages_distributions()
    missing = {}
    for module in third_party_imports(ROOT / "packages" / dist / "src"):
        dists = {d.lower().replace("_", "-") for d in providers.get(module, [module])}
        if not dists & declared:
            missing[module] = sorted(dists)
    assert not missing, f"{dist} imports modules from undeclared distributions: {missing}"


@pytest.mark.parametrize(("dist", "target"), sorted(SCRIPTS.items()))
def test_console_scripts(dist: str, target: str) -> None:
    scripts = {
        ep.name: ep.value for ep in importlib.metadata.entry_points(group="console_scripts") if ep.dist.name == dist
    }
    assert scripts == {dist: target}


def test_the_license_is_apache_2_0_in_full_and_every_package_ships_the_same_text() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License\n                           Version 2.0, January 2004")
    assert "END OF TERMS AND CONDITIONS" in text and "APPENDIX: How to apply the Apache License" in text
    for dist in PACKAGES:
        assert (ROOT / "packages" / dist / "LICENSE").read_text() == text, (
            f"packages/{dist}/LICENSE differs from LICENSE"
        )


@pytest.mark.parametrize("dist", PACKAGES)
def test_metadata_names_the_license_file_and_the_project_urls(dist: str) -> None:
    metadata = importlib.metadata.metadata(dist)
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata.get_all("License-File") == ["LICENSE"]
    urls = dict(entry.split(", ", 1) for entry in metadata.get_all("Project-URL") or [])
    assert sorted(urls) == sorted(URL_LABELS), urls
    assert urls["Homepage"] == REPOSITORY and urls["Issues"] == f"{REPOSITORY}/issues"
    for label in ("Documentation", "Source", "Changelog"):
        assert (ROOT / repository_path(urls[label])).exists(), f"{dist}'s {label} URL names no file here: {urls[label]}"
    assert dist in urls["Documentation"] and urls["Source"].endswith(f"/packages/{dist}")


def repository_path(url: str) -> str:
    """The file or folder a repository URL points at, e.g. ``docs/cli.md`` for .../blob/main/docs/cli.md#x."""
    match = re.fullmatch(rf"{re.escape(REPOSITORY)}/(?:blob|tree)/main/([^#?]+)(?:#.*)?", url)
    assert match, f"not a link into {REPOSITORY}/blob/main or /tree/main: {url}"
    return match.group(1)


@pytest.mark.parametrize("dist", PACKAGES)
def test_readme_links_work_where_the_readme_is_shown_alone(dist: str) -> None:
    """A package README is shown on its own (an index page, a wheel's metadata): no relative links."""
    readme = (ROOT / "packages" / dist / "README.md").read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", readme)
    assert links, f"{dist}'s README links nowhere (ARCHITECTURE.md at least)"
    for link in links:
        assert link.startswith("https://"), f"{dist}'s README has a relative link: {link}"
        if link.startswith(REPOSITORY):
            assert (ROOT / repository_path(link)).exists(), f"{dist}'s README links to a missing file: {link}"


@pytest.mark.parametrize("dist", [d for d in PACKAGES if d != "x-common"])
def test_readme_shows_the_install_from_a_clone(dist: str) -> None:
    readme = (ROOT / "packages" / dist / "README.md").read_text()
    assert f"pip install ./packages/x-common ./packages/{dist}" in readme
    assert f"pip install --find-links dist {dist}" in readme


@pytest.mark.parametrize("dist", PACKAGES)
def test_a_package_that_imports_torch_declares_numpy(dist: str) -> None:
    """torch without numpy warns on every import, and its object collectives fail."""
    requirements = [Requirement(r) for r in importlib.metadata.requires(dist) or []]
    for extra in [None, *(importlib.metadata.metadata(dist).get_all("Provides-Extra") or [])]:
        env = {"extra": extra or ""}
        names = {r.name.lower() for r in requirements if r.marker is None or (extra and r.marker.evaluate(env))}
        if "torch" in names:
            assert "numpy" in names, f"{dist}{f'[{extra}]' if extra else ''} requires torch but not numpy"


def test_x_bigmodel_requires_tqdm_and_keeps_its_progress_extra() -> None:
    requirements = [Requirement(r) for r in importlib.metadata.requires("x-bigmodel") or []]
    assert "tqdm" in {r.name for r in requirements if r.marker is None}
    assert "progress" in (importlib.metadata.metadata("x-bigmodel").get_all("Provides-Extra") or [])


@pytest.mark.parametrize(
    "args",
    [["--version"], ["--no-such-option"], ["definitely-missing-model-folder"]],
    ids=["version", "bad-flag", "bad-model"],
)
@pytest.mark.parametrize("dist", sorted(SCRIPTS))
def test_python_m_runs_the_console_script(dist: str, args: list[str], tmp_path: Path) -> None:
    if dist == "x-launch" and args[0].startswith("definitely"):
        args = ["definitely-missing-script.py"]
    scripts = Path(sys.executable).parent  # where pip put the console scripts beside this interpreter
    script = shutil.which(dist, path=str(scripts))
    assert script, f"no {dist} script beside {sys.executable}"
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    env["PATH"] = f"{scripts}{os.pathsep}{env.get('PATH', '')}"
    by_script = subprocess.run([script, *args], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    by_module = subprocess.run(
        [sys.executable, "-m", module_of(dist), *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    assert (by_module.returncode, by_module.stdout, by_module.stderr) == (
        by_script.returncode,
        by_script.stdout,
        by_script.stderr,
    )
    assert (by_script.returncode == 0) == (args == ["--version"])
    assert "Traceback" not in by_script.stderr
