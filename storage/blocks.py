"""Blocks: the cells that share a chunk, so a store holds a few files per bundle (issue 33).

A group's grid is tiled by *blocks*: runs of cells along its trailing dims that a bundle runs
together (equal ``bundle_key`` and cost along those dims) and at most ``cells`` of them (the
runner's ``chunk_cells``, by default its ``bundle_size``). The ``done`` array's Zarr chunk is the
block; every other array's chunk along the grid dims is the block too, or, for a per-cell array
too large for one file (:data:`CHUNK_BYTES`), a part of it that divides it. So every chunk lies in
one block, and a block is written by one bundle at a time (flows/bundles.py keeps blocks whole):
two writers never share a chunk. A bundle writes each chunk it touches once
(:func:`write_points`): whole chunks are written without reading, a chunk that also holds cells of
other runs is read, updated and written back (by its one writer).

A store made before blocks has blocks of one cell; everything here works for it unchanged.
"""

from __future__ import annotations

import math

import numpy as np

CHUNK_BYTES = 8 << 20  # at most this many bytes of one array in one chunk (per-cell arrays: nets, samples)
MAX_CELLS = 4096  # at most this many cells in a block, whatever the runner asks


def choose(keys: np.ndarray, costs: np.ndarray, cells: int, within: tuple | None = None) -> tuple[int, ...]:
    """The block shape of a grid whose cells have bundle-key ids ``keys`` and costs ``costs``
    (arrays of the grid's shape): from the last dim outwards, whole dims as long as the key and the
    cost do not change along them and the block holds at most ``cells`` cells; the first dim that
    does not fit whole is cut to what fits (a ragged last block). ``within``: per dim None, or the
    size of the upstream stage's block along it (a reading stage's upstream dims): there the block
    takes a divisor of it, so that its cells read the cells of one upstream block, which one
    upstream bundle computes (flows/chain.py releases them together)."""
    shape = keys.shape
    within = within or (None,) * len(shape)
    block = [1] * len(shape)
    size = 1
    cap = max(1, min(int(cells), MAX_CELLS))
    for d in reversed(range(len(shape))):
        if size >= cap or not (_constant_along(keys, d) and _constant_along(costs, d)):
            break
        room = cap // size
        block[d] = (min(shape[d], room) if within[d] is None
                    else max(f for f in range(1, within[d] + 1) if within[d] % f == 0 and f <= room))
        size *= block[d]
        if block[d] < (shape[d] if within[d] is None else within[d]):
            break
    return tuple(block)


def _constant_along(a: np.ndarray, axis: int) -> bool:
    return a.shape[axis] < 2 or bool((np.diff(a, axis=axis) == 0).all())


def array_chunks(block: tuple[int, ...], cell_bytes: int) -> tuple[int, ...]:
    """An array's chunk along the grid dims: the block, halved (by its smallest factor) along its
    outermost dims larger than one until a chunk holds at most :data:`CHUNK_BYTES` (each part
    divides the block, so a chunk never crosses a block's edge)."""
    sub = list(block)
    d = 0
    while math.prod(sub) * cell_bytes > CHUNK_BYTES and math.prod(sub) > 1:
        while sub[d] == 1:
            d += 1
        sub[d] //= _smallest_factor(sub[d])
    return tuple(sub)


def _smallest_factor(n: int) -> int:
    return next((f for f in range(2, int(math.isqrt(n)) + 1) if n % f == 0), n)


def regions(indices: np.ndarray, chunks: tuple[int, ...], shape: tuple[int, ...]):
    """Group cell ``indices`` ((n, ndim) ints) by the chunk that holds them: yields (the chunk's
    slices along the grid dims, the positions in ``indices`` of its cells, whether they cover it)."""
    if len(indices) == 0:
        return
    n_chunks = tuple(-(-s // c) for s, c in zip(shape, chunks))
    flat = np.ravel_multi_index(tuple((np.asarray(indices) // np.asarray(chunks)).T), n_chunks)
    order = np.argsort(flat, kind="stable")  # positions grouped by chunk, in their order within each (numpy, not a loop per cell)
    starts = np.flatnonzero(np.r_[True, flat[order][1:] != flat[order][:-1]])
    for group in np.split(order, starts[1:]):
        pos = group.tolist()
        key = np.unravel_index(int(flat[group[0]]), n_chunks)
        sl = tuple(slice(int(k) * c, min((int(k) + 1) * c, s)) for k, c, s in zip(key, chunks, shape))
        whole = len(pos) == math.prod(x.stop - x.start for x in sl)
        yield sl, pos, whole


def write_points(arr, indices: np.ndarray, values: np.ndarray, fill) -> None:
    """Write ``values[i]`` (each a cell's value, shaped like the array past the grid dims) at grid
    index ``indices[i]`` of the Zarr array ``arr``: one write per chunk touched, a chunk the cells
    cover whole without reading it, another read first so its other cells keep their values."""
    ndim = indices.shape[1]
    grid_chunks, shape = tuple(arr.chunks[:ndim]), tuple(arr.shape[:ndim])
    extra = tuple(arr.shape[ndim:])
    for sl, pos, whole in regions(indices, grid_chunks, shape):
        local = tuple((indices[pos] - [s.start for s in sl]).T)
        if whole:
            block = np.full(tuple(s.stop - s.start for s in sl) + extra, fill, dtype=arr.dtype)
        else:
            block = np.asarray(arr[sl])
        block[local] = values[pos]
        arr[sl] = block


def read_points(arr, indices: np.ndarray) -> np.ndarray:
    """The values of cells ``indices`` ((n, ndim) ints) of the Zarr array ``arr``: one read per
    chunk touched."""
    ndim = indices.shape[1]
    out = np.empty((len(indices),) + tuple(arr.shape[ndim:]), dtype=arr.dtype)
    for sl, pos, _ in regions(indices, tuple(arr.chunks[:ndim]), tuple(arr.shape[:ndim])):
        out[pos] = np.asarray(arr[sl])[tuple((indices[pos] - [s.start for s in sl]).T)]
    return out


def points(indices, ndim: int) -> np.ndarray:
    """Cell indices as an (n, ndim) int array."""
    return np.asarray([tuple(int(i) for i in idx) for idx in indices], dtype=np.int64).reshape(-1, ndim)


def padded(arr, value, ndim: int) -> np.ndarray:
    """A cell's value as stored in ``arr``: cast, and padded along the extra dims (with the
    array's ``pad_value`` or fill; an empty value is all fill)."""
    from storage import schema  # (schema imports this module)

    extra = arr.shape[ndim:]
    v = np.asarray(value, dtype=arr.dtype)
    if not extra:
        return v
    pad = arr.attrs.get(schema.PAD) if v.size else None
    full = np.full(extra, schema.fill_value(arr.dtype) if pad is None else pad, dtype=arr.dtype)
    full[tuple(slice(0, s) for s in v.shape)] = v
    return full
