"""Is a store what its ``done`` mask says? Every done cell must have every variable readable,
checksummed and finite where declared; what is not is named by the cell's coordinates.

What is checked, per experiment group:

- the metadata: the root and group ``zarr.json`` (a group directory without one is an error, not
  an empty store) and every array the group should have (its ``kktlab_variables`` attribute, or
  for stores made before it the variables the caller expects, or the arrays present);
- the group attribute ``kktlab_nets_arrays`` (what readers of its nets load beside them): valid,
  and matching the crc32c written with it (storage/nets.py::read_nets_arrays); each variable's
  attributes readers act on (``ok_values``, ``must_be_finite``, the pad value, ``valid_min`` /
  ``valid_max``: storage.schema.acted_on) equal to its declaration, where the caller gives it;
- per done cell and variable: the chunk exists (stores written with checksums write every chunk
  of a done cell, even an all-NaN one, so a missing chunk is damage, not a fill value), it decodes
  (its crc32c checksum matches: a flipped byte or a garbage chunk is caught), and it is finite
  where the variable's ``must_be_finite`` attribute says so (declared as ``Var(finite=True)``).

Stores made before checksums still open: the chunk check is skipped for their arrays without the
checksum codec (an absent chunk there may be a legitimate fill value) and a note says so.
Damage of a group as a whole (metadata gone or unreadable) raises :class:`StoreError` with one
line; damaged cells come back in a :class:`Report`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Callable

import google_crc32c
import numpy as np
import zarr

from core.errors import StoreError
from storage import schema


@dataclasses.dataclass
class Report:
    """What :func:`verify_group` found in one experiment group."""

    group: str
    experiment: str
    total: int  # cells of the grid
    sound: int  # cells marked done and not damaged
    cells: dict[tuple[int, ...], list[str]]  # damaged cell (grid index, marked done) -> its problems
    names: CellNames  # grid index -> "alpha=0.5, d=25, seed=1"
    broken_arrays: list[str]  # arrays whose metadata or coordinate values are damaged (a rerun re-creates them)
    problems: list[str]  # damage of whole arrays (a variable's or a coordinate's metadata or values)
    notes: list[str]  # what could not be checked

    @property
    def damaged(self) -> int:
        return len(self.cells)

    @property
    def ok(self) -> bool:
        return not self.cells and not self.problems

    def lines(self, limit: int | None = None) -> list[str]:
        """One line per damaged cell: ``alpha=0.5, d=25, seed=1: variable c_star chunk missing``."""
        items = sorted(self.cells.items())
        out = [f"{self.names[idx]}: {'; '.join(problems)}" for idx, problems in items[:limit]]
        if limit is not None and len(items) > limit:
            out.append(f"... and {len(items) - limit} more damaged cells")
        return out


def find_groups(path: str | pathlib.Path) -> list[str]:
    """The experiment groups of a store; a directory that holds arrays but whose group metadata is
    missing or unreadable raises :class:`StoreError` instead of being left out silently."""
    path = pathlib.Path(path)
    if not (path / "zarr.json").is_file():
        raise StoreError(f"{path} is not a kktlab store (no zarr.json)")
    out = []
    for sub in sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith(".")):
        meta = sub / "zarr.json"
        if not meta.is_file():
            if any(sub.glob("*/zarr.json")):
                raise StoreError(f"{path}: group '{sub.name}' has arrays but no zarr.json (its metadata was "
                                 "deleted; the config and provenance are lost): move the store away and rerun")
            continue
        doc = _read_json(meta, f"{path}: group '{sub.name}'")
        if doc.get("node_type") == "group" and "kktlab_identity" in doc.get("attributes", {}):
            out.append(sub.name)
    return out


def _read_json(meta: pathlib.Path, what: str) -> dict:
    try:
        doc = json.loads(meta.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise StoreError(f"{what}: zarr.json is unreadable ({type(err).__name__}: {err})") from None
    if not isinstance(doc, dict):
        raise StoreError(f"{what}: zarr.json is not a JSON object")
    return doc


class CellNames:
    """Grid index -> "dim=value, ..." in the grid's dim order, made when asked (a 10^5-cell grid's
    names all at once took ~0.5 s of every verify; only damaged cells are named)."""

    def __init__(self, grid: dict[str, list]):
        self.grid = grid

    def __getitem__(self, idx: tuple[int, ...]) -> str:
        return ", ".join(f"{dim}={vals[int(i)]}" for (dim, vals), i in zip(self.grid.items(), idx))


def _open_array(gpath: pathlib.Path, name: str) -> tuple[zarr.Array | None, str]:
    """The array, or None and why not."""
    if not (gpath / name).is_dir():
        return None, "missing (no array)"
    if not (gpath / name / "zarr.json").is_file():
        return None, "metadata missing (no zarr.json)"
    try:
        return zarr.open_array(str(gpath / name), mode="r", zarr_format=3), ""
    except Exception as err:  # noqa: BLE001 - any metadata fault is damage, reported in one line
        return None, f"metadata unreadable ({type(err).__name__}: {str(err)[:80]})"


def _checksummed(arr: zarr.Array) -> bool:
    return any(getattr(c, "to_dict", lambda: {})().get("name") == schema.CHECKSUM
               for c in arr.metadata.codecs)


def _chunk_problem(err: Exception) -> str:
    msg = str(err)
    if "checksum" in msg.lower():
        return "checksum mismatch"
    return f"chunk unreadable ({type(err).__name__}: {msg[:60]})"


def _raw_check(chunk: str) -> str:
    """The problem of one checksummed chunk file, read as bytes ('' if none): zarr's crc32c codec
    appends the little-endian crc32c of the encoded bytes. About 50x faster than decoding."""
    try:
        with open(chunk, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return "chunk missing"
    except OSError as err:
        return f"chunk unreadable ({type(err).__name__}: {err})"
    if len(data) < 4 or google_crc32c.value(data[:-4]) != int.from_bytes(data[-4:], "little"):
        return "checksum mismatch"
    return ""


def _read(arr: zarr.Array, cells) -> tuple[np.ndarray, dict[tuple, str]]:
    """The whole array, and the problem of each of ``cells`` (a list of indices, or a callable giving
    it: built only when needed) whose chunk does not decode (those read as the fill value)."""
    try:
        return np.asarray(arr[...]), {}
    except Exception:  # noqa: BLE001 - localise below, chunk by chunk
        pass
    cells = cells() if callable(cells) else cells
    values = np.full(arr.shape, schema.fill_value(arr.dtype), dtype=arr.dtype)
    bad = {}
    for idx in cells:
        try:
            values[idx] = arr[idx]
        except Exception as err:  # noqa: BLE001
            bad[idx] = _chunk_problem(err)
    return values, bad


def _edited(gpath: pathlib.Path, harr: zarr.Array, variables: list[str], cells: list[tuple[int, ...]],
            shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The ``cells`` whose stored values no longer hash to their ``cell_hash`` (storage.store.content_hash
    of what the worker wrote); cells without a hash (stores made before hashes) are not judged."""
    from storage.hashing import content_hash, content_hashes

    if not cells:
        return []
    stored = np.asarray(harr[...]).reshape(shape)
    hashed_at = stored[tuple(np.asarray(cells).T)] != schema.NO_HASH
    cells = cells if hashed_at.all() else [idx for idx, h in zip(cells, hashed_at) if h]
    hashed = [n for n in variables if n not in schema.NOT_HASHED and n not in (schema.CELL_HASH, schema.UPSTREAM_HASH)]
    try:
        values = {n: np.asarray(zarr.open_array(str(gpath / n), mode="r", zarr_format=3)[...]) for n in hashed}
    except Exception:  # noqa: BLE001 - a damaged chunk or array: named by the checks above, cell by cell
        values = {}
        for idx in list(cells):
            try:
                got = {n: np.asarray(zarr.open_array(str(gpath / n), mode="r", zarr_format=3)[idx]) for n in hashed}
            except Exception:  # noqa: BLE001
                cells.remove(idx)
                continue
            for n, a in got.items():
                values.setdefault(n, np.zeros(shape + a.shape, dtype=a.dtype))[idx] = a
    if not cells:
        return []
    if len(values) == len(hashed):  # every array read whole: all cells' hashes at once
        at = tuple(np.asarray(cells).T)
        got = np.asarray(content_hashes({n: a[at] for n, a in values.items()}), dtype=np.int64)
        return [cells[i] for i in np.nonzero(got != stored[at].astype(np.int64))[0]]
    return [idx for idx in cells if content_hash({n: a[idx] for n, a in values.items()}) != int(stored[idx])]


