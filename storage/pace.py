"""How fast a group's cells are being stored, from the store alone: each cell owns its ``done``
chunk (storage/schema.py), so that chunk's modification time is when the cell was stored. What
``kktlab status`` shows as the pace and ETA of a run, served or not, without asking the run."""

from __future__ import annotations

import dataclasses
import pathlib
import time

import numpy as np
import zarr

from storage import schema

PAUSE_S = 1800.0  # a gap this long between two stored cells ends a burst: a later run is a new one
SAME_BUNDLE_S = 5.0  # cells stored this close to the burst's first are its first wave (of parallel workers)


@dataclasses.dataclass(frozen=True)
class Pace:
    """The current burst of stored cells of one group."""

    done: int
    total: int
    last_age_s: float  # seconds since the last cell was stored
    rate: float | None  # cells per second since the burst's first bundle; None: too early to say

    @property
    def eta_s(self) -> float | None:
        """Seconds to store the rest at :attr:`rate` (None without a rate or when all are done)."""
        left = self.total - self.done
        return left / self.rate if self.rate and left > 0 else None

    def line(self) -> str:
        """``pace 4.2 cells/min, last cell 12 s ago, ETA ~31 min for 130 cells``."""
        age = f"last cell stored {_span(self.last_age_s)} ago"
        if self.done >= self.total:
            return f"all stored; {age}"
        if self.last_age_s > PAUSE_S:
            return f"{age}: no run is storing cells now, or its bundles take over {_span(PAUSE_S)}"
        if self.rate is None:
            return f"{age}; too early for an ETA (only the first bundles of this run are stored)"
        eta = f"ETA ~{_span(self.eta_s)} for {self.total - self.done} cells if the run is still going"
        return f"pace {self.rate * 60:.3g} cells/min, {age}, {eta}"


def _span(s: float) -> str:
    for unit, size in (("h", 3600), ("min", 60)):
        if s >= 2 * size:
            return f"{s / size:.0f} {unit}"
    return f"{s:.0f} s"


def _done(path: str | pathlib.Path, group: str) -> zarr.Array:
    return zarr.open_array(str(pathlib.Path(path) / group / schema.DONE), mode="r", zarr_format=3)


def stored_times(path: str | pathlib.Path, group: str, arr: zarr.Array | None = None) -> np.ndarray:
    """When each done cell of ``group`` was stored (POSIX seconds, sorted): the mtime of its ``done``
    chunk, the last write of its block of cells (storage/blocks.py; ``arr``: the group's ``done``
    array, if the caller has it open)."""
    arr = _done(path, group) if arr is None else arr
    root = pathlib.Path(path) / group / schema.DONE
    done = np.argwhere(np.asarray(arr[...], dtype=bool))
    keys, counts = np.unique(done // np.asarray(arr.chunks), axis=0, return_counts=True)
    times = []
    for key, n in zip(keys, counts):
        chunk = root / arr.metadata.encode_chunk_key(tuple(int(i) for i in key))
        if chunk.is_file():
            times += [chunk.stat().st_mtime] * int(n)
    return np.sort(np.asarray(times, dtype=float))


def pace(path: str | pathlib.Path, group: str, done: int, now: float | None = None) -> Pace | None:
    """The pace of ``group``'s current burst (cells stored with no pause of :data:`PAUSE_S`), or None
    when no cell is done or nothing is left to run: every cell marked done (stored, failed, or done
    but damaged: the run is over; the next one marks damaged cells not done when it starts), and no
    rate once no cell has been stored for :data:`PAUSE_S`. ``done`` is the caller's count of sound
    done cells (damaged ones are to be computed again). The rate counts the cells stored after the burst's first wave (within
    :data:`SAME_BUNDLE_S` of its first cell: the first bundles of parallel workers) over the time
    from that first cell to now, so it is on the slow side while a bundle is in flight rather than
    inflated by bundles that finished together, and a run of one wave gets none."""
    arr = _done(path, group)
    t = stored_times(path, group, arr)
    if not t.size or t.size >= arr.size:  # (one time per cell marked done)
        return None
    now = time.time() if now is None else now
    gaps = np.nonzero(np.diff(t) > PAUSE_S)[0]
    burst = t[gaps[-1] + 1:] if gaps.size else t
    after = burst[burst > burst[0] + SAME_BUNDLE_S]
    span = max(now, burst[-1]) - burst[0]
    rate = after.size / span if after.size and span > 0 and now - burst[-1] <= PAUSE_S else None
    return Pace(done=done, total=int(arr.size), last_age_s=max(0.0, now - t[-1]), rate=rate)
