"""Stale cells of a reading stage, as make sees them: a done cell whose upstream cell changed since
it was read.

A producing stage's cell stores ``cell_hash`` (sha256 of its stored values but timings,
``storage.store.content_hash``, written with the values and before ``done``); a reading stage's
worker reads that hash with the nets and the cell stores it as ``upstream_hash``. A done, not
failed cell is stale when its ``upstream_hash`` differs from its upstream cell's ``cell_hash`` now,
or that upstream cell is no longer done or now failed. A deterministic recomputation of the
upstream (``--force``) stores the same hash, so its readers stay fresh; changed values make
exactly their readers stale. ``flows.sweep.plan`` marks stale cells not done, so a rerun
recomputes exactly them and queries never mix old and new.

A failed cell is stale when it failed because its upstream cell was not done, failed or damaged
(:data:`UPSTREAM_WAS_UNUSABLE`) and that upstream cell is no longer failed: usable again, or not done
and so computed again by the same run (issue 40: a repaired upstream is read again without
``--retry-failed``). Its other failures are its own and stay (``--retry-failed`` retries them).

Not judged (a note says so): cells with no recorded hash (-1: groups made before hashes), groups
without ``upstream_hash`` or whose upstream has no ``cell_hash``.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re

import numpy as np
import zarr

from storage import schema


# a reading cell's failure that its upstream cell caused by being unusable then (the words storage/nets.py writes):
# the cell is stale once that upstream cell is usable again or computed again (not done: the run computes it)
UPSTREAM_WAS_UNUSABLE = re.compile(r"upstream cell \(.*?\) (" + "|".join(
    map(re.escape, (schema.UPSTREAM_NOT_DONE, schema.UPSTREAM_FAILED, schema.UPSTREAM_DAMAGED))) + ")")


@dataclasses.dataclass
class Stale:
    """What :func:`stale_cells` found in one group."""

    group: str
    upstream: str | None  # the group it reads from (None: reads nothing)
    cells: list[tuple[int, ...]]  # stale cells (done, read an upstream version that is gone)
    names: list[str]  # their coordinates, "d=12, seed=0, attack=margin_direction"
    notes: list[str]  # what could not be judged


def _group(path: pathlib.Path, name: str) -> zarr.Group:
    return zarr.open_group(str(path / name), mode="r", zarr_format=3)


def _flags(g: zarr.Group, name: str, shape: tuple) -> np.ndarray:
    return np.asarray(g[name][...], dtype=bool) if name in g else np.zeros(shape, dtype=bool)


def stale_cells(path: str | pathlib.Path, group: str) -> Stale:
    """The stale cells of ``group`` (see the module docstring); none for a group that reads nothing."""
    path = pathlib.Path(path)
    g = _group(path, group)
    source = json.loads(g.attrs.get("kktlab_identity") or "{}").get("from")
    out = Stale(group, source, [], [], [])
    if not source:
        return out
    if not (path / source / "zarr.json").is_file():
        out.notes.append(f"its upstream group '{source}' is missing: not checked")
        return out
    up = _group(path, source)
    if schema.UPSTREAM_HASH not in g or schema.CELL_HASH not in up:
        out.notes.append(f"group '{group}' or its upstream '{source}' was made before cell hashes: "
                         "whether its cells read the upstream's current values is not checked")
        return out
    done = _flags(g, schema.DONE, g[schema.DONE].shape) & ~_flags(g, schema.FAILED, g[schema.DONE].shape)
    read = np.asarray(g[schema.UPSTREAM_HASH][...])
    up_shape = up[schema.DONE].shape
    up_ok = _flags(up, schema.DONE, up_shape) & ~_flags(up, schema.FAILED, up_shape)
    up_hash = np.where(up_ok, np.asarray(up[schema.CELL_HASH][...]), schema.NO_HASH)
    k = len(up_shape)  # a reading stage's leading dims are its upstream's: they name the cell it read
    # broadcast the upstream's current hash over this stage's own axes
    now = up_hash.reshape(up_shape + (1,) * (read.ndim - k))
    judged = done & (read != schema.NO_HASH)
    stale = judged & (read != now)
    unjudged = int((done & (read == schema.NO_HASH)).sum())
    if unjudged:
        out.notes.append(f"{unjudged} done cells of '{group}' recorded no upstream hash (computed before "
                         "hashes): not checked")
    from storage.store import Store

    label = Store(path, group).cell_label
    for idx in zip(*np.nonzero(stale)):
        idx = tuple(int(i) for i in idx)
        out.cells.append(idx)
        out.names.append(label(idx))
    up_failed = (_flags(up, schema.DONE, up_shape) & _flags(up, schema.FAILED, up_shape)).reshape(now.shape)
    failed = _flags(g, schema.DONE, g[schema.DONE].shape) & _flags(g, schema.FAILED, g[schema.DONE].shape)
    texts = schema.failures(g.attrs) if failed.any() else {}
    for idx in zip(*np.nonzero(failed & ~up_failed)):  # failed for its upstream, which is no longer failed
        idx = tuple(int(i) for i in idx)
        if UPSTREAM_WAS_UNUSABLE.match(texts.get(label(idx), "")):
            out.cells.append(idx)
            out.names.append(label(idx))
    return out


def read_another_version(path: str | pathlib.Path, upstream: str, indices: list, results: list[dict]) -> bool:
    """Did any of ``results`` (a reading stage's cached results, one per upstream cell at
    ``indices``) read an upstream cell whose hash is not the one stored now? Such a cache is not used."""
    g = _group(pathlib.Path(path), upstream)
    if schema.CELL_HASH not in g:
        return False
    return any(schema.UPSTREAM_HASH in res and int(res[schema.UPSTREAM_HASH]) != int(g[schema.CELL_HASH][tuple(idx)])
               for idx, res in zip(indices, results))


def status_lines(path: str | pathlib.Path, group: str, limit: int = 5) -> list[str]:
    """What ``kktlab status`` prints about a group's stale cells: their count and first names, and
    the notes (nothing for a group that reads nothing or has none)."""
    s = stale_cells(path, group)
    out = [f"  note: {note}" for note in s.notes]
    if s.cells:
        out.append(f"  stale: {len(s.cells)} done cells read an upstream '{s.upstream}' cell that has changed "
                   "since (or failed while it was unusable); `kktlab run` on the config recomputes them")
        out += [f"  stale: {name}" for name in s.names[:limit]]
        if len(s.names) > limit:
            out.append(f"  stale: ... and {len(s.names) - limit} more")
    return out
