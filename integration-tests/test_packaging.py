"""Every distribution is a well-formed, separately versioned package that declares what it imports."""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.resources
import re
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("x-common", "x-launch", "x-runtime", "x-bigmodel", "x-estimate")
SCRIPTS = {"x-launch": "x_launch.cli:main", "x-estimate": "x_estimate.cli:main"}


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
