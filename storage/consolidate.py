"""Consolidated metadata (issue 31 item 3): the root ``zarr.json`` of a store also holds the
metadata of every group and array in it, so plain ``xr.open_zarr(store, group=...)`` (and
``xr.open_datatree(store, engine="zarr")``) opens with one read and without a warning.

The view is written when a run ends (:func:`consolidate`, flows/chain.py) and dropped before a run
may change the store (:func:`invalidate`, where a run opens its groups: flows/sweep.py::open_store),
because a run changes what the view records: it makes groups, adds to the ``kktlab_failures``
attribute and re-creates damaged arrays. So the view is never stale while a run computes, and a
run killed before its end leaves a store without one, which plain xarray opens from the live
metadata (with its 'Failed to open Zarr store with consolidated metadata' warning) until the next
run ends; a stale view would be worse: a group made after it is a KeyError there. The view is
also dropped, with a warning, when it cannot be written (an unreadable node): the store then
opens as without one.

kktlab's own readers never use the view: they open a group's folder, whose ``zarr.json`` holds no
view, or the root with ``use_consolidated=False`` / ``consolidated=False`` (storage/query.py,
storage/store.py::open_dataset), so ``status``, ``verify``, ``show``, ``report`` and the repair
steps of a run read the live metadata.

Both steps take the store's creation lock (``<store>.lock``, storage/store.py), so a group being
made is in the view whole or not at all; zarr's LocalStore and :func:`invalidate` replace the
root's ``zarr.json`` by renaming a finished file over it, so a kill mid-write leaves the old one.
Two runs on other groups of one store: the first to end writes a view while the other still
computes; the other rewrites it when it ends (killed before then, its group's failures in the view
are those of that moment: stale but valid).
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import tempfile
import warnings

from filelock import FileLock

KEY = "consolidated_metadata"  # the field of a Zarr v3 group's zarr.json that holds the view


def _lock(path: pathlib.Path) -> FileLock:
    return FileLock(str(path) + ".lock")  # the creation lock of storage/store.py::Store.open_or_create


def has_view(path: str | os.PathLike) -> bool:
    """The store's root ``zarr.json`` holds a consolidated view."""
    try:
        doc = json.loads((pathlib.Path(path) / "zarr.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get(KEY) is not None


def consolidate(path: str | os.PathLike) -> bool:
    """Write the consolidated view of every group and array of the store at ``path`` into its root
    ``zarr.json``. Never raises: where it cannot be written, the old view is dropped (a warning
    line on stderr says why) and False is returned."""
    import zarr

    path = pathlib.Path(path)
    if not (path / "zarr.json").is_file():
        return False
    try:
        with _lock(path), warnings.catch_warnings():
            # zarr: 'Consolidated metadata is currently not part in the Zarr format 3 specification'
            warnings.filterwarnings("ignore", message=".*Consolidated metadata.*")
            warnings.filterwarnings("ignore", message=".*does not have a Zarr V3 specification.*")  # string coords
            zarr.consolidate_metadata(str(path), zarr_format=3)
        return True
    except Exception as err:  # noqa: BLE001 - a damaged node, a full disk: the store opens without a view
        dropped = invalidate(path)
        print(f"[kktlab] warning: {path}: no consolidated metadata written ({type(err).__name__}: {err}); "
              f"{'the old one was dropped, ' if dropped else ''}plain xarray opens the store from its live "
              "metadata (with a warning); the next run writes it again", file=sys.stderr)
        return False


def invalidate(path: str | os.PathLike) -> bool:
    """Drop the consolidated view of the store at ``path`` (before a run changes the store).
    Returns whether one was dropped. Never raises: a root it cannot rewrite keeps its view (a
    warning line says so), which the run's end then rewrites."""
    path = pathlib.Path(path)
    meta = path / "zarr.json"
    if not has_view(path):
        return False
    try:
        with _lock(path):
            doc = json.loads(meta.read_text())
            if not isinstance(doc, dict) or doc.pop(KEY, None) is None:
                return False
            fd, tmp = tempfile.mkstemp(prefix=".zarr.json.", dir=path)
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(doc, f, indent=2)
                os.chmod(tmp, 0o644)
                os.replace(tmp, meta)
            except BaseException:
                pathlib.Path(tmp).unlink(missing_ok=True)
                raise
        return True
    except Exception as err:  # noqa: BLE001 - e.g. a read-only store: the run says so where it writes
        print(f"[kktlab] warning: {path}: its consolidated metadata could not be dropped ({type(err).__name__}: "
              f"{err}); plain xarray may read it stale until a run ends", file=sys.stderr)
        return False
