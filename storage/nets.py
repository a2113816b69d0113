"""Trained networks as stored results: read the nets of a ``train`` stage back as stacked tensors.

The group stores per cell W (hidden, feature), b, v (hidden), X (sample, feature), y (sample),
float64 and zero-padded to the group's largest sizes, with the true sizes beside
(``d_used``, ``m_used``, ``width_used``) and whether the nets were stored (``nets_stored``;
``store_nets: false`` stores none). :func:`load_nets_at` is what a downstream stage's worker
reads; :func:`storage.query.load_nets` selects cells by their coordinates. What a producer keeps
out of the store (training rows as indices into a data file, W0 as its seed) comes back through the
producer's ``rebuild`` (core.declare.Experiment.rebuild), which the caller passes: storage never
imports the experiments.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
from typing import Callable

import numpy as np
import zarr

from core.errors import StoreError, UserError
from storage import schema
from storage.verify import cells_damage

ARRAYS = ("W", "b", "v", "X", "y")
# The arrays beyond W, b, v, X, y a producer stores or rebuilds for readers, name -> own dims, are
# declared by the producing experiment (core.declare.Experiment.nets_arrays) and written into its
# group as ``kktlab_nets_arrays``; loaded into ``Nets.extra``, cut along hidden/feature like W.
# Groups made before that attribute existed name theirs here (what kktlab's producers kept then).
LEGACY_NETS_ARRAYS = {"W0": ("hidden", "feature"), "b0": ("hidden",), "X_test": ("test_sample", "feature"),
                      "y_test": ("test_sample",), "n_test_used": (), "R_train": (), "V_train": (),
                      "forgotten": ("sample",)}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")  # an array or dim name: never a path (``../nets/W``)


def read_nets_arrays(g: zarr.Group) -> dict[str, tuple[str, ...]] | None:
    """The ``kktlab_nets_arrays`` attribute of group ``g``, checked before anyone acts on it: valid
    JSON, an object of plain array names -> lists of dim names, each array the group holds having
    those own dims, and the crc32c written with it matching (an edit since is damage). None for a
    group made before the attribute; ValueError saying what is wrong otherwise."""
    attrs = g.attrs
    if schema.NETS_ARRAYS not in attrs:
        if schema.NETS_ARRAYS_CRC in attrs:
            raise ValueError(f"is missing (its checksum {schema.NETS_ARRAYS_CRC} is there)")
        return None
    text = attrs[schema.NETS_ARRAYS]
    if not isinstance(text, str):
        raise ValueError(f"is a {type(text).__name__}, not a JSON text")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"is not valid JSON ({err.msg} at character {err.pos})") from None
    if not isinstance(doc, dict):
        raise ValueError("is not a JSON object of array name -> its own dims")
    try:
        grid = len(g[schema.DONE].metadata.dimension_names)
    except Exception:  # noqa: BLE001 - done lost: storage/verify.py says so (no dims to compare)
        grid = None
    for name, dims in doc.items():
        if not _NAME.match(name):
            raise ValueError(f"names {name!r}, not an array of the group")
        if not isinstance(dims, list) or not all(isinstance(d, str) and _NAME.match(d) for d in dims):
            raise ValueError(f"gives {name!r} the dims {dims!r}, not a list of dim names")
        try:
            own = tuple(g[name].metadata.dimension_names[grid:]) if grid is not None and name in g else tuple(dims)
        except Exception:  # noqa: BLE001 - the array's metadata is damaged: storage/verify.py names that
            own = tuple(dims)
        if own != tuple(dims):
            raise ValueError(f"gives {name!r} the dims {dims}, the array has {list(own)}")
    crc = attrs.get(schema.NETS_ARRAYS_CRC)
    if crc is not None and (not isinstance(crc, int) or crc != schema.crc32c(text)):
        raise ValueError(f"does not match its checksum {schema.NETS_ARRAYS_CRC} (edited since it was written)")
    return {k: tuple(v) for k, v in doc.items()}


def nets_arrays(g: zarr.Group, where: str = "") -> dict[str, tuple[str, ...]]:
    """What the producer of group ``g`` keeps for readers beside the nets: name -> own dims
    (:func:`read_nets_arrays`; :data:`LEGACY_NETS_ARRAYS` for a group made before the attribute).
    A damaged attribute raises :class:`StoreError`, one line naming it and the group (``where``)."""
    try:
        got = read_nets_arrays(g)
    except ValueError as err:
        raise StoreError(f"{where or 'group ' + repr(g.path)}: attribute {schema.NETS_ARRAYS} {err}; "
                         f"`kktlab verify` names it, `kktlab run` on its config restores it") from None
    return LEGACY_NETS_ARRAYS if got is None else got


def restore_nets_arrays(gpath: pathlib.Path, declared: dict[str, tuple[str, ...]]) -> list[str]:
    """Rewrite the attribute (and its checksum) from the producer's declaration where it is damaged
    or says otherwise (a rerun's repair, storage.store.Store.restore_arrays); [its name] if rewritten.
    A group made before the attribute keeps its legacy reading."""
    g = zarr.open_group(str(gpath), mode="r", zarr_format=3)
    if schema.NETS_ARRAYS not in g.attrs and schema.NETS_ARRAYS_CRC not in g.attrs:
        return []
    try:
        if read_nets_arrays(g) == {k: tuple(v) for k, v in declared.items()}:
            return []
    except ValueError:
        pass
    zarr.open_group(str(gpath), mode="r+", zarr_format=3).attrs.update(schema.nets_attrs(declared))
    return [schema.NETS_ARRAYS]


@dataclasses.dataclass
class Nets:
    """E stacked nets with their training sets, cut to the largest true sizes among them
    (zeros past each net's own sizes, as the bundle that trained them padded). Tensors are
    float64 on the CPU: W (E,k,d), b (E,k), v (E,k), X (E,m,d), y (E,m), mask (E,m) the real
    samples, d, m, width (E,) int64 true sizes, rng_state (E,n) uint8 the minibatch generator
    after training. ``cells``: each net's cell as it was run (its stage's fixed parameters and its
    grid coordinates); ``problems``: why a cell is not usable
    (not done, failed, no nets stored), '' where it is (its tensors are zeros otherwise); ``hashes``:
    each cell's ``cell_hash`` as read with its nets (the version used; -1 where none is stored)."""

    W: "torch.Tensor"  # noqa: F821
    b: "torch.Tensor"  # noqa: F821
    v: "torch.Tensor"  # noqa: F821
    X: "torch.Tensor"  # noqa: F821
    y: "torch.Tensor"  # noqa: F821
    mask: "torch.Tensor"  # noqa: F821
    d: "torch.Tensor"  # noqa: F821
    m: "torch.Tensor"  # noqa: F821
    width: "torch.Tensor"  # noqa: F821
    rng_state: "torch.Tensor"  # noqa: F821
    cells: list[dict]
    problems: list[str]
    hashes: list[int] = dataclasses.field(default_factory=list)  # each cell's cell_hash (-1: none recorded)
    # name -> (E, ...) tensor of the arrays the producer keeps for readers (nets_arrays); extra_dims: their own dims
    extra: dict = dataclasses.field(default_factory=dict)
    extra_dims: dict = dataclasses.field(default_factory=dict)
    # each net's core.declare.NetsContract (what its producer declares for its cell; flows/contracts.py)
    contracts: list = dataclasses.field(default_factory=list)
    # the nets the producer of these nets read, one per net (a reader with Experiment.reads_before: the
    # net before an unlearn stage's deletion), or None
    before: "Nets | None" = None

    def trained(self) -> "torch.Tensor":  # noqa: F821
        """(E, 3) bool: which of the blocks W, b, v each net trained (its contract; all where none is known)."""
        import torch

        from core.declare import BLOCKS

        if not self.contracts:
            return torch.ones(len(self.cells), len(BLOCKS), dtype=torch.bool)
        return torch.tensor([[b in c.trained for b in BLOCKS] for c in self.contracts], dtype=torch.bool)

    def forgotten(self) -> "torch.Tensor":  # noqa: F821
        """(E, M) bool: the training points an upstream ``unlearn`` forgot (none for trained nets)."""
        import torch

        if "forgotten" in self.extra:
            return self.extra["forgotten"][:, : self.X.shape[1]] > 0.5
        return torch.zeros(self.X.shape[:2], dtype=torch.bool)

    def select(self, idx: list[int]) -> "Nets":
        """The nets at positions ``idx``, cut again to their own largest sizes."""
        import torch

        k = max([int(self.width[i]) for i in idx if not self.problems[i]] or [1])
        d = max([int(self.d[i]) for i in idx if not self.problems[i]] or [1])
        m = max([int(self.m[i]) for i in idx if not self.problems[i]] or [1])
        t = torch.tensor(idx, dtype=torch.long)
        extra = {n: a[t][(slice(None),) + _cut(self.extra_dims[n], k, d)] for n, a in self.extra.items()}
        return Nets(self.W[t, :k, :d], self.b[t, :k], self.v[t, :k], self.X[t, :m, :d], self.y[t, :m],
                    self.mask[t, :m], self.d[t], self.m[t], self.width[t], self.rng_state[t],
                    [self.cells[i] for i in idx], [self.problems[i] for i in idx],
                    [self.hashes[i] for i in idx] if self.hashes else [], extra, dict(self.extra_dims),
                    [self.contracts[i] for i in idx] if self.contracts else [],
                    None if self.before is None else self.before.select(idx))


def _cut(names, k: int, d: int) -> tuple:
    """Slices of an extra variable's own dims: hidden to k, feature to d, the rest whole."""
    return tuple(slice(0, {"hidden": k, "feature": d}.get(n)) for n in names)


def grid_coords(g: zarr.Group) -> dict[str, np.ndarray]:
    """The grid coordinates of group ``g`` in dim order, under the names readers use (a dim renamed
    since the group was made: its new name, ``schema.current_dim``)."""
    return {schema.current_dim(d, v): v for d in g[schema.DONE].metadata.dimension_names
            for v in (np.asarray(g[d][...]),)}


def cells_as_run(g: zarr.Group, indices: list[tuple[int, ...]]) -> list[dict]:
    """The cells of group ``g`` at grid ``indices`` as they were run: the stage's fixed parameters,
    the cell's coordinates and the config case of each coordinate (``cases`` in the group's identity,
    e.g. ``{seed: 1, variant: raw}``), never rebuilt from defaults."""
    ident = json.loads(g.attrs.get("kktlab_identity") or "{}")
    coords = grid_coords(g)
    dims = list(coords)
    out = []
    for idx in indices:
        cell = dict(ident.get("params", {}), **{dim: coords[dim][i].item() for dim, i in zip(dims, idx)})
        for axis, by_value in ident.get("cases", {}).items():
            if axis in cell:
                cell.update(by_value.get(str(cell[axis]), {}))
        out.append(cell)
    return out


def source(path: str | pathlib.Path, group: str) -> tuple[str | None, int]:
    """The group ``group`` reads from (None for a first stage) and how many of its dims are that group's."""
    g = zarr.open_group(str(pathlib.Path(path) / group), mode="r", zarr_format=3)
    up = json.loads(g.attrs.get("kktlab_identity") or "{}").get("from")
    if not up:
        return None, 0
    ug = zarr.open_group(str(pathlib.Path(path) / up), mode="r", zarr_format=3)
    return up, len(ug[schema.DONE].metadata.dimension_names)


def _problem(g: zarr.Group, idx: tuple, label: str) -> str:
    if not bool(g[schema.DONE][idx]):
        return f"upstream cell ({label}) {schema.UPSTREAM_NOT_DONE}"
    if schema.FAILED in g and bool(g[schema.FAILED][idx]):
        err = schema.failures(g.attrs).get(label, "")
        return f"upstream cell ({label}) {schema.UPSTREAM_FAILED}" + (f": {err}" if err else "")
    if int(g["nets_stored"][idx]) != 1:
        return f"upstream cell ({label}) stored no nets (store_nets: false)"
    return ""


def _rebuilt(g: zarr.Group, indices, cells, labels, problems, rebuild) -> list[dict]:
    """Per cell the arrays its producer rebuilds (float64 numpy); a cell whose arrays cannot be
    rebuilt (data file missing or changed since training) gets that as its problem."""
    out = []
    for e, idx in enumerate(map(tuple, indices)):
        if problems[e]:
            out.append({})
            continue
        try:
            got = rebuild(cells[e], lambda name, idx=idx: np.asarray(g[name][idx]))
        except (UserError, OSError, ValueError, KeyError, ImportError) as err:  # e.g. a group older than its rebuild
            problems[e] = f"the data of upstream cell ({labels[e]}) cannot be rebuilt: {err}"
            got = {}
        out.append({k: np.asarray(v, dtype=np.float64) for k, v in got.items()})
    return out


def producer(path: str | pathlib.Path, group: str) -> str:
    """The experiment whose cells ``group`` holds (from its identity)."""
    g = zarr.open_group(str(pathlib.Path(path) / group), mode="r", zarr_format=3)
    return json.loads(g.attrs.get("kktlab_identity") or "{}").get("experiment", "")


def load_nets_at(path: str | pathlib.Path, group: str, indices: list[tuple[int, ...]],
                 rebuild: Callable | None = None) -> Nets:
    """The nets of the cells at grid ``indices`` of ``group`` (repeats allowed), in that order.
    ``rebuild``: the producing experiment's (core.declare.Experiment.rebuild), for the arrays it
    left out of the store (training rows kept as indices + checksum, W0 kept as its seed)."""
    import torch

    g = zarr.open_group(str(pathlib.Path(path) / group), mode="r", zarr_format=3)
    missing = [n for n in ("W", "b", "v", "d_used", "m_used", "width_used", "nets_stored", "batch_rng_state")
               if n not in g]
    if missing:
        raise StoreError(f"group '{group}' of {path} holds no nets (no {', '.join(missing)}); "
                         "nets are stored by a 'train' stage")
    if rebuild is None and "X" not in g:
        raise StoreError(f"group '{group}' of {path} keeps its training sets as indices into a data file; "
                         f"its producing experiment rebuilds them: use kktlab.load_nets (or pass rebuild=)")
    coords = grid_coords(g)
    dims = list(coords)
    coord = [{dim: coords[dim][i].item() for dim, i in zip(dims, idx)} for idx in indices]
    labels = [", ".join(f"{k}={v}" for k, v in c.items()) for c in coord]
    cells = cells_as_run(g, [tuple(i) for i in indices])  # the upstream cell as it was run, cases included
    problems = [_problem(g, tuple(idx), lab) for idx, lab in zip(indices, labels)]
    for e, idx in enumerate(map(tuple, indices)):  # rows kept as indices: only the producer resolves them
        if rebuild is None and not problems[e] and "data_index" in g and int(g["data_index"][idx + (0,)]) >= 0:
            problems[e] = (f"upstream cell ({labels[e]}) keeps its training set as indices into a data file: "
                           "load it with kktlab.load_nets")
    arrays = nets_arrays(g, f"group '{group}' of {path}")  # checked before any cell is read
    damage = cells_damage(path, group, [tuple(i) for i, p in zip(indices, problems) if not p])
    for e, idx in enumerate(map(tuple, indices)):  # never an edited or corrupt net handed on without a word
        if not problems[e] and idx in damage:
            problems[e] = (f"upstream cell ({labels[e]}) {schema.UPSTREAM_DAMAGED}: {damage[idx]}; "
                           f"`kktlab verify {path}` names it, `kktlab run` on its config recomputes it")
    rebuilt = _rebuilt(g, indices, cells, labels, problems, rebuild) if rebuild else [{} for _ in indices]
    size = {n: np.array([int(g[n][tuple(idx)]) for idx in indices], dtype=np.int64)
            for n in ("d_used", "m_used", "width_used")}
    ok = [i for i, p in enumerate(problems) if not p]
    K, D, M = (max([int(size[n][i]) for i in ok] or [1]) for n in ("width_used", "d_used", "m_used"))
    E = len(indices)
    out = {"W": np.zeros((E, K, D)), "b": np.zeros((E, K)), "v": np.zeros((E, K)),
           "X": np.zeros((E, M, D)), "y": np.zeros((E, M))}
    cut = {"W": (K, D), "b": (K,), "v": (K,), "X": (M, D), "y": (M,)}
    for e in ok:
        idx = tuple(indices[e])
        for name, shape in cut.items():
            if name in g:
                out[name][e] = g[name][idx + tuple(slice(0, s) for s in shape)]
    for e in ok:
        for name, a in rebuilt[e].items():
            if name in out:  # zero-padded past the cell's own sizes, as stored nets are
                out[name][e] = 0.0
                out[name][e][tuple(slice(0, s) for s in a.shape)] = a
    rng = np.stack([np.asarray(g["batch_rng_state"][tuple(idx)]) for idx in indices]).astype(np.uint8)
    m = torch.from_numpy(size["m_used"])
    mask = torch.arange(M)[None, :] < m[:, None]
    for e in (i for i, p in enumerate(problems) if not p):
        if not all(np.isfinite(out[n][e]).all() for n in ARRAYS):
            problems[e] = f"upstream cell ({labels[e]}) has non-finite stored nets"
    hashes = [int(g[schema.CELL_HASH][tuple(idx)]) if schema.CELL_HASH in g else schema.NO_HASH for idx in indices]
    extra, extra_dims = {}, {}
    for name in (n for n in arrays if n in g):
        own = tuple(g[name].metadata.dimension_names[len(dims):])
        cut = _cut(own, K, D)
        shape = tuple(len(range(*c.indices(s))) for c, s in zip(cut, g[name].shape[len(dims):]))
        a = np.zeros((E, *shape))
        for e in ok:
            a[e] = g[name][tuple(indices[e]) + cut]
        extra[name], extra_dims[name] = torch.from_numpy(a), own
    for name in sorted({n for r in rebuilt for n in r} & set(arrays) - set(g)):  # rebuilt, never stored
        parts = [r.get(name) for r in rebuilt]
        shape = np.max([p.shape for p in parts if p is not None], axis=0)
        a = np.zeros((E, *shape))
        for e, p in enumerate(parts):
            if p is not None and not problems[e]:
                a[e][tuple(slice(0, s) for s in p.shape)] = p
        extra[name], extra_dims[name] = torch.from_numpy(a), arrays[name]
    t = {n: torch.from_numpy(a) for n, a in out.items()}
    return Nets(t["W"], t["b"], t["v"], t["X"], t["y"], mask, torch.from_numpy(size["d_used"]), m,
                torch.from_numpy(size["width_used"]), torch.from_numpy(rng), cells, problems, hashes,
                extra, extra_dims)


def select_indices(path: str | pathlib.Path, group: str, sel: dict) -> list[tuple[int, ...]]:
    """Grid indices of the cells whose coordinates match ``sel`` (dim -> value or list of values;
    dims left out: every value), in C order."""
    import itertools

    g = zarr.open_group(str(pathlib.Path(path) / group), mode="r", zarr_format=3)
    coords = {dim: [v.item() for v in values] for dim, values in grid_coords(g).items()}
    dims = list(coords)
    unknown = sorted(set(sel) - set(dims))
    if unknown:
        raise StoreError(f"group '{group}' has no dim {unknown[0]!r}; its dims: {', '.join(dims)}")
    axes = []
    for dim, values in coords.items():
        if dim not in sel:
            axes.append(range(len(values)))
            continue
        want = sel[dim] if isinstance(sel[dim], (list, tuple)) else [sel[dim]]
        bad = [w for w in want if w not in values]
        if bad:
            raise StoreError(f"group '{group}' dim {dim!r} has no value {bad[0]!r}; it has {values}")
        axes.append([values.index(w) for w in want])
    return list(itertools.product(*axes))
