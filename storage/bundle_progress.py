"""Progress inside a running bundle (issue 30 item 3), as tiny JSON files beside the store.

A bundle's worker writes ``<store>.progress/<group>/<bundle key>.json`` (atomically: temp file +
``os.replace``) when the bundle starts and then at a bounded rate (flows/bundle_progress.py):
``{"name", "cells", "started", "updated", "steps", "total", "loss", "target", "checkpoint_at"}``
(times in seconds since the epoch; ``loss`` / ``target`` as log10; any of steps..checkpoint_at may
be null). The flow process reads them to show them (bars, log lines, the stage's progress card),
``kktlab status`` reads them, and the flow removes a bundle's file once its cells are stored (and
a group's folder when its run ends). No array ever goes through Prefect.

A file ``<store>.progress/<group>/CANCEL`` asks the bundles of that group to stop at their next
progress report (``kktlab cancel``, or the flow process when its run is cancelled): see
flows/bundle_progress.py. Each run of a group starts with an empty folder (one run per group holds
its lock, storage/runlock.py).
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import time

SUFFIX = ".progress"
CANCEL = "CANCEL"
STALE_S = 600.0  # a file not updated for this long is said to be quiet (its worker may be gone)


def group_dir(store: str | os.PathLike, group: str) -> pathlib.Path:
    return pathlib.Path(str(store) + SUFFIX) / group


def path_for(store: str | os.PathLike, group: str, key: str) -> pathlib.Path:
    return group_dir(store, group) / f"{key}.json"


def write(path: str | os.PathLike, record: dict) -> None:
    """Write ``record`` to ``path`` atomically (a reader never sees half a file)."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(record, default=float))
    os.replace(tmp, path)


def read(store: str | os.PathLike, group: str) -> list[dict]:
    """The records of ``group``'s running bundles (unreadable or vanished files are skipped),
    each with its ``key``; oldest start first."""
    out = []
    folder = group_dir(store, group)
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict):
            out.append(dict(rec, key=path.stem))
    return sorted(out, key=lambda r: r.get("started") or 0)


def remove(store: str | os.PathLike, group: str, key: str) -> None:
    try:
        path_for(store, group, key).unlink()
    except FileNotFoundError:
        pass


def clear(store: str | os.PathLike, group: str) -> None:
    """Remove ``group``'s folder (a run's start and end), its cancel request with it."""
    shutil.rmtree(group_dir(store, group), ignore_errors=True)
    try:
        pathlib.Path(str(store) + SUFFIX).rmdir()  # the last group's: no empty folder left beside the store
    except OSError:
        pass


def request_cancel(store: str | os.PathLike, group: str, why: str = "") -> pathlib.Path:
    """Ask ``group``'s running bundles to stop (at their next progress report)."""
    path = group_dir(store, group) / CANCEL
    write(path, {"at": time.time(), "why": why, "pid": os.getpid()})
    return path


def cancel_requested(store: str | os.PathLike, group: str) -> bool:
    return (group_dir(store, group) / CANCEL).exists()


def _ago(t: float | None, now: float) -> str:
    if not t:
        return "?"
    s = int(max(now - t, 0))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d} ago"


def _at(t: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) if t else "?"


def describe(rec: dict, now: float | None = None, ago: bool = True) -> str:
    """``step 3000/150000 (2%), loss 1e-12.0 (target 1e-30), checkpoint 0:00:42 ago`` (what is
    known); ``ago=False``: clock times (``checkpoint at 12:03:04``), a line that changes only when
    the bundle reports."""
    when = (lambda t: _ago(t, now)) if ago else (lambda t: f"at {_at(t)}")
    now = time.time() if now is None else now
    parts = []
    steps, total = rec.get("steps"), rec.get("total")
    if steps is not None:
        pct = f" ({100 * steps / total:.0f}%)" if total else ""
        parts.append(f"step {int(steps)}" + (f"/{int(total)}" if total else "") + pct)
    if rec.get("loss") is not None:
        target = f" (target 1e{rec['target']:.0f})" if rec.get("target") is not None else ""
        parts.append(f"loss 1e{rec['loss']:.1f}{target}")
    if rec.get("checkpoint_at"):
        parts.append(f"checkpoint {when(rec['checkpoint_at'])}")
    if not parts:
        parts.append(f"started {when(rec.get('started'))}")
    if rec.get("updated") and now - rec["updated"] > STALE_S:
        parts.append(f"no word for {_ago(rec['updated'], now).removesuffix(' ago')}: its worker may be gone")
    return ", ".join(parts)


def fraction(rec: dict) -> float:
    steps, total = rec.get("steps"), rec.get("total")
    return steps / total if steps is not None and total else 0.0


def summary(records: list[dict], now: float | None = None) -> str:
    """One line for a stage's running bundles: the least advanced one's progress (its bottleneck)."""
    if not records:
        return ""
    slow = min(records, key=fraction)
    head = f"{len(records)} bundles running, slowest" if len(records) > 1 else "bundle"
    return f"{head} {slow.get('name') or slow.get('key', '?')}: {describe(slow, now, ago=False)}"


def status_lines(store: str | os.PathLike, group: str, shown: int = 5, now: float | None = None) -> list[str]:
    """``kktlab status``: a line per running bundle of ``group`` (at most ``shown``)."""
    records = read(store, group)
    lines = [f"  running: {r.get('name') or r['key']}: {describe(r, now)}" for r in records[:shown]]
    if len(records) > shown:
        lines.append(f"  running: {len(records) - shown} more bundles")
    return lines
