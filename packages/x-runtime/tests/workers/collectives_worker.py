"""Runs every x_runtime.process.collectives scenario once per process and reports what each rank got.

Usage (under torchrun, gloo on CPU): ``collectives_worker.py OUT_DIR``. Scenarios run in a fixed
order on every rank; one that raises records the error text and the run goes on, which is also how
the tests see that a failed shape check left every process in step (no hang).
"""

from __future__ import annotations

import sys
from collections import namedtuple
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

import torch

Pair = namedtuple("Pair", ["x", "y"])


def encode(value: Any) -> Any:
    """JSON-ready form of nested tensors, keeping container kinds and dtypes (shared with the tests)."""
    if isinstance(value, torch.Tensor):
        values = value
        if value.is_floating_point() and value.dtype not in (torch.float32, torch.float64):
            values = value.to(torch.float64)
        elif value.is_complex():
            values = torch.view_as_real(value)
        return {"tensor": values.tolist(), "dtype": str(value.dtype), "shape": list(value.shape)}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return {
            "namedtuple": type(value).__name__,
            "fields": {k: encode(v) for k, v in zip(value._fields, value, strict=True)},
        }
    if isinstance(value, Mapping):
        return {"dict": {str(k): encode(v) for k, v in value.items()}}
    if isinstance(value, (list, tuple)):
        return {type(value).__name__: [encode(v) for v in value]}
    return value


