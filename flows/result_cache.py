"""A bundle's receipts, kept beside its store until its cells are marked done (issues 12 item 3, 13 item 5).

The worker that computed a bundle writes its cells' regions into the store itself and then the
receipts here: per cell the content hash of what it wrote (``HASH``), ``REFUSED`` (the cell was done
already) or the error text (``FAILED``); a reading stage's cells add the ``upstream_hash`` they read.
A receipt file is the commit record of the worker's writes: it exists only once every region is
written, so a run killed after it resumes by marking the cells done, with nothing recomputed.

Why not Prefect's result persistence: it cloudpickles results into ``$PREFECT_HOME/storage``,
global to the user and keyed only on the cell parameters and kernel source, so reading a result
back runs whatever a writable file says and a new store silently takes numbers computed for
another store, torch version or device. Here:

* one ``.npz`` per bundle in ``<store>.cache/<group>/`` (directory mode 0700), written by the
  worker right after the bundle's cells are written (temp file + rename) and removed once they are
  marked done, so the only thing it survives is a kill between the two;
* read with ``numpy.load(allow_pickle=False)``: numbers only, nothing is executed;
* the key hashes the cells, the kernel code, the device asked for and the versions of python,
  torch and numpy; the file repeats its key and its fields are checked against a receipt's,
  and anything that does not match is moved aside (``.bad``) and recomputed.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pathlib
import platform
import time
import zipfile

import numpy as np

META = "__kktlab_meta__"
COLUMN, AT = "__column__/", "__at__/"  # a receipt's numbers over a bundle's cells, and the cells they belong to
FAILED = "__failed__"  # key of a cell's result when computing it raised: the error text
HASH = "__hash__"  # receipt of a cell its worker wrote into the store: the values' content hash
REFUSED = "__refused__"  # receipt of a cell its worker did not write (done already)
# receipt of each cell of a bundle whose writes the store's file system refused (no space, quota,
# read-only; flows/sweep.py::run_bundle): its cells stay not done, the flow submits nothing more and
# ends, and the run says so in one line naming the store (issue 29 item 10)
NO_ROOM = "__no_room__"
ROOM_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})


def cache_dir(store: str, group: str) -> pathlib.Path:
    return pathlib.Path(str(store) + ".cache") / group


def runtime_versions() -> dict[str, str]:
    import torch

    return {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__}


def bundle_key(experiment: str, cells: list[dict], device: str, code: str) -> str:
    """sha256 of what decides a bundle's numbers: cells, kernel code, device, versions."""
    payload = json.dumps({"experiment": experiment, "cells": cells, "device": device, "code": code,
                          "versions": runtime_versions()}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


def path_for(store: str, group: str, key: str) -> str:
    return str(cache_dir(store, group) / f"{key}.npz")


def save(path: str, key: str, results: list[dict], indices: list | None = None) -> None:
    """Write a bundle's results (numbers, number arrays, and the text of a failed cell) atomically;
    ``indices``: its cells' grid indices, so a rerun that bundles otherwise finds it (:func:`receipts`)."""
    meta = {"key": key, "n_cells": len(results), **({"indices": [list(map(int, i)) for i in indices]}
                                                      if indices is not None else {})}
    arrays = {META: np.array(json.dumps(meta))}
    per_cell: dict[str, list] = {}
    for i, values in enumerate(results):
        for name, v in values.items():
            arr = np.asarray(v)
            if arr.dtype.kind not in "biufU":
                raise TypeError(f"result {name!r} of cell {i} is not numeric ({arr.dtype}); cannot cache it")
            per_cell.setdefault(name, []).append((i, arr))
    for name, got in per_cell.items():
        kinds = {a.dtype.kind for _, a in got}
        if all(a.ndim == 0 for _, a in got) and len(kinds) == 1 and "U" not in kinds:
            # a receipt's numbers: one column per name over the cells that have it (a member per cell
            # cost ~0.3 ms a cell in zipfile; issue 33)
            at = np.array([i for i, _ in got], dtype=np.int64)
            arrays[f"{COLUMN}{name}"] = np.stack([a for _, a in got])
            arrays[f"{AT}{name}"] = at
        else:
            arrays.update({f"{i}/{name}": a for i, a in got})
    folder = os.path.dirname(path)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
    os.replace(tmp, path)


def load(path: str, key: str, n_cells: int, variables: set[str]) -> list[dict] | None:
    """The receipts of a bundle, or None if there are none. A file that is not a plain
    ``.npz`` of this key with ``n_cells`` cells, each holding numbers for the receipt's fields
    (``variables``) only or just the text of its failure (``FAILED``), is set aside (renamed
    ``*.bad-<time>``) and None is returned, so the bundle is recomputed."""
    if not os.path.exists(path):
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z[META][()]))
            if meta.get("key") != key or meta.get("n_cells") != n_cells:
                raise ValueError(f"written for another bundle (key {meta.get('key')!r})")
            out: list[dict] = [{} for _ in range(n_cells)]
            for name in z.files:
                if name == META or name.startswith(AT):
                    continue
                if name.startswith(COLUMN):  # a column of numbers over the cells listed beside it
                    var = name[len(COLUMN):]
                    col, at = z[name], z[AT + var]
                    if (col.dtype.kind not in "biuf" or at.dtype.kind != "i" or col.shape != at.shape or col.ndim != 1
                            or (at < 0).any()):
                        raise ValueError(f"column {var!r} is not numbers over its cells")
                    for i, v in zip(at.tolist(), col):
                        out[i][var] = v
                    continue
                i, var = name.split("/", 1)
                arr = z[name]
                if arr.dtype.kind not in ("U" if var == FAILED else "biuf"):
                    raise ValueError(f"entry {name!r} has dtype {arr.dtype}")
                out[int(i)][var] = arr[()] if arr.ndim == 0 else arr
    except (OSError, ValueError, KeyError, IndexError, zipfile.BadZipFile, EOFError) as err:
        quarantine(path, f"{type(err).__name__}: {err}")
        return None
    wrong = [i for i, v in enumerate(out) if not v or not (set(v) <= variables or set(v) == {FAILED})]
    if wrong:
        quarantine(path, f"cell {wrong[0]} has variables {sorted(out[wrong[0]])}, not declared ones")
        return None
    return out


def receipts(store: str, group: str) -> list[tuple[str, list[tuple[int, ...]]]]:
    """The receipt files a killed run left for ``group`` (path, its cells' grid indices): a rerun
    bundles those cells as they were, so the files are used and nothing is recomputed (issue 29
    item 3). Files without indices (older kktlab) or unreadable ones are left to :func:`load`."""
    folder = cache_dir(store, group)
    out = []
    for path in sorted(folder.glob("*.npz")) if folder.is_dir() else []:
        try:
            with np.load(path, allow_pickle=False) as z:
                meta = json.loads(str(z[META][()]))
            if "indices" in meta and len(meta["indices"]) == meta.get("n_cells"):
                out.append((str(path), [tuple(i) for i in meta["indices"]]))
        except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError):
            continue
    return out


def set_aside(path: str) -> str:
    """Move a file that cannot be trusted aside (never read again, kept for inspection): ``<path>.bad-<time>-<pid>``."""
    bad = f"{path}.bad-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    os.replace(path, bad)
    return bad


def quarantine(path: str, why: str) -> str:
    """:func:`set_aside` a cache file, with a warning: its cells are recomputed."""
    bad = set_aside(path)
    print(f"[kktlab] warning: {path} set aside as {bad} ({why}); its cells are recomputed", flush=True)
    return bad


def remove(path: str) -> None:
    if os.path.exists(path):
        os.remove(path)
