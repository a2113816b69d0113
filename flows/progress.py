"""Progress of a sweep, per stage: cells done / total, ETA, cells from cache, cells failed, where
users look (issue 17): terminal lines, Prefect log lines of the run ``kktlab submit`` / ``kktlab
run`` printed (the root flow run, so a served sweep's subflow shows in its parent), and two
artifacts of that run under stable keys (``kktlab-<store>-<stage>`` markdown text,
``...-progress`` percent), updated as cells are stored (the store is the truth; the UI is best effort)."""

from __future__ import annotations

import logging
import pathlib
import re
import sys
import time


def _fmt(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    h, rem = divmod(seconds, 3600)
    return f"{h:d}:{rem // 60:02d}:{rem % 60:02d}"


def artifact_key(store: str, stage: str) -> str:
    """``kktlab-<store name>-<stage>``: lowercase letters, digits and dashes (Prefect's rule)."""
    name = pathlib.Path(str(store)).name.removesuffix(".zarr")
    return re.sub(r"[^a-z0-9-]+", "-", f"kktlab-{name}-{stage}".lower()).strip("-")[:100]


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


def flush_logs() -> None:
    """Send the progress log lines still queued to the Prefect API, and wait for it."""
    if logging.getLogger("prefect.kktlab.progress").handlers:
        try:
            from prefect.logging.handlers import APILogHandler

            APILogHandler.flush()
        except Exception:  # noqa: BLE001 - the UI is best effort
            pass


class Progress:
    """Prints ``[kktlab] nets: cells 12/40 (30%) elapsed 0:00:12 ETA 0:00:28, 4 from cache, 1 failed``
    lines (rate-limited), logs them to the root flow run and keeps its artifacts up to date."""

    def __init__(self, total: int, already: int, label: str, stream=None, every_s: float = 2.0,
                 store: str = "", artifact_every_s: float = 15.0):
        self.total, self.done, self.label = total, already, label
        self.start_done, self.t0 = already, time.monotonic()
        self.cached = self.failed = 0
        self.stream = stream or sys.stderr
        self.every_s, self.last = every_s, 0.0
        self.artifact_every_s, self.last_artifact = artifact_every_s, 0.0
        self.key = artifact_key(store or label, label)
        self.run_id = _root_flow_run_id()
        self.progress_id = None
        if self.run_id:
            try:
                from prefect.artifacts import Artifact

                self.progress_id = Artifact(type="progress", key=f"{self.key}-progress", data=self.percent,
                                            description=f"kktlab {label}: percent of cells done",
                                            flow_run_id=self.run_id).create().id
            except Exception:  # noqa: BLE001 - the UI is best effort
                self.progress_id = None
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
        extra = "".join(f", {n} {what}" for n, what in ((self.cached, "from cache"), (self.failed, "failed")) if n)
        return (f"[kktlab] {self.label}: cells {self.done}/{self.total} ({self.percent:.0f}%) "
                f"elapsed {_fmt(time.monotonic() - self.t0)} ETA {_fmt(eta) if eta is not None else '?'}{extra}")

    def advance(self, n: int, cached: int = 0, failed: int = 0) -> None:
        self.done += n
        self.cached += cached
        self.failed += failed
        self.emit(force=self.done >= self.total)

    def emit(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last < self.every_s:
            return
        self.last = now
        line = self.line()
        print(line, file=self.stream, flush=True)
        if self.run_id:
            self._to_prefect(line, force or now - self.last_artifact >= self.artifact_every_s)

    def _to_prefect(self, line: str, artifact: bool) -> None:
        try:
            _api_logger().info(line.removeprefix("[kktlab] "), extra={"flow_run_id": self.run_id})
            if self.progress_id is not None:
                from prefect.artifacts import update_progress_artifact

                update_progress_artifact(self.progress_id, progress=self.percent)
            if artifact:
                from prefect.artifacts import Artifact

                self.last_artifact = time.monotonic()
                Artifact(type="markdown", key=self.key, description=f"kktlab {self.label}: progress",
                         data=f"**{line.removeprefix('[kktlab] ')}**", flow_run_id=self.run_id).create()
        except Exception:  # noqa: BLE001 - the UI is best effort; the store is the truth
            pass
