"""Progress of a sweep, per stage: cells done / total, ETA, cells from cache, cells failed, where
users look (issues 17, 30): terminal lines, Prefect log lines of the run ``kktlab submit`` / ``kktlab
run`` printed (the root flow run, so a served sweep's subflow shows in its parent), and that run's
progress card per stage, updated in place (flows/run_ui.py; the store is the truth, the UI best
effort). A stage's clock starts at its first running bundle (:meth:`Progress.running`), not at the
flow's start: a downstream stage's wait for its upstream is not counted in its elapsed time or ETA."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
import sys
import time
from typing import Callable


def hms(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    h, rem = divmod(seconds, 3600)
    return f"{h:d}:{rem // 60:02d}:{rem % 60:02d}"


@dataclasses.dataclass(frozen=True)
class Event:
    """One stage's progress as users see it (what a progress line says)."""

    stage: str
    done: int
    total: int
    elapsed_s: float
    eta_s: float | None = None
    cached: int = 0
    failed: int = 0
    inside: str = ""  # the running bundles' own progress (storage/bundle_progress.py ``summary``)

    @property
    def percent(self) -> float:
        return 100.0 * self.done / self.total if self.total else 100.0

    def line(self) -> str:
        """``[kktlab] nets: cells 12/40 (30%) elapsed 0:00:12 ETA 0:00:28, 4 from cache, 1 failed``, and
        while bundles run, ``; bundle nets d=25 (2 cells): step 3000/150000 (2%), loss 1e-12.0 (target 1e-30)``."""
        extra = "".join(f", {n} {what}" for n, what in ((self.cached, "from cache"), (self.failed, "failed")) if n)
        eta = hms(self.eta_s) if self.eta_s is not None else "?"
        return (f"[kktlab] {self.stage}: cells {self.done}/{self.total} ({self.percent:.0f}%) "
                f"elapsed {hms(self.elapsed_s)} ETA {eta}{extra}" + (f"; {self.inside}" if self.inside else ""))


_LINE = re.compile(r"(?:\[kktlab\] )?(?P<stage>.+?): cells (?P<done>\d+)/(?P<total>\d+) \(\d+%\) "
                   r"elapsed (?P<elapsed>[\d:]+) ETA (?P<eta>[\d:]+|\?)"
                   r"(?:, (?P<cached>\d+) from cache)?(?:, (?P<failed>\d+) failed)?(?:; (?P<inside>.*?))?\s*$")


def _seconds(text: str) -> float:
    h, m, s = (int(x) for x in text.split(":"))
    return 3600.0 * h + 60.0 * m + s


def parse_line(text: str) -> Event | None:
    """The :class:`Event` a progress line (a Prefect log message or a terminal line) says; None for
    any other text. ``parse_line(e.line()) == e`` up to whole seconds."""
    m = _LINE.match(text.strip())
    if not m:
        return None
    return Event(m["stage"], int(m["done"]), int(m["total"]), _seconds(m["elapsed"]),
                 None if m["eta"] == "?" else _seconds(m["eta"]), int(m["cached"] or 0), int(m["failed"] or 0),
                 m["inside"] or "")


# where each progress event also goes (``kktlab run`` in a terminal: live bars, kktlab/progress_view.py);
# while any sink is set, the plain terminal lines are not printed (the log lines and artifacts still are)
_SINKS: list[Callable[[Event], None]] = []


@contextlib.contextmanager
def sink(fn: Callable[[Event], None]):
    """Send every progress event of this process to ``fn`` while the block runs."""
    _SINKS.append(fn)
    try:
        yield fn
    finally:
        _SINKS.remove(fn)


def artifact_key(store: str, stage: str) -> str:
    """``kktlab-<store name>-<stage>``: lowercase letters, digits and dashes (Prefect's rule)."""
    from flows.run_ui import key

    return key(store, stage)


def _root_flow_run_id() -> str | None:
    try:
        from prefect.runtime import flow_run

        return flow_run.root_flow_run_id or flow_run.id
    except Exception:  # noqa: BLE001 - outside a flow run
        return None


def _api_logger() -> logging.Logger:
    """A logger whose records go to the Prefect API only (the terminal has its own lines)."""
    from prefect.logging.handlers import APILogHandler

    logger = logging.getLogger("prefect.kktlab.progress")
    if not logger.handlers:
        logger.addHandler(APILogHandler())
        logger.propagate = False
        logger.setLevel(logging.INFO)
    return logger


