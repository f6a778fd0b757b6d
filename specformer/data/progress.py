"""What data preparation says while it works: each step that can take a while (reading the
files, training a BPE, tokenising each split) names what it does and, where it knows its
total, how far it is and how fast it goes.

A step reports to the reporter the caller installed with :func:`reporting` (``specformer
train`` installs :func:`rich_reporter`, bars on its console); without one it is silent, so
``prepare()`` called from Python prints nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from typing import Any

__all__ = ["Advance", "Reporter", "step", "reporting", "rich_reporter", "done_line", "fitting_progress"]

Advance = Callable[[int], None]
# (what the step does, its total in bytes of text, or None when it cannot tell) -> a block
# in which the step advances by the bytes it has done
Reporter = Callable[[str, "int | None"], AbstractContextManager[Advance]]

_REPORTER: ContextVar[Reporter | None] = ContextVar("specformer_data_progress", default=None)


def _ignore(done: int) -> None:
    return None


@contextmanager
def step(description: str, total: int | None = None) -> Iterator[Advance]:
    """A step of preparation, ``total`` bytes of text long (None: its length is not known,
    only its time is shown); the block calls what it yields with each amount done."""
    reporter = _REPORTER.get()
    if reporter is None:
        yield _ignore
        return
    with reporter(description, total) as advance:
        yield advance


@contextmanager
def reporting(reporter: Reporter | None) -> Iterator[None]:
    """Steps inside the block report to ``reporter`` (None: to no one)."""
    token = _REPORTER.set(reporter)
    try:
        yield
    finally:
        _REPORTER.reset(token)


# the fewest cells a bar that fills the line keeps before it gives way itself
MIN_BAR = 5


def fitting_progress(*columns: Any, optional: tuple[tuple[int, ...], ...] = (), **kwargs: Any) -> Any:
    """A rich ``Progress`` whose columns give way to a narrow terminal whole, where rich would
    cut every column short (``step ━╸ 12… loss 3.123 0:0… ETA -:-…`` at 50 columns). Each
    refresh keeps every column that fits the console's width: the groups of column indices in
    ``optional`` are left out first to last until the rest fits, a bar that fills the line
    counted at :data:`MIN_BAR` cells."""
    from rich.measure import Measurement
    from rich.progress import BarColumn, Progress

    class FittingProgress(Progress):
        def _width(self, kept: list[Any], tasks: list[Any]) -> int:
            shown = [task for task in tasks if task.visible]
            width = len(kept) - 1  # a space between two columns
            for column in kept:
                if isinstance(column, BarColumn) and column.bar_width is None:
                    width += MIN_BAR
                elif shown:
                    width += max(Measurement.get(self.console, self.console.options, column(task)).maximum
                                 for task in shown)
            return width

        def make_tasks_table(self, tasks: Any) -> Any:
            if "live" not in vars(self):  # rich's __init__ renders once before it has a console
                return super().make_tasks_table(tasks)
            every = self.columns
            kept = list(every)
            for group in ((), *optional):
                kept = [column for index, column in enumerate(every) if column in kept and index not in group]
                if self._width(kept, tasks) <= self.console.width:
                    break
            self.columns = tuple(kept)
            try:
                return super().make_tasks_table(tasks)
            finally:
                self.columns = every

    return FittingProgress(*columns, **kwargs)


# a step that ends sooner leaves no line behind (its bar is shown only while it runs)
LINE_AFTER_S = 2.0


def rich_reporter(console: Any, *, bars: bool = True) -> Reporter:
    """A rich bar on ``console`` while each step runs: what it does, MB done of the total,
    MB/s, elapsed time and ETA (a step of unknown length: its elapsed time). A step that
    took more than :data:`LINE_AFTER_S` seconds then leaves one line, which is also all a
    log gets, or a run without ``bars`` (``--no-progress``):
    ``tokenising the training text: 94.4 MB in 1m 3s (1.50 MB/s)``."""
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )
    from rich.table import Column

    @contextmanager
    def bar(description: str, total: int | None) -> Iterator[Advance]:
        whole = {"table_column": Column(no_wrap=True)}  # rich would cut each column short
        columns: list[Any] = [TextColumn("{task.description}"), BarColumn(bar_width=None)]
        # a narrow terminal drops the elapsed time, then the speed, then the ETA, then the bar
        optional: tuple[tuple[int, ...], ...] = ((2,), (1,))
        if total is not None:
            columns += [DownloadColumn(**whole), TransferSpeedColumn(**whole)]
            optional = ((4,), (3,), (5, 6), (1,))
        columns.append(TimeElapsedColumn(**whole))
        if total is not None:
            columns += [TextColumn("ETA", **whole), TimeRemainingColumn(**whole)]
        start = time.perf_counter()
        if bars and console.is_terminal:
            with fitting_progress(*columns, optional=optional, console=console, transient=True) as shown:
                task = shown.add_task(description, total=total)
                yield lambda done: shown.advance(task, done)
        else:  # a log: the line below alone
            yield _ignore
        seconds = time.perf_counter() - start
        if seconds > LINE_AFTER_S:
            # never wrapped: a path in it stays one piece to copy
            console.print(done_line(description, total, seconds), highlight=False, soft_wrap=True)

    return bar


def done_line(description: str, total: int | None, seconds: float) -> str:
    """``tokenising the training text: 94.4 MB in 1m 3s (1.50 MB/s)``; without a total, the time alone."""
    took = f"{int(seconds // 60)}m {seconds % 60:.0f}s" if seconds >= 60 else f"{seconds:.1f}s"
    if total is None:
        return f"{description}: {took}"
    return f"{description}: {total / 1e6:.1f} MB in {took} ({total / 1e6 / seconds:.2f} MB/s)"
