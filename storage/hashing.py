"""The content hash of a cell's stored values (``cell_hash``: storage/stale.py, storage/verify.py,
flows/result_cache.py): sha256 over (name, dtype, shape, bytes) of each value as stored (padded,
cast), in name order, without timings (``schema.NOT_HASHED``) and hashes; its first 63 bits, so
never the fill -1. A deterministic recomputation gets the same hash; any changed value, another.
:func:`content_hashes` computes the same hash for many cells at once (one row of bytes per cell)."""

from __future__ import annotations

import hashlib

import numpy as np

from storage import schema


def _hashed(name: str) -> bool:
    return name not in schema.NOT_HASHED and name not in (schema.CELL_HASH, schema.UPSTREAM_HASH)


def content_hash(values: dict[str, np.ndarray]) -> int:
    """The hash of one cell's ``values`` (name -> its value as stored)."""
    h = hashlib.sha256()
    for name in sorted(values):
        if not _hashed(name):
            continue
        v = np.ascontiguousarray(values[name])
        h.update(f"{name}\0{v.dtype.str}\0{v.shape}\0".encode())
        h.update(v.tobytes())
    return int.from_bytes(h.digest()[:8], "little") & (2**63 - 1)


def content_hashes(values: dict[str, np.ndarray]) -> np.ndarray:
    """:func:`content_hash` of each of n cells: ``values`` name -> array of shape (n, *the cell's
    value shape). The byte stream of every cell is laid out as one row of a matrix (each name's
    header, then its bytes), then hashed row by row: about 100x faster than cell by cell."""
    parts = []
    n = None
    for name in sorted(values):
        if not _hashed(name):
            continue
        v = np.ascontiguousarray(values[name])
        n = v.shape[0]
        shape = v.shape[1:] or (1,)  # as content_hash sees a scalar: np.ascontiguousarray gives ndim >= 1
        header = np.frombuffer(f"{name}\0{v.dtype.str}\0{shape}\0".encode(), dtype=np.uint8)
        parts += [np.broadcast_to(header, (n, header.size)), v.reshape(n, -1).view(np.uint8).reshape(n, -1)]
    if n is None:
        return np.full(0, 0, dtype=np.int64)
    rows = np.ascontiguousarray(np.concatenate(parts, axis=1))
    return np.asarray([int.from_bytes(hashlib.sha256(r).digest()[:8], "little") & (2**63 - 1) for r in rows],
                      dtype=np.int64)
