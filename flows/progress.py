"""Progress of a sweep: cells done / total and ETA, in the terminal and in the Prefect UI."""

from __future__ import annotations

import sys
import time


def _fmt(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    h, rem = divmod(seconds, 3600)
    return f"{h:d}:{rem // 60:02d}:{rem % 60:02d}"


class Progress:
    """Prints ``cells 12/40 (30%) elapsed 0:00:12 ETA 0:00:28`` lines (rate-limited) and keeps
    a Prefect progress artifact of the flow run up to date."""

    def __init__(self, total: int, already: int, label: str, stream=None, every_s: float = 2.0):
        self.total, self.done, self.label = total, already, label
        self.start_done, self.t0 = already, time.monotonic()
        self.stream = stream or sys.stderr
        self.every_s, self.last = every_s, 0.0
        self.artifact = None
        try:
            from prefect.artifacts import create_progress_artifact

            self.artifact = create_progress_artifact(
                progress=self.percent, key=None, description=f"kktlab sweep {label}: cells done / total")
        except Exception:  # noqa: BLE001 - outside a flow run there is no artifact to keep
            self.artifact = None
        self.emit(force=True)

    @property
    def percent(self) -> float:
        return 100.0 * self.done / self.total if self.total else 100.0

    def eta(self) -> float | None:
        new = self.done - self.start_done
        if new <= 0:
            return None
        rate = (time.monotonic() - self.t0) / new
        return rate * (self.total - self.done)

    def line(self) -> str:
        eta = self.eta()
        return (f"[kktlab] {self.label}: cells {self.done}/{self.total} ({self.percent:.0f}%) "
                f"elapsed {_fmt(time.monotonic() - self.t0)} ETA {_fmt(eta) if eta is not None else '?'}")

    def advance(self, n: int) -> None:
        self.done += n
        self.emit(force=self.done >= self.total)

    def emit(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last < self.every_s:
            return
        self.last = now
        print(self.line(), file=self.stream, flush=True)
        if self.artifact is not None:
            from prefect.artifacts import update_progress_artifact

            try:
                update_progress_artifact(self.artifact, progress=self.percent)
            except Exception:  # noqa: BLE001 - the UI is best effort; the store is the truth
                pass
