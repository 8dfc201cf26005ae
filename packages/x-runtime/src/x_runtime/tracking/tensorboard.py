"""TensorBoard: event files under ``logging_dir/run_name``, hyperparameters in the run's own file.

``store_init_configuration`` also writes ``hparams.yml`` where Accelerate writes it (a folder
named by ``time.time()`` inside the run folder, ``yaml.dump`` of the values as given), so tools
that read Accelerate's runs back find it. The hparams event itself stays in the run's own event
file (Accelerate's ``add_hparams`` makes a timestamped sub-run with no metrics, which TensorBoard's
HPARAMS tab then shows apart from the run's scalars).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from typing import Any

from x_runtime.tracking.base import GeneralTracker, SkipWarnings, scalar_value

__all__ = ["TensorBoardTracker"]

_logger = logging.getLogger("x_runtime.tracking")


class TensorBoardTracker(GeneralTracker):
    """Writes to TensorBoard event files under ``logging_dir/run_name``.

    Uses ``torch.utils.tensorboard`` (which needs the ``tensorboard`` package), or ``tensorboardX``
    when that is what is installed.

    Args:
        run_name: The run's name, a sub-directory of ``logging_dir``.
        logging_dir: Where runs are stored.
        **kwargs: Passed to ``SummaryWriter`` (e.g. ``flush_secs``).

    Raises:
        ImportError: neither ``tensorboard`` nor ``tensorboardX`` is installed.

    Examples:
        >>> import tempfile
        >>> tracker = TensorBoardTracker("demo", tempfile.mkdtemp())
        >>> tracker.log({"loss": 0.5, "note": "warmup", "lr": {"head": 0.1, "body": 0.01}}, step=1)
        >>> tracker.finish()
    """

    name = "tensorboard"
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: str | os.PathLike[str], **kwargs: Any):
        super().__init__()
        summary_writer, self._hparams = _import_tensorboard()
        self.run_name = run_name
        self.logging_dir = os.path.join(os.fspath(logging_dir), run_name)
        self.writer = summary_writer(self.logging_dir, **kwargs)
        self._skips = SkipWarnings("TensorBoard")

    @property
    def tracker(self) -> Any:
        return self.writer

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Store ``values`` as the run's hyperparameters (TensorBoard's HPARAMS tab).

        Nested dicts are flattened to ``outer/inner`` keys; values other than bool, str, int and
        float (None, lists, ...) are stored as their ``str``. ``values`` as given are also written
        to ``<run>/<time.time()>/hparams.yml`` with ``yaml.dump``, as Accelerate does.

        Args:
            values: Hyperparameter names and values.

        Examples:
            >>> import tempfile
            >>> tracker = TensorBoardTracker("demo", tempfile.mkdtemp())
            >>> tracker.store_init_configuration({"lr": 1e-3, "optimizer": {"name": "adamw"}})
            >>> tracker.finish()
        """
        flat = _flatten_hparams(values)
        experiment, session_start, session_end = self._hparams(flat, {})
        get_file_writer = getattr(self.writer, "_get_file_writer", None)
        if get_file_writer is None:
            # SummaryWriter.add_hparams writes to a new timestamped sub-run; "." keeps it in this run.
            self.writer.add_hparams(flat, {}, run_name=".")
        else:
            file_writer = get_file_writer()
            for summary in (experiment, session_start, session_end):
                file_writer.add_summary(summary)
        self.writer.flush()
        _write_hparams_yaml(self.logging_dir, values)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Write scalars, text and scalar groups, then flush so readers see them at once.

        Args:
            values: Numbers (and one-element tensors) become scalars, strings become text, dicts of
                numbers become a group of scalars (``add_scalars``). Other values are skipped with
                a warning.
            step: The global step.
            **kwargs: Passed to ``add_scalar``, ``add_text`` or ``add_scalars``.

        Examples:
            >>> import tempfile
            >>> tracker = TensorBoardTracker("demo", tempfile.mkdtemp())
            >>> tracker.log({"loss": 0.25}, step=10)
            >>> tracker.finish()
        """
        for key, value in values.items():
            number = scalar_value(value)
            if number is not None:
                self.writer.add_scalar(key, number, global_step=step, **kwargs)
            elif isinstance(value, str):
                self.writer.add_text(key, value, global_step=step, **kwargs)
            elif isinstance(value, Mapping) and value:
                group = {str(k): scalar_value(v) for k, v in value.items()}
                if any(v is None for v in group.values()):
                    self._skips.skip(key, value, "numbers, strings and dicts of numbers")
                else:
                    self.writer.add_scalars(key, group, global_step=step, **kwargs)
            else:
                self._skips.skip(key, value, "numbers, strings and dicts of numbers")
        self.writer.flush()

    def finish(self) -> None:
        """Flush and close the event files."""
        self.writer.close()


def _import_tensorboard() -> tuple[Any, Any]:
    try:
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams
    except ImportError:
        try:
            from tensorboardX import SummaryWriter  # type: ignore[import-not-found,no-redef]
            from tensorboardX.summary import hparams  # type: ignore[import-not-found,no-redef]
        except ImportError:
            raise ImportError("TensorBoard logging needs the tensorboard package: pip install tensorboard") from None
    return SummaryWriter, hparams


def _write_hparams_yaml(run_dir: str, values: Mapping[str, Any]) -> None:
    """``values`` to ``run_dir/<time.time()>/hparams.yml``: Accelerate's folder, name and text."""
    try:
        import yaml
    except ImportError:  # the tensorboard extra brings pyyaml; tensorboard alone does not
        _logger.warning("hparams.yml not written: it needs pyyaml (pip install pyyaml)")
        return
    folder = os.path.join(run_dir, str(time.time()))
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "hparams.yml"), "w", encoding="utf-8") as out:
        try:
            yaml.dump(values, out)
        except yaml.representer.RepresenterError:
            _logger.error("Serialization to store hyperparameters failed")
            raise


def _flatten_hparams(values: Mapping[str, Any], prefix: str = "") -> dict[str, bool | str | int | float]:
    flat: dict[str, bool | str | int | float] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten_hparams(value, f"{name}/"))
        elif isinstance(value, (bool, str)):
            flat[name] = value
        else:
            number = scalar_value(value)
            flat[name] = number if number is not None else str(value)
    return flat
