"""Exact resume when the ``collate_fn`` draws from the global RNG (transformers' masking collators).

A prepared loader knows its last batch before handing it out. Fetching the next batch ahead for
that (as Accelerate 1.15 does) runs its collate_fn before the user's step: the RNG state a
``save_state`` captures then already holds the next batch's draws, and the resumed run collates
that batch again from the restored state (2.8e-3 off after resume, on one process). x reads the
batch sampler ahead instead, so nothing of the next batch is drawn before it is asked for.
"""

from __future__ import annotations

import json

import pytest
import torch


@pytest.mark.parametrize("path", ["stateful", "skip"])
def test_a_random_collator_resumes_to_the_uninterrupted_weights(tmp_path, launch, path) -> None:
    ckpt = tmp_path / "ckpt"
    runs = {}
    for mode in ("full", "resume"):
        out = tmp_path / mode
        out.mkdir()
        launch("random_collate_worker.py", 1, str(out), str(ckpt), mode, path)
        runs[mode] = json.loads((out / "rank0.json").read_text())
    assert runs["resume"]["steps"] == runs["full"]["steps"] == 8
    for want, got in zip(runs["full"]["weights"], runs["resume"]["weights"], strict=True):
        assert torch.equal(torch.tensor(want), torch.tensor(got)), (torch.tensor(want) - torch.tensor(got)).abs().max()
