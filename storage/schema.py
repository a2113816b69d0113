"""Grid -> dims/coords; variables with units and description; one chunk per block of cells.

Every grid axis becomes a dim with its values as coords. Each variable has the grid dims
followed by its own extra dims (e.g. ``sample``); its chunks are a block of cells along the grid
dims (storage/blocks.py: cells a bundle runs together; one cell in stores made before blocks)
and whole along the extra dims, so a chunk's cells are written by one bundle and two writers
never share one.
A boolean ``done`` variable marks finished cells, and ``failed`` the done cells whose computation
raised (their variables keep the fill value; the error text is in the group attribute
``kktlab_failures``).

Every chunk (coordinates included) ends in a crc32c checksum, so a flipped byte or a garbage chunk
reads as an error instead of a wrong number (storage/verify.py); the group attribute
``kktlab_variables`` lists the variables a complete cell has.

A stage that produces something for another stage (``Experiment.produces``) has ``cell_hash``, a
stage that reads one (``Experiment.reads``) ``upstream_hash`` (int64, -1: none): stale detection,
storage/stale.py.

The group attribute ``kktlab_nets_arrays`` (what a producer keeps for readers beside the nets,
storage/nets.py) is written with its crc32c (``kktlab_nets_arrays_crc32c``): a reader acts on it,
so an edit is damage that `kktlab verify` names, like a chunk's.
"""

from __future__ import annotations

import json
import math
import uuid

import google_crc32c
import numpy as np
import xarray as xr
from zarr.codecs import Crc32cCodec, ZstdCodec

from core.declare import Experiment
from storage import blocks

DONE = "done"
FAILED = "failed"  # the cell's computation raised; its error text is in the group attr FAILURES
FAILURES = "kktlab_failures"  # a JSON object, label -> error text (a dict in stores made before issue 40)
DAMAGED = "damaged"  # in memory only (storage.query.damaged): a done cell `kktlab verify` names as damaged
STATUS = "status"  # the variable whose ``ok_values`` attribute says which cells are usable
FINITE = "must_be_finite"  # array attribute: a done cell's value is finite (ints: not the fill -1)
VARIABLES = "kktlab_variables"  # group attribute: the variable names, ``done`` included
PAD = "pad_value"  # array attribute: what is stored past a cell's true size along its extra dims
CHECKSUM = "crc32c"  # the codec that ends every chunk written from this template
CELL_HASH = "cell_hash"  # every cell: content hash of its stored values (storage/stale.py, flows/result_cache.py)
UPSTREAM_HASH = "upstream_hash"  # a reading stage's cell: the cell_hash of the upstream cell it read
NO_HASH = -1  # the fill of both: no hash recorded (cells of stores made before hashes)
FINISHED = "cell_finished"  # every cell: when its values were written (UTC, CF time: a netCDF tool reads a date)
HOST = "cell_host"  # every cell: the machine that wrote its values (its host name; "": not recorded)
HOST_CHARS = 64  # a host name longer than this is cut (RFC 1123 labels are at most 63 characters)
NOT_HASHED = ("wall_s", FINISHED, HOST)  # timings / places differ on every run and change nothing a reader reads
# what a reading cell's failure says of an upstream cell unusable then: "upstream cell (<label>) <why>" (written by
# storage/nets.py, read back by storage/stale.py: such a cell is stale once that upstream cell is usable again)
UPSTREAM_NOT_DONE, UPSTREAM_FAILED, UPSTREAM_DAMAGED = "is not done", "failed", "is damaged"
NETS_ARRAYS = "kktlab_nets_arrays"  # group attribute (JSON): array name -> own dims a producer keeps for readers
NETS_ARRAYS_CRC = "kktlab_nets_arrays_crc32c"  # group attribute: the crc32c of NETS_ARRAYS as written
CONVENTIONS = "CF-1.10"
EPOCH = "seconds since 1970-01-01 00:00:00 UTC"
# Units a declaration may use that UDUNITS cannot parse: what is stored instead (dimensionless "1"),
# and what the number is, appended to the description (a netCDF / CF tool reads every unit).
UNITS = {
    "l2 norm": ("1", "a Euclidean (l2) norm of dimensionless vectors"),
    "log(volume)": ("1", "a natural logarithm of a volume"),
    "log(probability)": ("1", "a natural logarithm of a probability"),
    "log10": ("1", "a base-10 logarithm"),
    "log": ("1", "a natural logarithm"),
    "epoch": ("1", "a count of epochs"),
    "step": ("1", "a count of steps"),
}


