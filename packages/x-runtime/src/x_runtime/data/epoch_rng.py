"""The random draws a prepared loader's epoch makes, and what a checkpoint keeps so a resume replays them.

A resumed run restores torch's global RNG to what it was at the save, then starts a new iteration
of the saved epoch. Whatever that iteration draws must be what the interrupted iteration drew
before the save, and must not draw from the global RNG again (the interrupted run's draws are
already in the restored state): one extra draw shifts dropout and every later random op. Three
sources:

- **The workers' base seed**, which a DataLoader iterator draws from the loader's generator, or
  from the global RNG when it has none. It is drawn from the global RNG as plain torch draws it
  (with or without the seedable sampler, as Accelerate's loaders do), so a script keeps
  Accelerate's random numbers (dropout after an evaluation, say); a replayed epoch takes it from a
  generator of its own instead (its draw is already in the restored state).
- **The user's generator** (``DataLoader(generator=g)``, ``RandomSampler(generator=g)``): its
  state at the start of the epoch is kept; loading puts it back, and the replayed epoch draws
  what the interrupted one drew.
- **A RandomSampler without a generator** (``use_seedable_sampler=False``, one process) draws its
  seed from the global RNG as its iteration starts, after the base seed. The seed is drawn here
  instead (the same draw, in the same order), kept, and handed back to the sampler when a loaded
  epoch is replayed, so the replay draws nothing. With several processes ``prepare`` gives it a
  generator (one global draw, as Accelerate), synchronized from rank 0 at every epoch start.

A :class:`~x_runtime.data.samplers.SeedableRandomSampler` shuffles by ``(seed, epoch)`` alone:
nothing to keep.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

import torch
from torch.utils.data import DataLoader, RandomSampler

from x_runtime.data.samplers import SeedableRandomSampler, mix_seed
from x_runtime.data.sharding import Sharding

__all__ = ["EpochRandomness"]

_WORKER_SEED_SALT = 0x5EED_0F_10ADE2  # worker seeds differ from the shuffle seed of the same epoch


def _encode(state: torch.Tensor) -> str:
    return base64.b64encode(bytes(state.tolist())).decode("ascii")


def _decode(text: str) -> torch.Tensor:
    return torch.tensor(list(base64.b64decode(text)), dtype=torch.uint8)


class EpochRandomness:
    """What one loader's epochs draw beyond ``(seed, epoch)``; a loader and its skipping copies share one.

    Args:
        sampler: The index sampler under the batch sampler (``None`` for iterable datasets).
        generator: The ``generator`` the user gave the DataLoader, if any.
        sharding: Where this process sits.
        every_rank_iterates: Each rank iterates the sampler (False: rank 0 alone, and sends).
        global_draws: Draw the workers' base seed from the global RNG, as plain torch (and
            Accelerate without the seedable sampler) does.
    """

    def __init__(
        self,
        sampler: Any,
        generator: torch.Generator | None,
        sharding: Sharding,
        *,
        every_rank_iterates: bool,
        global_draws: bool = False,
    ) -> None:
        self._own_generator = generator is None
        self._global_draws = global_draws
        self._replaying = False  # a loaded state's epoch: its draws are in the restored global RNG
        self._lent: DataLoader | None = None  # the loader holding a base-seed generator until started
        # A seedable sampler reseeds any generator it has from (seed, epoch): nothing to keep there.
        seedable = isinstance(sampler, SeedableRandomSampler)
        sampler_generator = None if seedable else getattr(sampler, "generator", None)
        plain = isinstance(sampler, RandomSampler) and not seedable
        shares = every_rank_iterates and sharding.num_processes > 1
        # Every rank shuffles with the user's generator: rank 0's state, given to all, makes them agree.
        self._shared = sampler_generator if plain and shares else None
        found = [g for g in (sampler_generator, generator) if isinstance(g, torch.Generator)]
        self._user = list({id(g): g for g in found}.values())  # often one generator, given to both
        # Only RandomSampler's own __iter__ is known to read its generator once and draw nothing else.
        replayable = plain and type(sampler).__iter__ is RandomSampler.__iter__
        self._global_sampler = sampler if replayable and sampler_generator is None else None
        self._draws_here = every_rank_iterates or sharding.process_index == 0
        self._share_seed = shares
        self._start_states: list[str] | None = None  # encoded once: state_dict may run every batch
        self._seed: int | None = None
        self._loaded_seed: int | None = None

    def begin(self, loader: DataLoader, seed: int | None, epoch: int) -> None:
        """Make this epoch's draws, before ``loader`` starts its DataLoader iterator."""
        replaying, self._replaying = self._replaying, False
        if self._own_generator and not self._reuses_workers(loader):
            generator = torch.Generator()
            if self._global_draws and self._draws_here and not replaying:
                # The iterator draws its base seed from a copy of the global RNG, then the global RNG
                # makes that same draw: the stream plain torch has, and the sampler's seed can be
                # drawn next, in torch's order, before the iterator (whose workers read it) starts.
                generator.set_state(torch.get_rng_state())
                torch.empty((), dtype=torch.int64).random_()
                self._lent = loader
            else:
                generator.manual_seed(mix_seed(seed or 0, epoch) ^ _WORKER_SEED_SALT)
            loader.generator = generator
        if self._shared is not None:
            from x_runtime.core.random_state import synchronize_rng_states

            synchronize_rng_states(["generator"], generator=self._shared)
        self._start_states = [_encode(g.get_state()) for g in self._user]
        sampler = self._global_sampler
        if sampler is None or not self._draws_here:
            return
        drawn, self._loaded_seed = self._loaded_seed, None
        if drawn is None:
            drawn = int(torch.empty((), dtype=torch.int64).random_().item())  # RandomSampler's own draw
            if self._share_seed:
                from x_runtime.process.collectives import broadcast_int

                drawn = broadcast_int(drawn, from_process=0)
        self._seed = drawn
        # RandomSampler reads its generator once, as its iteration starts; ``started`` takes it back.
        sampler.generator = torch.Generator().manual_seed(drawn)

    @staticmethod
    def _reuses_workers(loader: DataLoader) -> bool:
        # Persistent workers: torch draws no base seed again once its iterator exists.
        return bool(loader.persistent_workers and loader.num_workers > 0 and loader._iterator is not None)

    def started(self) -> None:
        """The iteration has begun (or the epoch ended): give the user's sampler and loader back as they were."""
        if self._global_sampler is not None:
            self._global_sampler.generator = None
        if self._lent is not None:
            self._lent.generator = None
            self._lent = None

    def state_dict(self, *, mid_epoch: bool) -> dict[str, Any]:
        """What a resume needs: the draws of the epoch holding the next batch (``mid_epoch``: the running one)."""
        state: dict[str, Any] = {}
        if self._user:
            running = self._start_states if mid_epoch else None
            state["generators"] = running or [_encode(g.get_state()) for g in self._user]
        if mid_epoch and self._global_sampler is not None and self._seed is not None:
            state["sampler_seed"] = self._seed
        return state

    def load_state_dict(self, state: Mapping[str, Any], *, mid_epoch: bool) -> None:
        """Put the user's generators where the saved epoch began; replay its sampler seed."""
        encoded = state.get("generators")
        if encoded is not None and len(encoded) == len(self._user):
            for generator, text in zip(self._user, encoded, strict=True):
                generator.set_state(_decode(text))
        seed = state.get("sampler_seed")
        self._loaded_seed = int(seed) if mid_epoch and seed is not None else None
        # Saved inside an epoch's loop: that epoch's draws were made before the save.
        self._replaying = mid_epoch and int(state.get("batches_yielded", 0)) > 0
