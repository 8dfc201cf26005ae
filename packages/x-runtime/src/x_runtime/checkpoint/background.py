"""``save_state(async_save=True)``: the checkpoint written by one background thread per process.

``start_save`` runs in the calling thread everything that needs the other ranks (claiming and
preparing the hidden folders, the free-space check, the save hooks) and copies the state
(``snapshot``); that is the whole training stall. A thread then writes the copy with the same
code as a synchronous save, into the same hidden folder, and the rank that assembles the folder
renames it into place: a kill at any moment leaves the previous checkpoint loadable.

The thread issues no collective: one on the default process group, concurrent with training's
own, would interleave with them (gloo and NCCL match collectives by order). So the ranks that
write into one folder tell its assembler that they are done through marker files in the hidden
folder, and the ranks learn each other's outcome at the next synchronising call (``wait_save``:
the next ``save_state``, ``load_state``, ``wait_for_checkpoint`` or ``end_training``), in its
calling thread, where a failure on any rank raises on every rank, as a synchronous save would.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from x_runtime.checkpoint.checkpointing import finish_folder, write_files
from x_runtime.checkpoint.parts import CheckpointParts
from x_runtime.checkpoint.snapshot import HostBuffers, snapshot_parts
from x_runtime.checkpoint.staging import Staging, agree, open_staging
from x_runtime.process.collectives import gather_object

if TYPE_CHECKING:
    from x_runtime.process.topology.state import ProcessState

__all__ = ["PendingSave", "start_save", "wait_save"]

_GROUP = ".x_folder_id"  # which ranks write into this folder (ranks may have folders of their own)
_POLL_S = 0.02


def _written(rank: int) -> str:
    return f".x_written_{rank}"


def _failed(rank: int) -> str:
    return f".x_failed_{rank}"


class PendingSave:
    """One process's background write; ``wait_save`` joins it."""

    def __init__(
        self,
        staging: Staging,
        parts: CheckpointParts,
        buffers: HostBuffers,
        others: list[int],
        safe: bool,
        after: Callable[[], Any] | None,
    ) -> None:
        self.staging = staging
        self.target = staging.target
        self.error: BaseException | None = None
        self._parts = parts
        self._buffers = buffers
        self.others = others  # the other ranks writing into the folder this rank assembles
        self._safe = safe
        self._after = after
        self.abort = threading.Event()
        # Not a daemon: a script that ends without end_training still gets its checkpoint.
        self.thread = threading.Thread(target=self._run, name=f"x-save-{staging.target.name}", daemon=False)

    def _run(self) -> None:
        staging, partial = self.staging, self.staging.partial
        try:
            layouts: dict[str, Any] = {}
            write_files(partial, self._parts, staging.state, staging.owner, layouts, self._safe)
            if not staging.owner:
                (partial / _written(staging.state.rank)).touch()
                return
            self._wait_for_others()
            for name in [_GROUP, *(_written(rank) for rank in self.others)]:
                (partial / name).unlink(missing_ok=True)
            finish_folder(staging.target, partial, self._parts, staging.state, True, layouts)
            if self._after is not None:  # pruning: only once the new checkpoint is complete
                self._after()
        except BaseException as error:  # kept for wait_save, which raises it on every rank
            self.error = staging.disk_full(error) if isinstance(error, Exception) else error
            if staging.owner:
                # The others may still be writing into the folder: removing it under them would turn
                # their write into a FileNotFoundError that hides this rank's real error.
                self._wait_for_others_to_stop()
                shutil.rmtree(partial, ignore_errors=True)
            else:
                _touch_quietly(partial / _failed(staging.state.rank))
        finally:
            self._parts = CheckpointParts(strategy=self._parts.strategy)  # drop the views of the copy
            self._buffers.give_back()

    def _wait_for_others(self) -> None:
        partial, waiting = self.staging.partial, set(self.others)
        while waiting:
            for rank in sorted(waiting):
                if (partial / _failed(rank)).exists():
                    raise RuntimeError(f"rank {rank} could not write its files into {partial}")
                if (partial / _written(rank)).exists():
                    waiting.discard(rank)
            if waiting and self.abort.wait(_POLL_S):  # wait_save learnt that one of them failed
                raise RuntimeError(f"ranks {sorted(waiting)} could not write their files into {partial}")

    def _wait_for_others_to_stop(self) -> None:
        """Until each other rank of the folder has written its files or given up (or wait_save aborts)."""
        partial, waiting = self.staging.partial, set(self.others)
        while waiting:
            waiting = {
                r for r in waiting if not (partial / _failed(r)).exists() and not (partial / _written(r)).exists()
            }
            if waiting and self.abort.wait(_POLL_S):
                return

    def raise_error(self) -> None:
        if self.error is not None:
            raise self.error


def _touch_quietly(path: Path) -> None:
    # The assembler may have removed the folder, or the disk refuses even an empty file.
    with contextlib.suppress(OSError):
        path.touch()


def start_save(
    target: Path,
    parts: CheckpointParts,
    state: ProcessState,
    *,
    buffers: HostBuffers,
    safe_serialization: bool = True,
    after: Callable[[], Any] | None = None,
) -> PendingSave:
    """Start writing a checkpoint to ``target``; return once the state is copied (every rank calls).

    Raises here, on every rank, what a synchronous save raises before writing (a folder that is
    not a checkpoint, too little free space). ``after`` runs in the assembling thread once the
    folder is in place. The strategy must be one ``copies_in_background`` accepts. The copy goes
    into ``buffers`` (one per accelerator), which must not be lent to another save still writing.
    """
    staging = open_staging(target, parts, state)
    try:
        folder_id = uuid.uuid4().hex
        hooks = parts.before_save
        parts.before_save = None

        def prepare() -> None:
            if hooks is not None:  # the user's hooks see the model as it is now, in this thread
                parts.models = hooks(staging.partial)
            if staging.owner:
                (staging.partial / _GROUP).write_text(folder_id)

        staging.agree(prepare)
        ids = staging.agree(lambda: (staging.partial / _GROUP).read_text())
        others = [rank for rank, seen in enumerate(ids) if seen == ids[state.rank] and rank != state.rank]
        copies: list[CheckpointParts] = []  # kept here: agree would send a step's result to every rank
        staging.agree(lambda: copies.append(snapshot_parts(parts, buffers)))
    except Exception:
        staging.discard()
        raise
    pending = PendingSave(staging, copies[0], buffers, others if staging.owner else [], safe_serialization, after)
    pending.thread.start()
    return pending


def wait_save(pending: PendingSave, state: ProcessState) -> Path:
    """Wait for ``pending`` on every rank; raise its error, or another rank's, on every rank.

    Every rank calls it (it takes two collectives, in the calling thread).
    """
    if not pending.staging.owner:
        pending.thread.join()
    if state.world_size > 1:
        # An assembler may be waiting for the markers of a rank that could not even write one.
        failed = gather_object([pending.error is not None])
        if pending.staging.owner and any(failed[rank] for rank in pending.others):
            pending.abort.set()
    pending.thread.join()
    agree(state, "save_state", pending.raise_error)
    return pending.target
