"""The collective half of a save: which rank assembles each folder, and every rank's agreement.

``save_checkpoint`` (synchronous) and ``background`` (``async_save=True``) both open a save here:
the ranks claim and prepare the hidden folders and check the free space, each step followed by
one ``gather_object`` so that a failure on any rank raises on every rank. The background writer
issues no collective at all (it would race training's own on the same process group), so these
steps run in the calling thread.
"""

from __future__ import annotations

import shutil
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from x_runtime.checkpoint.accelerate_layout import foreign_files, written_by_accelerate
from x_runtime.checkpoint.parts import MANIFEST, CheckpointParts
from x_runtime.core.one_line_errors import FailedElsewhereError, JobError, OneLineError
from x_runtime.io.atomic import partial_dir_for
from x_runtime.io.disk_space import (
    DiskFullError,
    disk_full_while_saving,
    measure_room,
    out_of_space_errno,
    refuse_if_short,
    tensor_bytes,
)
from x_runtime.process.collectives import gather_object

if TYPE_CHECKING:
    from x_runtime.process.topology.state import ProcessState

__all__ = ["TOKEN", "Staging", "agree", "open_staging"]


@dataclass
class Staging:
    """A save under way: the hidden folder being assembled, and whether this rank assembles it."""

    target: Path
    partial: Path
    state: ProcessState
    owner: bool = False
    needed: int = 0  # bytes headed for this rank's filesystem (named by a full disk's error)

    def disk_full(self, error: Exception) -> Exception:
        """``error``, or the ``DiskFullError`` naming the folder and amounts when the disk is full."""
        if out_of_space_errno(error, self.partial) is None:
            return error
        return disk_full_while_saving(error, target=self.target, partial=self.partial, needed=self.needed)

    def agree(self, step: Callable[[], Any]) -> list[Any]:
        """``_agree`` on ``step``, a full disk reported as ``DiskFullError``."""

        def run() -> Any:
            try:
                return step()
            except Exception as error:
                mapped = self.disk_full(error)
                if mapped is error:
                    raise
                raise mapped from None  # one line for the user; the writer's error stays as __context__

        return agree(self.state, "save_state", run)

    def discard(self) -> None:
        if self.owner:
            shutil.rmtree(self.partial, ignore_errors=True)


def open_staging(target: Path, parts: CheckpointParts, state: ProcessState) -> Staging:
    """The collective half of a save: claim and prepare the folders, refuse one that cannot fit."""
    staging = Staging(Path(target), partial_dir_for(Path(target)), state)

    def claim(claimed: bool) -> None:
        staging.owner = claimed

    try:
        _claim(staging.target, staging.partial, state, staging.agree, claim)
        mine = (lambda: tensor_bytes(parts.models, parts.optimizers)) if staging.owner else (lambda: 0)
        rooms = staging.agree(lambda: measure_room(state.rank, staging.target, staging.partial, mine()))
        refuse_if_short(rooms, state.rank)  # the same rooms everywhere: every rank decides alike
        staging.needed = sum(r.needed for r in rooms if r.filesystem == rooms[state.rank].filesystem)
    except Exception:
        staging.discard()
        raise
    return staging


def _claim(
    target: Path,
    partial: Path,
    state: ProcessState,
    agree: Callable[[Callable[[], Any]], list[Any]],
    claim: Callable[[bool], None],
) -> None:
    """Decide which rank assembles each folder (``claim(True)`` there) and prepare it."""
    token = uuid.uuid4().hex
    # Round 1: the main process prepares its folder; everyone learns rank 0's token.
    claim(state.is_main_process)
    tokens = agree(lambda: _prepare(target, partial, token) if state.is_main_process else None)
    token = tokens[0]
    if not state.is_main_process:  # a folder rank 0 did not prepare is this rank's own (or its node's)
        seen = _token_in(partial)
        claims = agree(lambda: None if seen == token else f"{socket.gethostname()}:{target.resolve()}")
        mine = claims[state.rank]
        owner = mine is not None and claims.index(mine) == state.rank
        claim(owner)
        agree(lambda: _prepare(target, partial, token) if owner else None)
    elif state.world_size > 1:
        agree(lambda: None)
        agree(lambda: None)