def failures(attrs) -> dict[str, str]:
    """The group's failures attribute (:data:`FAILURES`) as a dict: JSON text (netCDF has no mapping
    attribute), or the mapping of a store made before."""
    raw = attrs.get(FAILURES) or {}
    if isinstance(raw, str):
        import json

        try:
            raw = json.loads(raw)
        except ValueError:
            return {"?": f"unreadable {FAILURES} attribute: {raw[:200]}"}
    return dict(raw) if isinstance(raw, dict) else {}


def crc32c(text: str) -> int:
    return int(google_crc32c.value(text.encode()))


def nets_attrs(declared: dict[str, tuple[str, ...]]) -> dict:
    """The group attributes that hand a producer's declared ``nets_arrays`` to its readers: the JSON
    mapping and its crc32c (storage/nets.py checks both before a reader acts on them)."""
    text = json.dumps({k: list(v) for k, v in declared.items()}, sort_keys=True)
    return {NETS_ARRAYS: text, NETS_ARRAYS_CRC: crc32c(text)}


def coord_values(values: list) -> np.ndarray:
    arr = np.asarray(values)
    if arr.dtype.kind in "OU":
        arr = arr.astype(str)
    return arr


def fill_value(dtype: np.dtype):
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return np.nan
    if dtype.kind == "b":
        return False
    if dtype.kind in "iu":
        return -1 if dtype.kind == "i" else 0
    if dtype.kind == "U":  # cell_host
        return ""
    raise TypeError(f"unsupported variable dtype {dtype}")


def cf_units(units: str, description: str) -> tuple[str, str]:
    """A declaration's units and description as stored: UDUNITS-parsable units, the description
    saying what a dimensionless stand-in (:data:`UNITS`) holds."""
    if units in UNITS:
        cf, what = UNITS[units]
        return cf, f"{description} ({what}; dimensionless)"
    return units, description


def flags(var) -> dict:
    """CF ``flag_values`` / ``flag_meanings`` of a status variable (its declared labels) or a 0/1 flag
    (an int8 variable declared "1 if ..."); {} for any other."""
    if var.labels:
        return {"flag_values": [int(v) for v, _ in var.labels],
                "flag_meanings": " ".join(str(name).replace(" ", "_") for _, name in var.labels)}
    if np.dtype(var.dtype).kind in "iu" and var.description.startswith("1 if "):
        return {"flag_values": [0, 1], "flag_meanings": "false true"}
    return {}


def _filled(constructor, shape: tuple[int, ...], *fill, dtype=None):
    """``constructor`` (``dask.array.full`` / ``zeros``) of one chunk, named: unnamed, dask names it by
    tokenizing its arguments, which cloudpickles a function by value and scans ``sys.modules`` once per
    module it refers to: 5 ms an array in a process with 3,600 modules loaded, 0.4 ms named (measured here)."""
    return constructor(shape, *fill, dtype=dtype, chunks=shape, name=f"kktlab-fill-{uuid.uuid4().hex}")