def main() -> None:
    import torch.distributed as dist
    from _helpers import report

    from x_runtime.process import collectives as c

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    r, w = dist.get_rank(), dist.get_world_size()
    results: dict[str, Any] = {}

    def scenario(name: str, func: Callable[[], Any]) -> None:
        try:
            results[name] = {"ok": func()}
        except Exception as error:
            results[name] = {"error": type(error).__name__, "message": str(error)}

    # Collectives issued by the module, counted by wrapping torch.distributed's functions; the
    # tensor all_gather flavours (list, into one tensor, torch 2.13's all_gather_single) count as one.
    counts: dict[str, int] = {}
    names = (
        "all_gather",
        "all_gather_into_tensor",
        "all_gather_single",
        "all_gather_object",
        "all_reduce",
        "broadcast",
    )
    for fname in (n for n in names if hasattr(dist, n)):
        original = getattr(dist, fname)
        key = "all_gather" if fname in ("all_gather_into_tensor", "all_gather_single") else fname

        def counted(*args: Any, _original: Any = original, _name: str = key, **kwargs: Any) -> Any:
            counts[_name] = counts.get(_name, 0) + 1
            return _original(*args, **kwargs)

        setattr(dist, fname, counted)

    def counting(func: Callable[[], Any]) -> Callable[[], Any]:
        def run() -> Any:
            counts.clear()
            result = func()
            return {"result": encode(result), "calls": dict(counts)}

        return run

    scenario("helpers", lambda: {"rank": c.rank(), "world_size": c.world_size()})

    # --- gather ---
    nested = {
        "a": torch.arange(4) + 10 * r,
        "b": [torch.arange(6, dtype=torch.float32).reshape(2, 3) + r, (torch.tensor(r * 1.5),)],
        "nt": Pair(x=torch.tensor([r % 2 == 0, True]), y=torch.tensor([[r, -r]])),
    }
    scenario("gather_nested", counting(lambda: c.gather(nested)))
    scenario("gather_nested_inputs_after", lambda: encode(nested))
    scenario("gather_uneven", counting(lambda: c.gather({"u": torch.full((r + 1, 2), r), "e": torch.tensor([r])})))
    # Header and data in one collective once a gather has sized the buffer; a payload that outgrows
    # it takes a second (data) collective, and the buffer grows for the next call.
    scenario("gather_fold_again", counting(lambda: c.gather(nested)))
    scenario("gather_fold_grows", counting(lambda: c.gather(torch.full((500 + r, 3), float(r)))))
    scenario("gather_fold_grown", counting(lambda: c.gather(torch.full((400, 3), float(r)))))
    scenario("gather_fold_header_overflows", counting(lambda: c.gather([torch.full((1,), i + r) for i in range(40)])))

    # Folded gathers of views whose memory is not their values (a transpose, a lazy conjugate) and of
    # tensors with autograd history: the values arrive, the history does not.
    def views() -> dict[str, Any]:
        leaf = torch.ones(2, requires_grad=True)
        data = {
            "t": (torch.arange(6.0).reshape(2, 3) + r).t(),
            "c": torch.tensor([complex(1, r)]).conj(),
            "g": leaf * (r + 1),
        }
        got = c.gather(data)
        return {"got": got, "requires_grad": [value.requires_grad for value in got.values()]}

    def history() -> dict[str, Any]:
        got = c.gather(torch.ones(3, requires_grad=True) * (r + 1))
        return {"got": got, "requires_grad": got.requires_grad}

    scenario("gather_fold_views", counting(views))
    scenario("gather_fold_history", counting(history))
    scenario("gather_empty_rows", lambda: encode(c.gather(torch.ones(0 if r == 0 else 2, 3))))
    scenario("gather_scalar", lambda: encode(c.gather(torch.tensor(float(r)))))
    typed = {
        "bool": torch.tensor([r % 2 == 0, True]),
        "int64": torch.tensor([2**40 + r]),
        "float16": torch.tensor([r + 0.5], dtype=torch.float16),
        "bfloat16": torch.tensor([r + 0.25], dtype=torch.bfloat16),
        "int16": torch.tensor([-r], dtype=torch.int16),
        "float8": torch.tensor([r + 1.0]).to(torch.float8_e4m3fn),
        "complex64": torch.tensor([complex(r, -r)], dtype=torch.complex64),
    }
    scenario("gather_dtypes", lambda: encode(c.gather(typed)))

    # Past the packing limit: one collective per tensor, padded and trimmed when rows differ.
    def big() -> dict[str, Any]:
        uneven = torch.full((300 + 7 * r, 1000), float(r))
        even = torch.full((300, 1000), r, dtype=torch.int64)
        flags = torch.full((2_000_000,), r % 2 == 1)
        got = c.gather({"uneven": uneven, "even": even, "flags": flags})
        return {
            "shapes": {k: list(v.shape) for k, v in got.items()},
            "uneven_rows": got["uneven"][:, 0].tolist(),
            "uneven_rows_constant": bool((got["uneven"] == got["uneven"][:, :1]).all()),
            "even_sums": got["even"].view(w, -1).sum(1).tolist(),
            "flags_true": int(got["flags"].sum()),
            "flags_dtype": str(got["flags"].dtype),
        }

    scenario("gather_big", big)
    many = [torch.full((2,), i + r) for i in range(100)]  # description overflows the first metadata round
    scenario("gather_many", counting(lambda: c.gather(many)))

    # --- the shape check: every rank must raise, then the next scenarios must still run ---
    scenario("mismatch_shape", lambda: c.gather(torch.zeros(4, 5 if r == 1 else 3)))
    scenario("mismatch_shape_nested", lambda: c.gather({"x": torch.zeros(2, 3), "y": [torch.zeros(2, 2 + r)]}))
    scenario("mismatch_dtype", lambda: c.gather(torch.zeros(2, dtype=torch.float32 if r == 0 else torch.int64)))
    scenario(
        "mismatch_structure",
        lambda: c.gather({"a": torch.zeros(1)} if r == 0 else {"a": torch.zeros(1), "b": torch.zeros(1)}),
    )
    scenario("mismatch_leaf", lambda: c.gather({"a": torch.zeros(1), "b": "label" if r == 1 else torch.zeros(1)}))
    scenario("after_mismatch", lambda: encode(c.gather(torch.tensor([r]))))

    # --- gather_object ---
    scenario("gather_object_list", lambda: c.gather_object([f"r{r}", r]))
    scenario("gather_object_other", lambda: c.gather_object({"rank": r}))
    scenario("gather_object_tuple", lambda: c.gather_object((r, r)))

    # --- pad_across_processes ---
    scenario("pad_end", counting(lambda: c.pad_across_processes(torch.arange(r + 1) + 1, pad_index=-1)))
    scenario("pad_first", lambda: encode(c.pad_across_processes(torch.arange(r + 1) + 1, pad_index=-1, pad_first=True)))
    mixed = {"m": torch.ones(2, r + 1, dtype=torch.int64), "s": torch.tensor(5.0), "v": torch.ones(3)}
    scenario("pad_dim1", lambda: encode(c.pad_across_processes(mixed, dim=1)))
    scenario("pad_dim_neg", lambda: encode(c.pad_across_processes([torch.ones(2, r + 1)], dim=-1, pad_first=True)))
    scenario("pad_ndim_mismatch", lambda: c.pad_across_processes(torch.ones(2) if r == 0 else torch.ones(2, 2)))

    # --- reduce ---
    base = {"f": torch.tensor([1.0, 2.0]) * (r + 1), "i": torch.tensor([r + 1])}
    for how in ("sum", "mean", "none", "max", "min"):
        scenario(f"reduce_{how}", lambda how=how: encode(c.reduce(base, reduction=how)))
    scenario("reduce_sum_scale", lambda: encode(c.reduce(base, reduction="sum", scale=0.5)))
    scenario("reduce_inputs_after", lambda: encode(base))
    scenario("reduce_unknown", lambda: c.reduce(base, reduction="avg"))

    # --- broadcast ---
    def bcast() -> dict[str, Any]:
        transposed = (torch.arange(6).reshape(2, 3) + 100 * r).t()  # not contiguous: filled via a copy
        data = {
            "a": torch.arange(3) + 100 * r,
            "b": [torch.tensor(float(r)), transposed],
            "bf16": torch.tensor([r + 0.5], dtype=torch.bfloat16),
            "flag": torch.tensor([r == 1]),
            "int16": torch.tensor([r], dtype=torch.int16),
            "param": torch.nn.Parameter(torch.full((3, 2), float(r)).t()),  # a leaf needing grad, not contiguous
        }
        returned = c.broadcast(data, from_process=1)
        return {"same_object": returned is data, "data": encode(data), "transposed": encode(transposed)}

    scenario("broadcast", bcast)
    scenario("broadcast_bad_source", lambda: c.broadcast(torch.zeros(1), from_process=w))

    def bcast_objects() -> dict[str, Any]:
        items = [r, f"x{r}", None]
        returned = c.broadcast_object_list(items, from_process=1)
        return {"same_object": returned is items, "items": items}

    scenario("broadcast_object_list", bcast_objects)

    report(results)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