TOKEN = ".x_save_token"  # rank 0's folder, told apart from a rank's own


def _prepare(target: Path, partial: Path, token: str) -> str:
    _check_replaceable(target)
    if partial.exists():
        shutil.rmtree(partial)  # left by a save that crashed; never a complete checkpoint
    partial.mkdir(parents=True)
    (partial / TOKEN).write_text(token)
    return token


def _token_in(partial: Path) -> str | None:
    try:
        return (partial / TOKEN).read_text()
    except OSError:
        return None


def agree(state: ProcessState, op: str, step: Callable[[], Any]) -> list[Any]:
    """Run ``step`` here, then learn every rank's outcome (one ``gather_object``, also a barrier).

    Returns every rank's result; raises on every rank when ``step`` raised on any, naming the
    ranks and their errors (this rank's own exception is chained): ``DiskFullError`` when every
    failure was a full disk, else ``RuntimeError``.
    """
    failure: BaseException | None = None
    try:
        outcome: Any = ("ok", step(), (False, False))
    except Exception as error:  # reported to every rank below
        failure = error
        outcome = ("error", f"{type(error).__name__}: {error}", (isinstance(error, DiskFullError), _one_line(error)))
    outcomes = gather_object([outcome]) if state.world_size > 1 else [outcome]
    failed = [(r, text, full) for r, (kind, text, (full, _)) in enumerate(outcomes) if kind == "error"]
    if failed:
        if state.world_size == 1 and failure is not None:
            raise failure
        if len(failed) == 1:
            message = f"{op} failed on rank {failed[0][0]}: {failed[0][1]}"
        elif len({text for _r, text, _full in failed}) == 1:  # the same error everywhere: said once
            message = f"{op} failed on ranks {', '.join(str(r) for r, _text, _full in failed)}: {failed[0][1]}"
        else:
            details = "; ".join(f"rank {r}: {text}" for r, text, _full in failed)
            message = f"{op} failed on ranks {', '.join(str(r) for r, _text, _full in failed)}: {details}"
        if all(full for _r, _text, full in failed):  # still an OSError(ENOSPC) on every rank
            raise DiskFullError(message, **_amounts_of(failure)) from failure
        if all(one_line for kind, _text, (_full, one_line) in outcomes if kind == "error"):
            raise JobError(message) from failure  # each rank's message says it all: printed once per job
        if failure is None:  # the failing ranks print their tracebacks; here, one line for the job
            raise FailedElsewhereError(message)
        raise RuntimeError(message) from failure
    return [value for _kind, value, _flags in outcomes]


def _one_line(error: BaseException) -> bool:
    # An agreed error already names every rank's failure: it is not a failure of its own.
    return isinstance(error, OneLineError) and not isinstance(error, JobError)


def _amounts_of(failure: BaseException | None) -> dict[str, Any]:
    if isinstance(failure, DiskFullError):
        return {"path": failure.path, "needed": failure.needed, "free": failure.free, "code": failure.errno}
    return {}


def _check_replaceable(target: Path) -> None:
    # A save replaces only a checkpoint (x's or Accelerate's) or an empty folder: never a user's file or folder.
    if target.exists() and not target.is_dir():
        raise ValueError(f"cannot save a checkpoint to {target}: it is a file; save_state writes a folder")
    if written_by_accelerate(target):
        others = foreign_files(target)
        if others:
            raise ValueError(
                f"cannot save a checkpoint to {target}: it holds Accelerate's checkpoint and files it did not write "
                f"({', '.join(others[:3])}{', ...' if len(others) > 3 else ''}), which replacing the folder would "
                "delete; move them, or save to another folder"
            )
        return  # replaced whole once the new one is complete, as x's own checkpoints are
    if target.is_dir() and not (target / MANIFEST).is_file() and any(target.iterdir()):
        raise ValueError(
            f"cannot save a checkpoint to {target}: the folder holds files and is not a checkpoint "
            f"(no {MANIFEST}); choose another folder, or empty it"
        )
