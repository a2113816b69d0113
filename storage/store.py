"""Create-from-template, region writes, ``done`` mask, resume, refusal to overwrite.

Layout: ``<store>/<group>/`` is one experiment (group = config ``name``; in a config with
``stages``, one group per stage, named after the stage). The group's attrs
hold provenance (config, versions, git commit, device) and what defines the grid, so a rerun
can check it is the same experiment. Writes go straight to the Zarr arrays of one cell
(every chunk belongs to exactly one cell); ``done`` is set last, so a kill between the two
leaves the cell pending and it is recomputed. Every chunk of a done cell is written, even an
all-NaN one, so :mod:`storage.verify` can tell a deleted chunk from a fill value; damaged cells
are marked not done (:meth:`Store.mark_not_done`) and a deleted array is re-created from the
template (:meth:`Store.restore_arrays`).
"""

from __future__ import annotations

import datetime
import hashlib
import itertools
import json
import os
import pathlib
import platform
import shutil
import subprocess
import tempfile
import warnings

import numpy as np
import xarray as xr
import zarr
from filelock import FileLock

from core.declare import Experiment
from core.errors import StoreError
from storage import schema
from storage import verify as verify_mod
from storage.foreign import check_kktlab_store

warnings.filterwarnings("ignore", message=".*Consolidated metadata.*")
warnings.filterwarnings("ignore", message=".*does not have a Zarr V3 specification.*")


def versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for pkg in ("kktlab", "torch", "numpy", "xarray", "zarr", "dask", "distributed", "prefect"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def git_commit() -> str:
    root = pathlib.Path(__file__).resolve().parents[1]
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
        if out.returncode == 0:
            return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


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
                       cases: dict | None = None, source: str | None = None) -> "Store":
        """Create the group from the template, or check an existing one is the same experiment.
        ``grid`` is the group's dims (for a stage of a chain: its upstream's, then its own),
        ``source`` the stage it reads from."""
        check_kktlab_store(self.path)
        ident = self.identity(exp, grid, params, cases, source)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # creating the root and a group is the one step two sweeps may race on: serialise it
        with FileLock(str(self.path) + ".lock"):
            return self._create_locked(exp, grid, ident, config_text, extra_sizes, device)

    def _create_locked(self, exp, grid, ident, config_text, extra_sizes, device) -> "Store":
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
        ds = schema.template(exp, grid, extra_sizes)
        ds.attrs.update({
            "kktlab_identity": json.dumps(ident, sort_keys=True, default=str),
            "kktlab_experiment": exp.name,
            "kktlab_nets_arrays": json.dumps({k: list(v) for k, v in exp.nets_arrays.items()}, sort_keys=True),
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

    def done_mask(self) -> np.ndarray:
        return np.asarray(self.group()[schema.DONE][...], dtype=bool)

    def verify(self, exp: Experiment | None = None) -> verify_mod.Report:
        """Which done cells are damaged (storage/verify.py); ``exp`` declares the variables of
        stores made before the group listed them."""
        declared = (lambda name: tuple(exp.variables)) if exp is not None else None
        return verify_mod.verify_group(self.path, self.group_name, declared)

    # --- repair ---------------------------------------------------------------------------
    def mark_not_done(self, indices) -> int:
        """Clear the ``done`` flag of these cells (damaged ones: a rerun recomputes them)."""
        n = 0
        for idx in indices:
            self._array(schema.DONE)[tuple(idx)] = False
            n += 1
        return n

    def restore_arrays(self, exp: Experiment, grid: dict[str, list], extra_sizes: dict[str, int]) -> list[str]:
        """Re-create, empty and from the template, every array (variable, ``done``, coordinate)
        whose metadata is missing or unreadable or, for a coordinate, whose values do not decode.
        Returns their names; the done cells they held are damaged and found by :meth:`verify`."""
        ds = schema.template(exp, grid, extra_sizes)
        gpath = self.path / self.group_name
        broken = [name for name in ds.variables if not _array_sound(gpath / str(name), name in ds.coords)]
        if not broken:
            return []
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
        return [str(n) for n in broken]

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
        return not bool(self._array(schema.DONE)[index]) or force or (replace_failed and self._is_failed(index))

    def write_values(self, index: tuple[int, ...], values: dict, *, force: bool = False,
                     replace_failed: bool = False) -> int | None:
        """Write one cell's variables (padded along their extra dims) and its ``cell_hash``, but not
        ``done``: what a worker does with the cells it computed (each cell owns its chunks, so workers
        never share one); the flow then calls :meth:`mark_done`. Returns the values' content hash,
        or None (nothing written) when the cell may not be written (:meth:`writable`)."""
        if not self.writable(index, force, replace_failed):
            return None
        stored: dict[str, np.ndarray] = {}
        for name, value in values.items():
            arr = self._array(name)
            extra = arr.shape[len(index):]
            v = np.asarray(value, dtype=arr.dtype)
            if extra:
                pad = arr.attrs.get(schema.PAD) if v.size else None  # an empty value: not stored, all fill
                full = np.full(extra, schema.fill_value(arr.dtype) if pad is None else pad, dtype=arr.dtype)
                full[tuple(slice(0, s) for s in v.shape)] = v
                v = full
            arr[index] = v
            stored[name] = v
        h = content_hash(stored)
        if schema.CELL_HASH in self._group_rw:  # after the values, before done: a done cell always has its hash
            self._array(schema.CELL_HASH)[index] = h
        return h

    def holds(self, written: list[tuple[tuple[int, ...], int]]) -> bool:
        """Do the cells hold what their worker wrote? ``written``: (index, content hash) pairs from
        its receipts; each must be the stored ``cell_hash``. False for a group without hashes."""
        if schema.CELL_HASH not in self.group():
            return False
        arr = self._array(schema.CELL_HASH)
        return all(int(arr[tuple(idx)]) == h for idx, h in written)

    def mark_done(self, index: tuple[int, ...], content: int | None = None, *, force: bool = False,
                  replace_failed: bool = False) -> bool:
        """Mark a cell whose values are written (:meth:`write_values`) done; a retried failure that
        now worked is no longer failed. ``content``: the hash :meth:`write_values` returned; where
        the group keeps ``cell_hash``, a cell whose stored hash is another is not marked (StoreError:
        someone else wrote it since). Returns False if the cell may not be written."""
        if not self.writable(index, force, replace_failed):
            return False
        g = self._group_rw
        if content is not None and schema.CELL_HASH in g and int(self._array(schema.CELL_HASH)[index]) != content:
            raise StoreError(f"{self.path}/{self.group_name}: cell {self.cell_label(index)} holds other values "
                             "than its worker wrote (written again since?); rerun to recompute it")
        if schema.FAILED in g and bool(self._array(schema.FAILED)[index]):  # a retried failure that now works
            self._array(schema.FAILED)[index] = False
            failures = dict(g.attrs.get(schema.FAILURES, {}))
            failures.pop(self.cell_label(index), None)
            g.attrs[schema.FAILURES] = failures
        self._array(schema.DONE)[index] = True
        return True

    def _is_failed(self, index: tuple[int, ...]) -> bool:
        return schema.FAILED in self._group_rw and bool(self._array(schema.FAILED)[index])

    def write_failed(self, index: tuple[int, ...], error: str, *, force: bool = False,
                     replace_failed: bool = False) -> bool:
        """Record that computing cell ``index`` raised ``error``: its variables keep the fill value,
        ``failed`` and then ``done`` are set (a rerun does not repeat a deterministic failure;
        ``kktlab run --retry-failed`` does), the text goes to the group attr ``kktlab_failures``
        under the cell's coordinates. Returns False if the cell is already done (unless ``force``,
        or ``replace_failed`` and it is a failed cell)."""
        done = self._array(schema.DONE)
        if bool(done[index]) and not force and not (replace_failed and self._is_failed(index)):
            return False
        g = self._group_rw
        label = self.cell_label(index)
        failures = dict(g.attrs.get(schema.FAILURES, {}))
        failures[label] = error[:2000]
        g.attrs[schema.FAILURES] = failures
        if schema.FAILED in g:  # stores made before failures were stored have no such array
            self._array(schema.FAILED)[index] = True
        if schema.CELL_HASH in g:  # a failed cell holds no values: no hash (its readers are stale)
            self._array(schema.CELL_HASH)[index] = schema.NO_HASH
        done[index] = True
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


def content_hash(values: dict[str, np.ndarray]) -> int:
    """sha256 over (name, dtype, shape, bytes) of a cell's values as stored (padded, cast), in name
    order, without timings (``schema.NOT_HASHED``) and hashes; its first 63 bits, so never the fill -1.
    A deterministic recomputation gets the same hash; any changed value, another."""
    h = hashlib.sha256()
    for name in sorted(values):
        if name in schema.NOT_HASHED or name in (schema.CELL_HASH, schema.UPSTREAM_HASH):
            continue
        v = np.ascontiguousarray(values[name])
        h.update(f"{name}\0{v.dtype.str}\0{v.shape}\0".encode())
        h.update(v.tobytes())
    return int.from_bytes(h.digest()[:8], "little") & (2**63 - 1)


def _array_sound(apath: pathlib.Path, read_values: bool) -> bool:
    try:
        arr = zarr.open_array(str(apath), mode="r", zarr_format=3)
        if read_values:
            arr[...]
    except Exception:  # noqa: BLE001 - any fault of metadata or values: re-create the array
        return False
    return True


def open_dataset(path: str | pathlib.Path, group: str) -> xr.Dataset:
    return xr.open_zarr(str(path), group=group, consolidated=False)