def announce(line: str, stream=None) -> None:
    """One ``[kktlab] line`` on the terminal and in the root flow run's logs (e.g. the Dask dashboard)."""
    print(f"[kktlab] {line}", file=stream or sys.stderr, flush=True)
    run_id = _root_flow_run_id()
    if run_id:
        try:
            _api_logger().info(line, extra={"flow_run_id": run_id})
        except Exception:  # noqa: BLE001 - the UI is best effort
            pass


def flush_logs() -> None:
    """Send the progress log lines still queued to the Prefect API, and wait for it."""
    if logging.getLogger("prefect.kktlab.progress").handlers:
        try:
            from prefect.logging.handlers import APILogHandler

            APILogHandler().flush()  # an instance method (drains Prefect's APILogWorker, 5 s at most)
        except Exception:  # noqa: BLE001 - the UI is best effort
            pass


class Progress:
    """Prints ``[kktlab] nets: cells 12/40 (30%) elapsed 0:00:12 ETA 0:00:28, 4 from cache, 1 failed``
    lines (rate-limited), logs them to the root flow run and keeps its progress card up to date.

    Elapsed time and ETA count from :meth:`running` (the stage's first bundle handed to the workers
    with its inputs stored; before it: elapsed 0, ETA ?); the rate counts computed cells only (cells
    from the result cache cost nothing). ``clock``: seconds, monotonic (a fake one in tests)."""

    def __init__(self, total: int, already: int, label: str, stream=None, every_s: float = 2.0,
                 store: str = "", clock: Callable[[], float] = time.monotonic):
        self.total, self.done, self.label = total, already, label
        self.start_done, self.clock, self.t0 = already, clock, None
        self.cached = self.failed = 0
        self.inside_line = ""  # what the running bundles say of themselves (:meth:`inside`)
        self.stream = stream or sys.stderr
        self.every_s, self.last = every_s, float("-inf")
        self.run_id = _root_flow_run_id()
        self.cards = None
        if self.run_id:
            from flows.run_ui import StageCards

            self.cards = StageCards(store or label, label, self.percent, self.line().removeprefix("[kktlab] "))
        self.emit(force=True)

    REFRESH_S = 30.0  # while the stage runs, a line at least this often: elapsed and ETA never stand still

    def tick(self) -> None:
        """On the flow's timer (flows/chain.py, every ``POLL_S`` without a finished bundle): a line, with its
        elapsed time and ETA as they are now, where none went out for :data:`REFRESH_S` (issue 43: a stale
        ETA stood for 111 s between two events)."""
        if self.t0 is not None and self.done < self.total and self.clock() - self.last >= self.REFRESH_S:
            self.emit(force=True)

    def running(self) -> None:
        """The stage's first bundle runs: its clock starts (later calls change nothing)."""
        if self.t0 is None:
            self.t0 = self.clock()

    @property
    def percent(self) -> float:
        return 100.0 * self.done / self.total if self.total else 100.0

    def elapsed(self) -> float:
        return 0.0 if self.t0 is None else self.clock() - self.t0

    def eta(self) -> float | None:
        computed = self.done - self.start_done - self.cached
        if self.t0 is None or computed <= 0:
            return None
        return self.elapsed() / computed * (self.total - self.done)

    def event(self) -> Event:
        return Event(self.label, self.done, self.total, self.elapsed(), self.eta(), self.cached, self.failed,
                     self.inside_line if self.done < self.total else "")

    def inside(self, line: str) -> None:
        """The running bundles' progress (polled from their files by the flow, flows/chain.py): a new
        line goes to the bars, the log and the stage's card."""
        if line != self.inside_line:
            self.inside_line = line
            self.emit(force=True)

    def line(self) -> str:
        return self.event().line()

    def advance(self, n: int, cached: int = 0, failed: int = 0) -> None:
        self.running()  # cells stored from the result cache before any bundle ran
        self.done += n
        self.cached += cached
        self.failed += failed
        self.emit(force=self.done >= self.total)

    def emit(self, force: bool = False) -> None:
        now = self.clock()
        event = self.event()
        for fn in list(_SINKS):  # live bars: every event
            try:
                fn(event)
            except Exception:  # noqa: BLE001 - a display never stops a sweep
                pass
        if not force and now - self.last < self.every_s:
            return
        self.last = now
        line = event.line()
        if not _SINKS:
            print(line, file=self.stream, flush=True)
        if self.run_id:
            self._to_prefect(line.removeprefix("[kktlab] "))

    def _to_prefect(self, line: str) -> None:
        try:
            _api_logger().info(line, extra={"flow_run_id": self.run_id})
        except Exception:  # noqa: BLE001 - the UI is best effort; the store is the truth
            pass
        if self.cards is not None:
            self.cards.update(self.percent, line)
