"""get_logger logs once per job by default, everywhere on request, and warning_once once per adapter."""

from __future__ import annotations

import logging

import pytest

from x_common import env
from x_runtime.process.operations.logging import MultiProcessAdapter, get_logger


@pytest.fixture
def single_process(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in env.FOREIGN:
        monkeypatch.delenv(var.name, raising=False)


@pytest.fixture
def rank(monkeypatch: pytest.MonkeyPatch, single_process: None):
    """Pretend to be a given rank of a two-process torchrun job."""

    def become(index: int) -> None:
        monkeypatch.setenv(env.RANK.name, str(index))
        monkeypatch.setenv(env.LOCAL_RANK.name, str(index))
        monkeypatch.setenv(env.WORLD_SIZE.name, "2")

    return become


def _messages(caplog: pytest.LogCaptureFixture, name: str) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == name]


def test_single_process_logs_without_prefix(caplog: pytest.LogCaptureFixture, single_process: None) -> None:
    logger = get_logger("xr.single")
    assert isinstance(logger, MultiProcessAdapter)
    with caplog.at_level(logging.INFO, logger="xr.single"):
        logger.info("hello %s", "world")
    assert _messages(caplog, "xr.single") == ["hello world"]


def test_main_process_logs_by_default(caplog: pytest.LogCaptureFixture, rank) -> None:
    rank(0)
    logger = get_logger("xr.main")
    with caplog.at_level(logging.INFO, logger="xr.main"):
        logger.info("step %d", 3)
    assert _messages(caplog, "xr.main") == ["[RANK 0] step 3"]


def test_other_ranks_stay_quiet_by_default(caplog: pytest.LogCaptureFixture, rank) -> None:
    rank(1)
    logger = get_logger("xr.other")
    with caplog.at_level(logging.INFO, logger="xr.other"):
        logger.info("only on rank 0")
        logger.warning("also only on rank 0")
        logger.info("everywhere", main_process_only=False)
    assert _messages(caplog, "xr.other") == ["[RANK 1] everywhere"]


def test_rank_is_read_when_logging_not_when_created(caplog: pytest.LogCaptureFixture, rank) -> None:
    logger = get_logger("xr.late")
    rank(1)
    with caplog.at_level(logging.INFO, logger="xr.late"):
        logger.info("skipped")
    rank(0)
    with caplog.at_level(logging.INFO, logger="xr.late"):
        logger.info("logged")
    assert _messages(caplog, "xr.late") == ["[RANK 0] logged"]


def test_in_order_without_process_group_logs_this_rank(caplog: pytest.LogCaptureFixture, rank) -> None:
    rank(1)
    logger = get_logger("xr.order")
    with caplog.at_level(logging.INFO, logger="xr.order"):
        logger.info("mine", in_order=True)
    assert _messages(caplog, "xr.order") == ["[RANK 1] mine"]


def test_warning_once_per_adapter(caplog: pytest.LogCaptureFixture, single_process: None) -> None:
    first, second = get_logger("xr.once"), get_logger("xr.once")
    with caplog.at_level(logging.WARNING, logger="xr.once"):
        for _ in range(3):
            first.warning_once("deprecated %s", "foo")
        first.warning_once("deprecated %s", "bar")
        second.warning_once("deprecated %s", "foo")
    assert _messages(caplog, "xr.once") == ["deprecated foo", "deprecated bar", "deprecated foo"]


def test_log_level_sets_only_the_named_logger(caplog: pytest.LogCaptureFixture, single_process: None) -> None:
    root_level = logging.getLogger().level
    named = logging.getLogger("xr.level")
    previous = named.level
    try:
        logger = get_logger("xr.level", log_level="debug")
        assert named.level == logging.DEBUG
        assert logging.getLogger().level == root_level
        with caplog.at_level(logging.DEBUG):
            logger.debug("details")
        assert _messages(caplog, "xr.level") == ["details"]
        get_logger("xr.level", log_level=logging.ERROR)
        assert named.level == logging.ERROR
    finally:
        named.setLevel(previous)


def test_disabled_level_is_not_logged(caplog: pytest.LogCaptureFixture, single_process: None) -> None:
    logger = get_logger("xr.disabled")
    with caplog.at_level(logging.WARNING, logger="xr.disabled"):
        logger.info("too detailed")
        logger.info("too detailed", in_order=True)
    assert _messages(caplog, "xr.disabled") == []


def test_records_point_at_the_caller(caplog: pytest.LogCaptureFixture, single_process: None) -> None:
    logger = get_logger("xr.caller")
    with caplog.at_level(logging.INFO, logger="xr.caller"):
        logger.info("direct")
        logger.info("ordered", in_order=True)
        logger.log(logging.INFO, "via log")
        logger.warning_once("once")
    records = [r for r in caplog.records if r.name == "xr.caller"]
    assert [r.funcName for r in records] == ["test_records_point_at_the_caller"] * 4
    assert {r.filename for r in records} == {"test_logging.py"}


def test_exception_keeps_traceback(caplog: pytest.LogCaptureFixture, single_process: None) -> None:
    logger = get_logger("xr.exc")
    with caplog.at_level(logging.ERROR, logger="xr.exc"):
        try:
            raise ValueError("boom")
        except ValueError:
            logger.exception("failed")
    (record,) = [r for r in caplog.records if r.name == "xr.exc"]
    assert record.exc_info is not None and record.exc_info[0] is ValueError


def test_two_real_ranks(inline_worker, workers, tmp_path) -> None:
    # Both ranks append to one file, so its line order is the order in which they logged.
    log = tmp_path / "log.txt"
    script = inline_worker(
        """
        import logging, sys
        import torch.distributed as dist
        from _helpers import report
        from x_runtime.process.operations.logging import get_logger

        dist.init_process_group("gloo")
        logger = get_logger("xr.workers", log_level="INFO")
        handler = logging.FileHandler(sys.argv[2], mode="a")
        logger.logger.addHandler(handler)
        logger.info("main only")
        dist.barrier()
        logger.info("everyone", main_process_only=False)
        dist.barrier()
        for turn in range(3):
            logger.info("turn %d", turn, in_order=True)
        handler.close()
        report({"rank": dist.get_rank()})
        dist.destroy_process_group()
        """
    )
    assert [r["rank"] for r in workers(script, 2, str(log))] == [0, 1]
    lines = log.read_text().splitlines()
    assert lines[0] == "[RANK 0] main only"
    assert sorted(lines[1:3]) == ["[RANK 0] everyone", "[RANK 1] everyone"]
    assert lines[3:] == [f"[RANK {r}] turn {i}" for i in range(3) for r in (0, 1)]
