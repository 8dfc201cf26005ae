"""Fixtures several x-bigmodel test files share: a file's resident pages read from smaps, and the
small Llama configurations the from_pretrained tests save."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def _mapped_bytes(path: Path) -> int:
    """Resident bytes of this process's mappings of ``path`` (/proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if "-" in line.split(" ", 1)[0] and len(line.split()) >= 5:  # a mapping's first line
            inside = line.endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1]) * 1024
    return total


@pytest.fixture(scope="session")
def tiny_llama() -> Any:
    """A 4-layer Llama config whose weights fit in kilobytes (shards of 40 KB hold a few tensors)."""
    transformers = pytest.importorskip("transformers")
    return transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.3, tie_word_embeddings=False,
    )  # fmt: skip


@pytest.fixture(scope="session")
def wide_vocab_llama() -> Any:
    """A 2-layer Llama whose 4096-row embedding is most of its 17 MB file: a forward reads few rows."""
    transformers = pytest.importorskip("transformers")
    return transformers.LlamaConfig(
        vocab_size=4096, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        tie_word_embeddings=False,
    )  # fmt: skip


@pytest.fixture(scope="session")
def mapped_bytes() -> Callable[[Path], int]:
    """Resident bytes of this process's mappings of a path, as a function of the path."""
    return _mapped_bytes