def template(exp: Experiment, grid: dict[str, list], extra_sizes: dict[str, int],
             block: tuple[int, ...] | None = None, params: dict | None = None) -> xr.Dataset:
    """The empty (lazy, fill-valued) dataset a store is created from; ``block``: the cells of a
    chunk along the grid dims (storage/blocks.py; default one cell); ``params``: the fixed
    parameters, for descriptions that depend on them (``Experiment.describe``)."""
    described = exp.describe(dict(params or {}), grid)
    import dask.array as da  # here, not at the top: the reading commands never build a template (~1.5 s)

    dims = tuple(grid)
    shape = tuple(len(v) for v in grid.values())
    block = tuple(block) if block is not None else (1,) * len(dims)
    data_vars = {}
    for name, var in exp.variables.items():
        if any(extra_sizes[x] == 0 for x in var.dims):  # an opt-in variable switched off (e.g. train's
            continue  # log_step trajectory with log_points 0): not in the group, the layout is as without it
        vdims = dims + var.dims
        vshape = shape + tuple(extra_sizes[x] for x in var.dims)
        dt = np.dtype(var.dtype)
        cell_bytes = dt.itemsize * math.prod(extra_sizes[x] for x in var.dims)
        chunks = blocks.array_chunks(block, cell_bytes) + tuple(extra_sizes[x] for x in var.dims)
        # one dask chunk per variable (a graph of a task per variable, not per cell: a 10^5-cell grid is
        # created in seconds, issue 33); the Zarr chunks, one per cell, are set by ``encoding``
        arr = _filled(da.full, vshape, fill_value(dt), dtype=dt)
        units, description = cf_units(var.units, described.get(name, var.description))
        attrs = {"long_name": long_name(description), "units": units, "description": description, **flags(var)}
        attrs.update(acted_on(var))
        data_vars[name] = xr.Variable(vdims, arr, attrs=attrs, encoding={"chunks": chunks})
    cell = {"chunks": block}
    data_vars[DONE] = xr.Variable(
        dims, _filled(da.zeros, shape, dtype=bool), encoding=cell,
        attrs={"units": "1", "description": "True once every variable of the cell is written",
               "flag_values": [0, 1], "flag_meanings": "pending done"},
    )
    data_vars[FAILED] = xr.Variable(
        dims, _filled(da.zeros, shape, dtype=bool), encoding=cell,
        attrs={"units": "1", "description": "True if computing the cell raised (group attr kktlab_failures "
                                            "has the error); its variables hold the fill value",
               "flag_values": [0, 1], "flag_meanings": "not_failed failed"},
    )
    data_vars[FINISHED] = xr.Variable(
        dims, _filled(da.full, shape, np.nan), encoding=cell,
        attrs={"units": EPOCH, "calendar": "standard", "standard_name": "time",
               "description": "when the cell's values were written (UTC; NaN: not recorded)"})
    data_vars[HOST] = xr.Variable(
        dims, _filled(da.full, shape, "", dtype=f"<U{HOST_CHARS}"), encoding=cell,
        attrs={"description": "the host name of the machine that wrote the cell's values (empty: not recorded)"})
    hashes = {CELL_HASH: (True, "sha256 of the cell's stored values but timings (first 63 bits; -1: none "
                                "recorded), compared with a reading stage's upstream_hash and a worker's receipt"),
              UPSTREAM_HASH: (bool(exp.reads), "cell_hash of the upstream cell this cell read (-1: none recorded)")}
    for name, (wanted, description) in hashes.items():
        if wanted:
            data_vars[name] = xr.Variable(dims, _filled(da.full, shape, NO_HASH, dtype=np.int64),
                                          attrs={"units": "1", "description": description}, encoding=cell)
    for name, var in data_vars.items():
        var.attrs.setdefault("long_name", long_name(var.attrs["description"]))
    coords = {k: xr.Variable((k,), coord_values(v), attrs=_coord_attrs(exp, k)) for k, v in grid.items()}
    return xr.Dataset(data_vars, coords=coords, attrs={VARIABLES: sorted(data_vars), **about(exp, grid)})


ACTED_ON = ("ok_values", FINITE, PAD, "valid_min", "valid_max")  # attributes readers act on


def acted_on(var) -> dict:
    """The attributes of a variable's array that readers act on (:data:`ACTED_ON`), from its
    declaration: which statuses are usable (storage.query.usable), finiteness (storage/verify.py),
    the pad value, the domain intervals are clipped to (storage/stats.py). ``kktlab verify``
    compares a store's with these (issue 40: trust no attribute a file says without checking)."""
    attrs = {}
    if var.ok:
        attrs["ok_values"] = [int(v) for v in var.ok]
    if var.finite:
        attrs[FINITE] = 1  # an int, not a bool: netCDF has no boolean attribute (readers take either)
    if var.pad is not None:
        attrs[PAD] = float(var.pad)
    for key, bound in zip(("valid_min", "valid_max"), var.domain or (None, None)):
        if bound is not None:
            attrs[key] = float(bound)
    return attrs


