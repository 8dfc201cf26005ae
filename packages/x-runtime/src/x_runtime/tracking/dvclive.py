"""DVCLive: metrics, parameters and plots as plain files under a ``dvclive.Live`` folder."""

from __future__ import annotations

import importlib
from typing import Any

from x_runtime.tracking.base import GeneralTracker, SkipWarnings, import_backend, scalar_value

__all__ = ["DVCLiveTracker"]


class DVCLiveTracker(GeneralTracker):
    """Logs to a ``dvclive.Live`` run: ``metrics.json``, ``plots/metrics/<key>.tsv``, ``params.yaml``.

    DVCLive names its folder itself (``dir``, default ``dvclive``), so the project name is not used;
    pass DVCLive's options through ``init_kwargs={"dvclive": {...}}``.

    Args:
        run_name: Accepted for the common signature, and not used (as in Accelerate).
        live: A ``dvclive.Live`` to log to instead of a new one (it is ended by ``finish``).
        **kwargs: Passed to ``dvclive.Live`` (``dir``, ``save_dvc_exp``, ``dvcyaml``, ...).

    Raises:
        ImportError: dvclive is not installed.

    Examples:
        >>> tracker = DVCLiveTracker(dir="runs/dvclive", save_dvc_exp=False)  # doctest: +SKIP
        >>> tracker.log({"loss": 0.5}, step=1)  # doctest: +SKIP
        >>> tracker.finish()  # doctest: +SKIP
    """

    name = "dvclive"
    requires_logging_directory = False

    def __init__(self, run_name: str | None = None, live: Any | None = None, **kwargs: Any):
        super().__init__()
        self._dvclive = import_backend("dvclive", "dvclive")
        self.run_name = run_name
        self.init_kwargs = kwargs
        # DVCLive's own test of what log_metric accepts (numbers, strings).
        self._could_log = importlib.import_module("dvclive.plots").Metric.could_log
        self.live = live if live is not None else self._dvclive.Live(**kwargs)
        self._skips = SkipWarnings("DVCLive")

    @property
    def tracker(self) -> Any:
        return self.live

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Write ``values`` to the run's ``params.yaml`` (``Live.log_params``).

        Args:
            values: Hyperparameter names and values: bool, str, int, float, or lists and dicts of them.
        """
        self.live.log_params(values)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Log each value DVCLive can record as a metric, then advance the run by one step.

        Numbers (and one-element tensors) and strings are recorded; other values are skipped with
        one warning per key. A given ``step`` sets the run's step first, so the values land on it
        and the next call without a step lands on the one after.

        Args:
            values: Metric names and values.
            step: The step the values belong to.
            **kwargs: Passed to ``Live.log_metric`` (``timestamp``, ``plot``, ...).
        """
        if step is not None:
            self.live.step = step
        for key, value in values.items():
            number = scalar_value(value)
            if number is not None and not isinstance(value, (int, float)):
                value = number  # a tensor or numpy scalar, recorded as the number it holds
            if self._could_log(value):
                self.live.log_metric(key, value, **kwargs)
            else:
                self._skips.skip(key, value, "numbers and strings")
        self.live.next_step()

    def finish(self) -> None:
        """End the run (writes its summary and, when asked for, the DVC experiment)."""
        self.live.end()