def _attribute_problems(name: str, got: dict, want: dict) -> list[str]:
    """A variable's attributes that readers act on (storage.schema.ACTED_ON) that differ from its
    declaration; one absent where the declaration has it is allowed only for stores made before it."""
    out = []
    for key in schema.ACTED_ON:
        if key in got and (key not in want or not np.array_equal(np.asarray(got[key], dtype=float),
                                                                   np.asarray(want[key], dtype=float))):
            out.append(f"variable {name}: attribute {key} is {got[key]!r}, declared {want.get(key, 'absent')!r} "
                       "(readers act on it: usable cells, finiteness, interval bounds); `kktlab run` on its "
                       "config restores it from the declaration")
    return out


def verify_group(path: str | pathlib.Path, group: str,
                 declared: Callable[[str], tuple[str, ...]] | None = None, hashes: bool = True) -> Report:
    """Check one experiment group (see the module docstring). ``declared(experiment)``: the
    declared variables (names, or a mapping name -> core.declare.Var, whose attributes readers act
    on are then checked), the names used for stores made before the group listed them
    (``kktlab_variables``). ``hashes=False``: skip the cell_hash comparison (it hashes every cell's
    values; the chunk, checksum and finiteness checks read each chunk's bytes once): the cheap check
    :func:`storage.query.damaged` runs before every table and figure."""
    path = pathlib.Path(path)
    gpath = path / group
    where = f"{path}: group '{group}'"
    if not (gpath / "zarr.json").is_file():
        raise StoreError(f"{where} has no zarr.json (its metadata was deleted or it does not exist)")
    attrs = _read_json(gpath / "zarr.json", where).get("attributes", {})
    try:
        ident = json.loads(attrs["kktlab_identity"])
        grid = ident["grid"]
    except (KeyError, TypeError, json.JSONDecodeError):
        raise StoreError(f"{where} was not written by kktlab (no readable kktlab_identity)") from None
    done_arr, why = _open_array(gpath, schema.DONE)
    if done_arr is None:
        raise StoreError(f"{where}: array 'done' {why}: which cells are done is unknown; "
                         "`kktlab run` on its config re-creates it and recomputes every cell")
    dims = list(done_arr.metadata.dimension_names or grid)  # the identity's grid is key-sorted
    if sorted(dims) != sorted(grid):
        raise StoreError(f"{where}: array 'done' has dims {dims}, the grid {sorted(grid)}")
    grid = {dim: grid[dim] for dim in dims}
    names = CellNames(grid)
    shape = tuple(len(v) for v in grid.values())
    notes: list[str] = []
    problems: list[str] = []
    variables = list(attrs.get(schema.VARIABLES) or ())
    decl = declared(ident.get("experiment", "?")) if declared is not None else ()
    if not variables:
        variables = list(decl)
    if not variables:
        variables = sorted(p.parent.name for p in gpath.glob("*/zarr.json") if p.parent.name not in grid)
        notes.append("the group does not list its variables (made before kktlab_variables): checked the arrays present")
    variables = [v for v in variables if v not in (schema.DONE, schema.FAILED)]
    broken = []
    for coord in grid:  # the coordinates: metadata and values
        arr, why = _open_array(gpath, coord)
        if arr is None:
            broken.append(coord)
            problems.append(f"coordinate '{coord}' {why}")
            continue
        try:
            arr[...]
        except Exception as err:  # noqa: BLE001
            broken.append(coord)
            problems.append(f"coordinate '{coord}': {_chunk_problem(err)}")
    if tuple(done_arr.shape) != shape:
        raise StoreError(f"{where}: array 'done' has shape {done_arr.shape}, the grid {shape}")
    cells: dict[tuple[int, ...], list[str]] = {}
    done, bad = _read(done_arr, lambda: list(np.ndindex(*shape)))
    for idx, problem in bad.items():
        cells.setdefault(idx, []).append(f"done flag {problem}")
    done = done.astype(bool)
    done_cells = [tuple(int(i) for i in idx) for idx in zip(*np.nonzero(done))]
    failed_arr, _ = _open_array(gpath, schema.FAILED)
    failed = np.zeros(shape, dtype=bool)
    if failed_arr is not None:  # a failed cell (its computation raised) holds fill values only
        failed, bad = _read(failed_arr, done_cells)
        for idx, problem in bad.items():
            cells.setdefault(idx, []).append(f"failed flag {problem}")
        failed = failed.astype(bool) & done
    valued_mask = done & ~failed
    valued = [tuple(int(i) for i in idx) for idx in zip(*np.nonzero(valued_mask))]
    at = np.argwhere(valued_mask)  # (cells, dims): the checks below run on arrays, not cell by cell (issue 33)
    unchecked = []
    for name in variables:
        arr, why = _open_array(gpath, name)
        if arr is None:
            broken.append(name)
            problems.append(f"variable {name} {why}: its values in every done cell are lost")
            for idx in valued:
                cells.setdefault(idx, []).append(f"variable {name} lost")
            continue
        if isinstance(decl, dict) and name in decl:  # the attributes readers act on, against the declaration
            problems += _attribute_problems(name, arr.attrs, schema.acted_on(decl[name]))
        found: dict[tuple, str] = {}  # cell -> this variable's problem
        if _checksummed(arr):  # every chunk of a done cell exists and its checksum matches
            extra = (0,) * (arr.ndim - len(shape))
            apath, grid_chunks = str(gpath / name), np.asarray(arr.chunks[:len(shape)])
            # a chunk holds a block of cells (storage/blocks.py): each chunk of a valued cell read once
            n_chunks = tuple(-(-np.asarray(shape) // grid_chunks))
            flat, inverse = np.unique(np.ravel_multi_index(tuple((at // grid_chunks).T), n_chunks), return_inverse=True)
            problem = [_raw_check(os.path.join(apath, arr.metadata.encode_chunk_key(
                tuple(int(k) for k in np.unravel_index(key, n_chunks)) + extra))) for key in flat]
            for row in np.nonzero(np.asarray([bool(p) for p in problem], dtype=bool)[inverse])[0]:
                found[valued[row]] = problem[inverse[row]]
        else:
            unchecked.append(name)
        if arr.attrs.get(schema.FINITE) or name in unchecked:  # decode: finite values, codec faults
            values, bad = _read(arr, lambda: [idx for idx in valued if idx not in found])
            found.update(bad)
            if arr.attrs.get(schema.FINITE):
                vals = values.reshape(shape + (-1,))
                ok = np.isfinite(vals) if vals.dtype.kind == "f" else vals != schema.fill_value(vals.dtype)
                for idx in map(tuple, np.argwhere(valued_mask & ~ok.all(-1)).tolist()):
                    if idx not in found:
                        found[idx] = (f"not finite ({vals[idx].ravel()[0]})" if vals.dtype.kind == "f"
                                      else "missing (reads the fill value)")
        for idx, problem in found.items():
            cells.setdefault(idx, []).append(f"variable {name} {problem}")
    harr, _ = _open_array(gpath, schema.CELL_HASH)
    if hashes and harr is not None and not broken:  # values edited after they were stored (issue 29 item 4)
        for idx in _edited(gpath, harr, variables, [i for i in valued if i not in cells] if cells else valued, shape):
            cells.setdefault(idx, []).append("values differ from the cell_hash stored with them (edited since)")
    try:  # an attribute readers act on (storage/nets.py): named like a damaged chunk (no cell's values are hit)
        from storage.nets import read_nets_arrays

        read_nets_arrays(zarr.open_group(str(gpath), mode="r", zarr_format=3))
    except ValueError as err:
        problems.append(f"attribute {schema.NETS_ARRAYS} {err}: readers of this group's nets refuse it; "
                        "`kktlab run` on its config restores it from the declaration")
    if unchecked:
        notes.append(f"no checksums on {len(unchecked)} arrays (store made before kktlab wrote crc32c): "
                     "flipped bytes and missing all-NaN chunks there cannot be detected")
    return Report(group=group, experiment=ident.get("experiment", "?"), total=int(np.prod(shape)),
                  sound=sum(1 for idx in done_cells if idx not in cells), cells=cells, names=names,
                  broken_arrays=broken, problems=problems, notes=notes)


def cells_damage(path: str | pathlib.Path, group: str, indices: list[tuple[int, ...]]) -> dict[tuple[int, ...], str]:
    """What `kktlab verify` would name in each of the done cells ``indices`` of ``group``, reading only
    their chunks (a reader's check of the upstream cells it is about to use, storage/nets.py): a
    variable lost, a chunk missing or whose checksum does not match, a value not finite where declared
    finite, values that no longer hash to the cell's ``cell_hash`` (edited since they were stored).
    Returns the first problem of each damaged cell; a group made before ``kktlab_variables`` is
    checked against the arrays it has."""
    from storage.hashing import content_hash

    gpath = pathlib.Path(path) / group
    cells = sorted({tuple(int(i) for i in idx) for idx in indices})
    if not cells:
        return {}
    g = zarr.open_group(str(gpath), mode="r", zarr_format=3)
    variables = [v for v in (g.attrs.get(schema.VARIABLES) or sorted(n for n, _ in g.arrays()))
                 if v not in (schema.DONE, schema.FAILED) and v not in set(g[schema.DONE].metadata.dimension_names)]
    found: dict[tuple[int, ...], str] = {}
    values: dict[str, dict[tuple[int, ...], np.ndarray]] = {}
    for name in variables:
        arr, why = _open_array(gpath, name)
        if arr is None:
            found.update({c: f"variable {name} {why}" for c in cells if c not in found})
            continue
        got = values[name] = {}
        chunks, extra = arr.chunks[:len(cells[0])], (0,) * (arr.ndim - len(cells[0]))
        by_chunk: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
        for c in cells:
            by_chunk.setdefault(tuple(i // k for i, k in zip(c, chunks)), []).append(c)
        for key, members in by_chunk.items():  # each chunk read once: a block of cells (storage/blocks.py)
            problem = _raw_check(os.path.join(str(gpath / name), arr.metadata.encode_chunk_key(key + extra))) \
                if _checksummed(arr) else ""
            start = tuple(k * s for k, s in zip(key, chunks))
            if not problem:
                try:
                    block = np.asarray(arr[tuple(slice(a, a + s) for a, s in zip(start, chunks))])
                except Exception as err:  # noqa: BLE001 - a chunk that does not decode
                    problem = _chunk_problem(err)
            for c in members:
                if problem:
                    found.setdefault(c, f"variable {name} {problem}")
                    continue
                got[c] = block[tuple(i - a for i, a in zip(c, start))]
                v = got[c]
                if arr.attrs.get(schema.FINITE) and not (np.isfinite(v).all() if v.dtype.kind == "f"
                                                         else (v != schema.fill_value(v.dtype)).all()):
                    found.setdefault(c, f"variable {name} not finite where declared finite")
    hashed = [n for n in variables if n not in schema.NOT_HASHED and n not in (schema.CELL_HASH, schema.UPSTREAM_HASH)]
    for c in cells:
        stored = values.get(schema.CELL_HASH, {}).get(c)
        if c in found or stored is None or int(stored) == schema.NO_HASH:  # no hash (older store): not judged
            continue
        if content_hash({n: values[n][c] for n in hashed}) != int(stored):
            found[c] = "values differ from the cell_hash stored with them (edited since)"
    return found
