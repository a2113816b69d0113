"""Create-from-template, region writes, ``done`` mask, resume, refusal to overwrite.

Layout: ``<store>/<group>/`` is one experiment (group = config ``name``; in a config with
``stages``, one group per stage, named after the stage). The group's attrs hold provenance
(config, versions, git commit, device) and what defines the grid, so a rerun can check it is the
same experiment. A bundle's writes go straight to the Zarr chunks of its cells, each chunk once
(every chunk lies in one block of cells, written by one bundle at a time: storage/blocks.py);
``done`` is set last, so a kill between the two leaves the cells pending and they are recomputed.
Every chunk of a done cell is written, even an all-NaN one, so :mod:`storage.verify` can tell a
deleted chunk from a fill value; damaged cells are marked not done (:meth:`Store.mark_not_done`),
a deleted array and a damaged ``kktlab_nets_arrays`` are re-created (:meth:`Store.restore_arrays`).
"""

from __future__ import annotations

import datetime
import itertools
import json
import os
import pathlib
import platform
import shutil
import tempfile
import warnings

import numpy as np
import xarray as xr
import zarr
from filelock import FileLock

from core.declare import Experiment
from core.errors import StoreError
from storage import blocks, nets as nets_mod, schema, verify as verify_mod
from storage.hashing import content_hash, content_hashes  # noqa: F401 (re-exported)
from storage.provenance import git_commit, versions
from storage.foreign import check_kktlab_store

warnings.filterwarnings("ignore", message=".*Consolidated metadata.*")
warnings.filterwarnings("ignore", message=".*does not have a Zarr V3 specification.*")

BLOCK = "kktlab_block"  # group attribute: the cells of a chunk along the grid dims (storage/blocks.py)