def restore_acted_on(group, exp: Experiment) -> list[str]:
    """Rewrite from the declaration the :func:`acted_on` attributes of each variable of the zarr
    ``group`` (opened for writing) whose stored ones differ; the names of those rewritten."""
    out = []
    for name, var in exp.variables.items():
        if name not in group:
            continue
        arr, want = group[name], acted_on(var)
        kept = {k: v for k, v in arr.attrs.asdict().items() if k not in ACTED_ON}
        if {k: arr.attrs[k] for k in ACTED_ON if k in arr.attrs} != want:
            arr.attrs.put({**kept, **want})
            out.append(f"{name} attributes")
    return out


def long_name(description: str) -> str:
    """CF ``long_name``: the description's first clause (the whole text stays in ``description``)."""
    head = description.split(";")[0].split(" (")[0].strip()
    return head[:120] or description[:120]


def _coord_attrs(exp: Experiment, dim: str) -> dict:
    """A grid axis: its parameter's doc as ``long_name``, dimensionless ``units`` (CF "1")."""
    prm = exp.params.get(dim)
    doc = prm.doc if prm is not None and prm.doc else dim
    return {"long_name": long_name(doc), "units": "1", "description": doc}


SUMMARY = "kktlab_summary"


def about(exp: Experiment, grid: dict[str, list]) -> dict:
    """Global attributes that say what the group is, for readers without kktlab (CF's title,
    source, references, and a README)."""
    return {
        "Conventions": CONVENTIONS,
        "title": f"kktlab {exp.name}: {exp.description}",
        "source": "kktlab, experiment " + exp.name,
        "references": f"paper {exp.paper}",
        "README": (f"One cell per point of the grid {' x '.join(grid)}; variables have the grid dims first, then "
                   "their own. Use only cells with done == True and failed == False (and, where there is a "
                   "'status' variable, a status among its ok_values attribute): storage.query.usable, the mask "
                   "of kktlab's figures and tables. Each variable's description says what it holds and the "
                   "spec equation it implements; the group attribute 'config' holds the config that made it."),
        SUMMARY: list(exp.summary),  # the variables of its summary table: `kktlab show` needs no experiment import
    }


def encoding(ds: xr.Dataset) -> dict:
    checksummed = (ZstdCodec(level=0), Crc32cCodec())  # zarr's default compressor, then the checksum
    enc = {name: {"compressors": checksummed} for name in ds.coords}
    for name, var in ds.data_vars.items():
        enc[name] = {"chunks": var.encoding["chunks"], "compressors": checksummed}
        if np.dtype(var.dtype).kind in "fiu":  # unwritten chunks read as the template's fill (int: -1,
            enc[name]["fill_value"] = fill_value(var.dtype)  # not zarr's default 0 = "running")
    return enc


# Grid axes renamed by issue 40: an axis called ``method`` cannot be selected with ds.sel(method=...)
# (a keyword of xarray's Dataset.sel). A store made before still holds ``method``: its readers see the new
# name, told apart by the values (single_step's attacks are named single_step_*, unlearn's methods not).
LEGACY_DIM = "method"


def current_dim(dim: str, values) -> str:
    """The name a reader uses for a stored dim: ``dim``, or the new name of a renamed one."""
    if dim != LEGACY_DIM:
        return dim
    step = len(values) and all(str(v).startswith("single_step") for v in values)
    return "single_step_method" if step else "unlearn_method"


def current_dims(ds: xr.Dataset) -> xr.Dataset:
    """``ds`` with a renamed dim (and its coordinate) under its new name; as it was otherwise."""
    if LEGACY_DIM not in ds.dims:
        return ds
    return ds.rename({LEGACY_DIM: current_dim(LEGACY_DIM, ds[LEGACY_DIM].values)})
