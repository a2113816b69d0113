"""The terminal view of a sweep's progress (issue 17): one live bar per stage (rich) when the stream
is a terminal, plain progress lines when it is not (a log file, CI, a pipe).

Fed with :class:`flows.progress.Event`\\ s: by the sweep itself under ``kktlab run``
(:func:`flows.progress.sink`) and by ``kktlab submit --watch`` from the flow run's progress log
lines (:func:`flows.progress.parse_line`)."""

from __future__ import annotations

import contextlib
import sys
import time

from flows.progress import Event, hms, sink


class Bars:
    """``with Bars() as bars: bars.update(event)``. ``console``: a rich Console (default: one on
    stderr); ``plain_every_s``: the least time between two plain lines of one stage (the last
    line of a stage, cells N/N, is always printed)."""

    def __init__(self, console=None, plain_every_s: float = 2.0, prefix: str = ""):
        from rich.console import Console

        self.console = console or Console(file=sys.stderr)
        self.live = self.console.is_terminal
        self.prefix, self.plain_every_s = prefix, plain_every_s
        self.tasks: dict[str, int] = {}
        self.last_counts: dict[str, tuple[int, int]] = {}  # stage -> (done, total) of its last event
        self.last_plain: dict[str, tuple[float, tuple | None]] = {}
        self.progress = None
        if self.live:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskProgressColumn, TextColumn

            self.progress = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("cells"),
                TaskProgressColumn(), TextColumn("elapsed {task.fields[elapsed]} ETA {task.fields[eta]}"),
                TextColumn("{task.fields[extra]}"), console=self.console, transient=False)

    def __enter__(self) -> "Bars":
        if self.progress is not None:
            self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.progress is not None:
            self.progress.refresh()
            self.progress.stop()

    def update(self, event: Event) -> None:
        self.last_counts[event.stage] = (event.done, event.total)
        if self.progress is None:
            return self._plain(event)
        fields = {"elapsed": hms(event.elapsed_s), "eta": hms(event.eta_s) if event.eta_s is not None else "?",
                  "extra": ", ".join([*(f"{n} {what}" for n, what in ((event.cached, "from cache"),
                                                                       (event.failed, "failed")) if n),
                                      *([event.inside] if event.inside else [])])}
        if event.stage not in self.tasks:
            self.tasks[event.stage] = self.progress.add_task(event.stage, total=event.total, completed=event.done,
                                                             **fields)
        else:
            self.progress.update(self.tasks[event.stage], total=event.total, completed=event.done, **fields)

    def _plain(self, event: Event) -> None:
        now, counts = time.monotonic(), (event.done, event.total, event.cached, event.failed, event.inside)
        last_t, last = self.last_plain.get(event.stage, (float("-inf"), None))
        if last == counts or (event.done < event.total and now - last_t < self.plain_every_s):
            return
        self.last_plain[event.stage] = (now, counts)
        self.console.file.write(self.prefix + event.line() + "\n")
        self.console.file.flush()


@contextlib.contextmanager
def terminal_bars(console=None):
    """``kktlab run``: live bars of this process's sweep on stderr when it is a terminal; else
    nothing changes (the sweep prints its plain progress lines itself)."""
    bars = Bars(console)
    if not bars.live:
        yield None
        return
    with bars, sink(bars.update):
        yield bars