class Store:
    """One experiment group of a results store."""

    def __init__(self, path: str | pathlib.Path, group: str):
        self.path = pathlib.Path(path)
        self.group_name = group
        self._group_rw: zarr.Group | None = None  # opened once for writing, with its arrays
        self._arrays: dict[str, zarr.Array] = {}  # (each metadata read costs ~3 ms)

    # --- creation / checks -----------------------------------------------------------------
    def identity(self, exp: Experiment, grid: dict[str, list], params: dict, cases: dict | None = None,
                 source: str | None = None) -> dict:
        ident = {"experiment": exp.name, "grid": {k: list(v) for k, v in grid.items()}, "params": params}
        if source:  # a stage of a chain: the group it reads from (absent for a single experiment)
            ident["from"] = source
        if cases:  # per-coordinate parameters (config "cases"); absent from stores made without them
            ident["cases"] = {axis: {str(v): o for v, o in by_value.items()} for axis, by_value in cases.items()}
        return ident

    def open_or_create(self, exp: Experiment, grid: dict[str, list], params: dict, *,
                       config_text: str, extra_sizes: dict[str, int], device: str,
                       cases: dict | None = None, source: str | None = None,
                       block: tuple[int, ...] | None = None) -> "Store":
        """Create the group from the template, or check an existing one is the same experiment.
        ``grid`` is the group's dims (for a stage of a chain: its upstream's, then its own),
        ``source`` the stage it reads from, ``block`` the cells of a chunk (storage/blocks.py; an
        existing group keeps its own)."""
        check_kktlab_store(self.path)
        ident = self.identity(exp, grid, params, cases, source)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # creating the root and a group is the one step two sweeps may race on: serialise it
        with FileLock(str(self.path) + ".lock"):
            return self._create_locked(exp, grid, ident, config_text, extra_sizes, device, block)

    def _create_locked(self, exp, grid, ident, config_text, extra_sizes, device, block=None) -> "Store":
        """Under the store's lock. The group is built whole in ``<store>.partial/`` and renamed into
        place (as is the root, for a new store), so a kill at any moment leaves either no group or
        a complete one: never a group without ``done`` or without its identity (issue 12 item 4).
        Leftovers of a killed creation are removed first."""
        gpath = self.path / self.group_name
        if (gpath / "zarr.json").exists():
            self.check_identity(ident, {k: prm.default for k, prm in exp.params.items()}, set(exp.inherits))
            return self
        partial = pathlib.Path(str(self.path) + ".partial")
        if partial.exists():
            shutil.rmtree(partial)  # a creation killed before its rename: nothing else reads it
        if gpath.exists():  # a group directory without metadata: made by a pre-atomic kktlab, or by hand
            if any(p.name == "zarr.json" for p in gpath.rglob("zarr.json")):
                raise StoreError(f"group '{self.group_name}' of {self.path} has arrays but no group metadata "
                                 f"(damaged); move {gpath} away or use another --store")
            shutil.rmtree(gpath)
        ds = schema.template(exp, grid, extra_sizes, block, ident.get("params"))
        ds.attrs.update({
            BLOCK: list(ds[schema.DONE].encoding["chunks"]),
            "kktlab_identity": json.dumps(ident, sort_keys=True, default=str),
            "kktlab_experiment": exp.name,
            **schema.nets_attrs(exp.nets_arrays),
            "paper": exp.paper,
            "config": config_text,
            "versions": json.dumps(versions()),
            "git_commit": git_commit(),
            "device": device,
            "host": platform.node(),
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        })
        new_root = not (self.path / "zarr.json").exists()
        root = partial / "root"
        zarr.open_group(str(root), mode="w", zarr_format=3)
        ds.to_zarr(str(root), group=self.group_name, mode="w-", compute=False,
                   encoding=schema.encoding(ds), zarr_format=3, consolidated=False)
        if new_root:  # the whole store appears at once
            if self.path.exists():
                self.path.rmdir()  # an empty directory (checked by open_or_create)
            os.replace(root, self.path)
        else:
            os.replace(root / self.group_name, gpath)
        shutil.rmtree(partial)
        return self

    def check_identity(self, ident: dict, defaults: dict | None = None, inherited: set | None = None) -> None:
        """The group holds the experiment, source, grid and params ``ident`` names. A parameter the
        group's identity lacks (added to the experiment after the group was made) matches when it
        has its default (``defaults``), which by the rule for new parameters keeps the old behaviour;
        one only the group has that the stage now takes from its upstream cells (``inherited``,
        Experiment.inherits) is the upstream's to judge."""
        attrs = self.group().attrs
        if "kktlab_identity" not in attrs:
            raise StoreError(f"group '{self.group_name}' of {self.path} was not written by kktlab")
        have = json.loads(attrs["kktlab_identity"])
        want = json.loads(json.dumps(ident, sort_keys=True, default=str))
        if have["experiment"] != want["experiment"]:
            raise StoreError(
                f"store {self.path} group '{self.group_name}' holds experiment '{have['experiment']}', "
                f"the config asks for '{want['experiment']}'; use another --store or config 'name'")
        if have.get("from") != want.get("from"):
            raise StoreError(f"config stage '{self.group_name}' reads from {want.get('from')!r} but store {self.path} "
                             f"group '{self.group_name}' was made reading from {have.get('from')!r}; use another --store")
        for part in ("grid", "params", "cases"):
            have_part, want_part = have.get(part, {}), want.get(part, {})
            for k in sorted(set(have_part) | set(want_part)):
                if part == "params" and k not in have_part and k in (defaults or {}) and \
                        want_part.get(k) == json.loads(json.dumps(defaults[k], default=str)):
                    continue  # a parameter newer than the group, at its default
                if part == "params" and k not in want_part and k in (inherited or ()):
                    continue  # recorded by an older kktlab; now the upstream cell's value
                if have_part.get(k) != want_part.get(k):
                    raise StoreError(
                        f"config field '{part}.{k}' is {want_part.get(k)!r} but store {self.path} group "
                        f"'{self.group_name}' was made with {have_part.get(k)!r}; use another --store or name")

    # --- reading --------------------------------------------------------------------------
    def group(self, mode: str = "r") -> zarr.Group:
        return zarr.open_group(str(self.path / self.group_name), mode=mode, zarr_format=3)

    def dims(self) -> list[str]:
        return list(self.group()[schema.DONE].metadata.dimension_names)

    def block(self) -> tuple[int, ...]:
        """The cells of a chunk along the grid dims (storage/blocks.py): the group's record, else
        its ``done`` chunks (one cell for stores made before blocks)."""
        g = self.group()
        if BLOCK in g.attrs:
            return tuple(int(b) for b in g.attrs[BLOCK])
        try:
            return tuple(int(c) for c in g[schema.DONE].chunks)
        except Exception:  # noqa: BLE001 - done's metadata lost or damaged (a rerun re-creates it): a cell
            return (1,) * len(json.loads(g.attrs["kktlab_identity"])["grid"])

    def done_mask(self) -> np.ndarray:
        return np.asarray(self.group()[schema.DONE][...], dtype=bool)

    def verify(self, exp: Experiment | None = None) -> verify_mod.Report:
        """Which done cells are damaged (storage/verify.py); ``exp`` declares the variables of
        stores made before the group listed them."""
        declared = (lambda name: dict(exp.variables)) if exp is not None else None
        return verify_mod.verify_group(self.path, self.group_name, declared)

    # --- repair ---------------------------------------------------------------------------
    def mark_not_done(self, indices) -> int:
        """Clear the ``done`` flag of these cells (damaged ones: a rerun recomputes them)."""
        points = blocks.points(indices, self._array(schema.DONE).ndim)
        if len(points):
            blocks.write_points(self._array(schema.DONE), points, np.zeros(len(points), dtype=bool), False)
        return len(points)

    def restore_arrays(self, exp: Experiment, grid: dict[str, list], extra_sizes: dict[str, int]) -> list[str]:
        """Re-create, empty and from the template, every array (variable, ``done``, coordinate)
        whose metadata is missing or unreadable or, for a coordinate, whose values do not decode.
        Returns their names (and the attributes readers act on, where rewritten); their done cells: :meth:`verify`."""
        ident = json.loads(self.group().attrs.get("kktlab_identity") or "{}")
        ds = schema.template(exp, grid, extra_sizes, self.block(), ident.get("params"))
        gpath = self.path / self.group_name
        attrs = nets_mod.restore_nets_arrays(gpath, exp.nets_arrays) + schema.restore_acted_on(self.group("r+"), exp)
        # every array of the template (a variable or hash array added since: re-created), but cell_finished
        # and cell_host where the group was made without them (an older kktlab's group does not gain them)
        made = set(self.group().attrs.get(schema.VARIABLES) or ds.data_vars)
        listed = {str(n) for n in ds.data_vars if n not in (schema.FINISHED, schema.HOST) or n in made}
        broken = [name for name in ds.variables if (name in ds.coords or name in listed)  # never made
                  and not _array_sound(gpath / str(name), name in ds.coords)]
        if not broken:
            return attrs
        tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{self.path.name}.restore-", dir=self.path.parent))
        try:
            with FileLock(str(self.path) + ".lock"):
                ds.to_zarr(str(tmp), group=self.group_name, mode="w-", compute=False,
                           encoding=schema.encoding(ds), zarr_format=3, consolidated=False)
                for name in broken:
                    shutil.rmtree(gpath / str(name), ignore_errors=True)
                    shutil.copytree(tmp / self.group_name / str(name), gpath / str(name))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        self._group_rw, self._arrays = None, {}
        return attrs + [str(n) for n in broken]

    # --- writing --------------------------------------------------------------------------
    def write_cell(self, index: tuple[int, ...], values: dict, *, force: bool = False,
                   replace_failed: bool = False) -> bool:
        """Write one cell's variables, then mark it done. Returns False (writes nothing) if the
        cell is already done and neither ``force`` is set nor (``replace_failed``) it is a failed
        cell: stored results are never overwritten silently."""
        h = self.write_values(index, values, force=force, replace_failed=replace_failed)
        return h is not None and self.mark_done(index, h, force=force, replace_failed=replace_failed)

    def writable(self, index: tuple[int, ...], force: bool = False, replace_failed: bool = False) -> bool:
        """May cell ``index`` be written? Not when it is done, unless ``force`` or (``replace_failed``)
        it is a failed cell."""
        return bool(self._writable(blocks.points([index], len(index)), force, replace_failed)[0])

    def _writable(self, points: np.ndarray, force: bool, replace_failed: bool) -> np.ndarray:
        ok = ~blocks.read_points(self._array(schema.DONE), points).astype(bool)
        if force:
            return np.ones(len(points), dtype=bool)
        if replace_failed and schema.FAILED in self._group_rw:
            ok |= blocks.read_points(self._array(schema.FAILED), points).astype(bool)
        return ok

    def write_values(self, index: tuple[int, ...], values: dict, *, force: bool = False,
                     replace_failed: bool = False) -> int | None:
        """One cell of :meth:`write_many`."""
        return self.write_many([index], [values], force=force, replace_failed=replace_failed)[0]

    def write_many(self, indices: list, values: list[dict], *, force: bool = False,
                   replace_failed: bool = False) -> list[int | None]:
        """Write the variables (padded along their extra dims) and ``cell_hash`` of many cells (a
        bundle), but not ``done``: what a worker does with the cells it computed, each chunk once
        (storage/blocks.py: a chunk's cells are one bundle's, so workers never share one); the flow
        then calls :meth:`mark_many`. Returns per cell its values' content hash, or None (nothing
        written) when the cell may not be written (:meth:`writable`)."""
        points = blocks.points(indices, self._array(schema.DONE).ndim)
        ok = self._writable(points, force, replace_failed) if len(points) else np.zeros(0, dtype=bool)
        hashes: list[int | None] = [None] * len(points)
        cells = np.flatnonzero(ok)
        stacks: dict[str, tuple[list[int], np.ndarray]] = {}  # per variable: the cells that have it, their values
        for name in sorted({n for i in cells for n in values[i]}):
            arr = self._array(name)
            which = [i for i in cells if name in values[i]]
            if arr.ndim == points.shape[1]:  # a scalar per cell: cast all at once
                stack = np.asarray([values[i][name] for i in which], dtype=arr.dtype)
            else:
                stack = np.stack([blocks.padded(arr, values[i][name], points.shape[1]) for i in which])
            stacks[name] = (which, stack)
            blocks.write_points(arr, points[which], stack, schema.fill_value(arr.dtype))
        if len(cells):  # one hash per cell, all at once (storage/hashing.py)
            if all(len(which) == len(cells) for which, _ in stacks.values()):
                got = content_hashes({n: stack for n, (_, stack) in stacks.items()})
            else:  # cells with different variables: each its own
                stored: dict[int, dict[str, np.ndarray]] = {int(i): {} for i in cells}
                for n, (which, stack) in stacks.items():
                    for i, v in zip(which, stack):
                        stored[int(i)][n] = v
                got = [content_hash(stored[int(i)]) for i in cells]
            for i, h in zip(cells, got):
                hashes[i] = int(h)
        if schema.CELL_HASH in self._group_rw and len(cells):  # after the values, before done
            blocks.write_points(self._array(schema.CELL_HASH), points[cells],
                                np.asarray([hashes[i] for i in cells], dtype=np.int64), schema.NO_HASH)
        self._stamp(points[cells])
        return hashes

    def _stamp(self, points: np.ndarray) -> None:
        """Record when (UTC) and where (this host) these cells were written (groups made before: nothing)."""
        now, host = datetime.datetime.now(datetime.timezone.utc).timestamp(), platform.node()[:schema.HOST_CHARS]
        for name, value, fill in ((schema.FINISHED, now, np.nan), (schema.HOST, host, "")):
            if len(points) and name in self._group_rw:
                arr = self._array(name)
                blocks.write_points(arr, points, np.full(len(points), value, dtype=arr.dtype), fill)

    def holds(self, written: list[tuple[tuple[int, ...], int]]) -> bool:
        """Do the cells hold what their worker wrote? ``written``: (index, content hash) pairs from
        its receipts; each must be the stored ``cell_hash``. False for a group without hashes."""
        if schema.CELL_HASH not in self.group():
            return False
        if not written:
            return True
        arr = self._array(schema.CELL_HASH)
        got = blocks.read_points(arr, blocks.points([i for i, _ in written], arr.ndim))
        return bool((got == np.asarray([h for _, h in written], dtype=np.int64)).all())

    def mark_done(self, index: tuple[int, ...], content: int | None = None, *, force: bool = False,
                  replace_failed: bool = False) -> bool:
        """One cell of :meth:`mark_many`."""
        return self.mark_many([index], None if content is None else [content], force=force,
                              replace_failed=replace_failed)[0]

    def mark_many(self, indices: list, contents: list[int] | None = None, *, force: bool = False,
                  replace_failed: bool = False) -> list[bool]:
        """Mark cells whose values are written (:meth:`write_many`) done; a retried failure that
        now worked is no longer failed. ``contents``: the hashes :meth:`write_many` returned; where
        the group keeps ``cell_hash``, a cell whose stored hash is another is not marked (StoreError:
        someone else wrote it since). Returns per cell False if it may not be written."""
        points = blocks.points(indices, self._array(schema.DONE).ndim)
        if not len(points):
            return []
        ok = self._writable(points, force, replace_failed)
        marked = points[ok]
        g = self._group_rw
        if contents is not None and schema.CELL_HASH in g and len(marked):
            have = blocks.read_points(self._array(schema.CELL_HASH), marked)
            bad = np.flatnonzero(have != np.asarray(contents, dtype=np.int64)[ok])
            if bad.size:
                raise StoreError(f"{self.path}/{self.group_name}: cell {self.cell_label(tuple(marked[bad[0]]))} holds "
                                 "other values than its worker wrote (written again since?); rerun to recompute it")
        if schema.FAILED in g and len(marked):  # retried failures that now work
            was = blocks.read_points(self._array(schema.FAILED), marked).astype(bool)
            if was.any():
                blocks.write_points(self._array(schema.FAILED), marked[was], np.zeros(int(was.sum()), bool), False)
                failures = schema.failures(g.attrs)
                for idx in marked[was]:
                    failures.pop(self.cell_label(tuple(idx)), None)
                g.attrs[schema.FAILURES] = json.dumps(failures, sort_keys=True)
        if len(marked):
            blocks.write_points(self._array(schema.DONE), marked, np.ones(len(marked), dtype=bool), False)
        return [bool(x) for x in ok]

    def write_failed(self, index: tuple[int, ...], error: str, *, force: bool = False,
                     replace_failed: bool = False) -> bool:
        """Record that computing cell ``index`` raised ``error``: its variables keep the fill value,
        ``failed`` and then ``done`` are set (a rerun does not repeat a deterministic failure;
        ``kktlab run --retry-failed`` does), the text goes to the group attr ``kktlab_failures``
        under the cell's coordinates. Returns False if the cell is already done (unless ``force``,
        or ``replace_failed`` and it is a failed cell)."""
        if not self.writable(index, force, replace_failed):
            return False
        point = blocks.points([index], len(index))
        g = self._group_rw
        label = self.cell_label(index)
        failures = schema.failures(g.attrs)
        failures[label] = error[:2000]
        g.attrs[schema.FAILURES] = json.dumps(failures, sort_keys=True)
        if schema.FAILED in g:  # stores made before failures were stored have no such array
            blocks.write_points(self._array(schema.FAILED), point, np.ones(1, dtype=bool), False)
        self._stamp(point)
        if schema.CELL_HASH in g:  # a failed cell holds no values: no hash (its readers are stale)
            blocks.write_points(self._array(schema.CELL_HASH), point, np.full(1, schema.NO_HASH), schema.NO_HASH)
        blocks.write_points(self._array(schema.DONE), point, np.ones(1, dtype=bool), False)
        return True

    def failed_mask(self) -> np.ndarray:
        g = self.group()
        if schema.FAILED not in g:
            return np.zeros(g[schema.DONE].shape, dtype=bool)
        return np.asarray(g[schema.FAILED][...], dtype=bool)

    def cell_label(self, index: tuple[int, ...]) -> str:
        """``'d=10, seed=0'``: a cell's coordinates, for messages and the failures attribute."""
        g = self.group()
        return ", ".join(f"{dim}={np.asarray(g[dim][i]).item()}" for dim, i in zip(self.dims(), index))

    def _array(self, name: str) -> zarr.Array:
        if self._group_rw is None:
            self._group_rw = self.group("r+")
        if name not in self._arrays:  # every chunk written, even an all-fill one (see the module doc)
            self._arrays[name] = self._group_rw[name].with_config({"write_empty_chunks": True})
        return self._arrays[name]

    def cell_indices(self) -> list[tuple[int, ...]]:
        shape = self.group()[schema.DONE].shape
        return list(itertools.product(*(range(s) for s in shape)))


def _array_sound(apath: pathlib.Path, read_values: bool) -> bool:
    try:
        arr = zarr.open_array(str(apath), mode="r", zarr_format=3)
        if read_values:
            arr[...]
    except Exception:  # noqa: BLE001 - any fault of metadata or values: re-create the array
        return False
    return True


def open_dataset(path: str | pathlib.Path, group: str, dask: bool = True) -> xr.Dataset:
    """``dask=False``: lazily indexed NumPy-backed variables, no Dask graph (and no Dask import:
    ~1.5 s of a reading command's start-up; `kktlab show`)."""
    ds = xr.open_zarr(str(path), group=group, consolidated=False, **({} if dask else {"chunks": None}))
    return schema.current_dims(ds)  # a store made before issue 40's renames reads with the new names
