"""Options of the scenario suite: where each side's results are kept, and which sides run here."""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--results",
        default=None,
        help="folder keeping each run's result.json; a later run with --sides x compares with the accelerate ones there",
    )
    parser.addoption(
        "--sides",
        default="accelerate,x",
        help="accelerate,x: run both here; x: run x only, against the accelerate results in --results",
    )


@pytest.fixture(scope="session")
def results(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = request.config.getoption("--results")
    return Path(given) if given else tmp_path_factory.mktemp("results")


@pytest.fixture(scope="session")
def sides(request: pytest.FixtureRequest) -> tuple[str, ...]:
    chosen = tuple(s.strip() for s in str(request.config.getoption("--sides")).split(",") if s.strip())
    assert set(chosen) <= {"accelerate", "x"} and "x" in chosen, f"--sides {chosen}: expected accelerate,x or x"
    return chosen
