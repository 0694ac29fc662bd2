"""Progress on stderr for the commands that work through a backlog (`tick`, `backfill`, `scan`, `report`,
`query logs`, `reference build`): what is done, the rate per second and the time left.

The pipeline stages know nothing of it: they call an observer, a plain callable taking what is done so far
and the total when known (None: not known yet), from whichever thread does the work. `progress` yields
such an observer drawing a rich progress bar, or None when stderr is not a terminal or `--quiet` was given
(the stages then skip the calls)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from monitor.cli.common import State
from monitor.ingest.sources.batch import Observer


class Rate(ProgressColumn):
    """Done so far and the rate per second, in `unit` ("12,345 rows  3,210 rows/s")."""

    def __init__(self, unit: str) -> None:
        super().__init__()
        self.unit = unit

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        rate = f"{speed:,.0f} {self.unit}/s" if speed is not None else f"- {self.unit}/s"
        return Text(f"{int(task.completed):,} {self.unit}  {rate}", style="progress.data.speed")


@contextmanager
def progress(what: str, unit: str = "rows", console: Console | None = None) -> Iterator[Observer | None]:
    """An observer drawing `what`'s progress in `unit` on `console` (default: stderr) until the block ends;
    None when that console is not a terminal or `--quiet` was given."""
    # A console of its own by default: whether it draws live is decided when a console is made, and
    # stderr may have been swapped since the shared one was (a test runner, a redirect).
    console = console or Console(stderr=True)
    if State.quiet or not console.is_terminal:
        yield None
        return
    columns = (TextColumn(f"[bold]{what}[/]"), BarColumn(), Rate(unit), TimeElapsedColumn(), TextColumn("ETA"),
               TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(what, total=None)

        def observe(done: int, total: int | None) -> None:
            bar.update(task, completed=done, total=total)

        yield observe
