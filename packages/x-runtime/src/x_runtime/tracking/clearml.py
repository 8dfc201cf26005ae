"""ClearML: one ClearML task per tracker (or the task the script already started)."""

from __future__ import annotations

from typing import Any

from x_runtime.core.settings import current_settings
from x_runtime.tracking.base import GeneralTracker, SkipWarnings, import_backend, scalar_value

__all__ = ["ClearMLTracker"]

# A key starting with one of these prefixes and "_" is reported under that series, prefix removed.
_SERIES = ("eval", "test", "train")


class ClearMLTracker(GeneralTracker):
    """Logs to a ClearML task.

    When the script has already started a task (``Task.init``), the tracker logs to it and leaves
    it open at ``finish``. Otherwise it starts one, named by ``CLEARML_PROJECT`` and ``CLEARML_TASK``
    when set, else by ``run_name``. ``Task.set_offline(True)`` beforehand keeps everything local.

    Args:
        run_name: The project and task name when the environment names none.
        **kwargs: Passed to ``Task.init`` (``project_name`` and ``task_name`` override the above).

    Raises:
        ImportError: clearml is not installed.

    Examples:
        >>> from clearml import Task  # doctest: +SKIP
        >>> Task.set_offline(True)  # doctest: +SKIP
        >>> tracker = ClearMLTracker("my-project")  # doctest: +SKIP
        >>> tracker.log({"train_loss": 0.5, "eval_loss": 0.6}, step=1)  # doctest: +SKIP
        >>> tracker.finish()  # doctest: +SKIP
    """

    name = "clearml"
    requires_logging_directory = False

    def __init__(self, run_name: str | None = None, **kwargs: Any):
        super().__init__()
        clearml = import_backend("clearml", "clearml")
        self.user_provided_run_name = run_name
        self.init_kwargs = kwargs
        current = clearml.Task.current_task()
        self._initialized_externally = bool(current)
        if current:
            self.task = current
        else:
            options = dict(kwargs)
            settings = current_settings()  # ClearML's own variables win over the run name, as in Accelerate
            options.setdefault("project_name", settings.raw("CLEARML_PROJECT", run_name))
            options.setdefault("task_name", settings.raw("CLEARML_TASK", run_name))
            self.task = clearml.Task.init(**options)
        self._skips = SkipWarnings("ClearML")

    @property
    def tracker(self) -> Any:
        return self.task

    def store_init_configuration(self, values: dict[str, Any]) -> Any:
        """Connect ``values`` to the task as its configuration (``Task.connect_configuration``).

        Args:
            values: Hyperparameter names and values.

        Returns:
            What ``connect_configuration`` returns (the values, possibly as edited in ClearML).
        """
        return self.task.connect_configuration(values)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Report numbers: with a ``step`` as scalars, without one as single values.

        With a step, a key ``eval_x``, ``test_x`` or ``train_x`` is reported as title ``x`` in that
        series; any other key as itself in the ``train`` series. Values that are not numbers are
        skipped with one warning per key.

        Args:
            values: Metric names and numbers (one-element tensors count as numbers).
            step: The iteration the values belong to.
            **kwargs: Passed to ``Logger.report_scalar`` or ``Logger.report_single_value``.
        """
        reporter = self.task.get_logger()
        for key, value in values.items():
            number = scalar_value(value)
            if number is None:
                self._skips.skip(key, value, "numbers only")
            elif step is None:
                reporter.report_single_value(name=key, value=number, **kwargs)
            else:
                title, series = _title_and_series(key)
                reporter.report_scalar(title=title, series=series, value=number, iteration=step, **kwargs)

    def log_images(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Report each image (an ``np.ndarray`` or ``PIL.Image``) under its key's title and series.

        Args:
            values: Image names and images.
            step: The iteration the images belong to.
            **kwargs: Passed to ``Logger.report_image``.
        """
        reporter = self.task.get_logger()
        for key, image in values.items():
            title, series = _title_and_series(key)
            reporter.report_image(title=title, series=series, iteration=step, image=image, **kwargs)

    def log_table(
        self,
        table_name: str,
        columns: list[str] | None = None,
        data: list[list[Any]] | None = None,
        dataframe: Any = None,
        step: int | None = None,
        **kwargs: Any,
    ) -> None:
        """Report a table, from a ``dataframe`` or from rows of ``data`` (``columns`` as header).

        Without ``columns`` the first row of ``data`` is the header.

        Args:
            table_name: The table's name (split into title and series as metric keys are).
            columns: Column names for ``data``.
            data: The rows.
            dataframe: A pandas DataFrame, used instead of ``columns`` and ``data``.
            step: The iteration the table belongs to.
            **kwargs: Passed to ``Logger.report_table``.

        Raises:
            ValueError: neither ``dataframe`` nor ``data`` was given.
        """
        table = dataframe
        if table is None:
            if data is None:
                raise ValueError("ClearMLTracker.log_table needs `data` (rows) when no `dataframe` is given")
            table = [columns, *data] if columns else data
        title, series = _title_and_series(table_name)
        self.task.get_logger().report_table(title=title, series=series, table_plot=table, iteration=step, **kwargs)

    def finish(self) -> None:
        """Close the task this tracker started; a task the script started stays open."""
        if self.task and not self._initialized_externally:
            self.task.close()

    @staticmethod
    def _get_title_series(name: str) -> tuple[str, str]:
        return _title_and_series(name)


def _title_and_series(name: str) -> tuple[str, str]:
    for prefix in _SERIES:
        if name.startswith(f"{prefix}_"):
            return name[len(prefix) + 1 :], prefix
    return name, "train"
