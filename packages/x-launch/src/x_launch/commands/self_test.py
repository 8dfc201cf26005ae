"""``x-launch test``: run the self-check under the configured launch and report each check.

The self-check (``x_launch.commands.selfcheck``) starts exactly as a training script would, through the same
launch plan, so it tests what a real launch will meet: the config, the engine, the rendezvous,
the devices and, when installed, x-runtime. Ranks write reports to files; this side prints them.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from x_launch.commands import selfcheck
from x_launch.engines.base import LaunchPlan

__all__ = ["SelfCheckOutcome", "read_reports", "run_self_check"]


class SelfCheckOutcome:
    """What the ranks reported: one line per check, and the first failure if any."""

    def __init__(self, world: int, reports: list[dict[str, Any]]):
        self.world = world
        self.reports = reports

    def lines(self) -> list[str]:
        if not self.reports:
            return []
        names = [result["name"] for result in self.reports[0]["results"]]
        for report in self.reports[1:]:
            names += [r["name"] for r in report["results"] if r["name"] not in names]
        lines = []
        for name in names:
            failed = [r for report in self.reports for r in report["results"] if r["name"] == name and not r["ok"]]
            if failed:
                lines.append(f"FAIL {name}: {failed[0]['detail']}")
                break
            passed = next(r for r in self.reports[0]["results"] if r["name"] == name)
            lines.append(f"ok   {name}: {passed['detail']}")
        return lines

    def missing_ranks(self) -> list[int]:
        seen = {report["rank"] for report in self.reports}
        return [rank for rank in range(self.world) if rank not in seen]

    def failed_check(self) -> str | None:
        for line in self.lines():
            if line.startswith("FAIL "):
                return line[5:].split(":", 1)[0]
        return None


def read_reports(folder: Path) -> list[dict[str, Any]]:
    reports = [json.loads(path.read_text()) for path in folder.glob("rank*.json")]
    return sorted(reports, key=lambda report: report["rank"])


def self_check_target(report_dir: Path) -> list[str]:
    """The module and argument the launch plan runs (``python -m``: no script folder on sys.path)."""
    return [selfcheck.__name__, str(report_dir)]


def run_self_check(plan_for: Any, world: int, echo: Any) -> int:
    """Launch the self-check with ``plan_for(target) -> LaunchPlan`` (a module target); print results.

    Returns:
        The exit code: 0 when every check passed on every rank.
    """
    from x_launch.run.process import run_plan

    with tempfile.TemporaryDirectory(prefix="x-launch-test-") as scratch:
        folder = Path(scratch)
        plan: LaunchPlan = plan_for(self_check_target(folder))
        echo(f"x-launch test: {world} process(es) via {plan.engine}")
        code = run_plan(plan)
        outcome = SelfCheckOutcome(world, read_reports(folder))
    for line in outcome.lines():
        echo(line)
    failed = outcome.failed_check()
    if failed is not None:
        echo(f"x-launch test: FAILED at {failed}")
        return 1
    missing = outcome.missing_ranks()
    if code != 0 or missing:
        where = f"ranks {missing} did not report" if missing else "every rank reported"
        echo(f"x-launch test: FAILED at launch: the engine exited {code} ({where}); see its output above")
        return 1
    echo(f"x-launch test: all {len(outcome.lines())} checks passed on {world} process(es)")
    return 0
