"""``kktlab run --dry-run CONFIG``: what a run would do, before it does anything (issue 33 item 4):
per stage the cells (and how many a store already holds), the bundles they are cut into, the files
and bytes of its store group, and the largest cell's memory. No server, cluster or store is made."""

from __future__ import annotations

import math
import pathlib
import sys

import numpy as np

ZARR_JSON = 1  # metadata file per array (and per group)


def stage_plan(cfg, store: str) -> dict:
    """The numbers of one stage (a :class:`flows.config.Config` of a chain or a single config)."""
    from flows.bundles import make_bundles, memory_budget
    from storage import schema

    exp, n = cfg.exp, cfg.n_cells
    extra = cfg.extra_sizes()
    own = cfg.cells()
    items = [((i,), c) for i, c in enumerate(own)]
    budget = memory_budget(cfg.runner["device"], cfg.runner["workers"])
    per_upstream = len(make_bundles(exp, items, cfg.runner["bundle_size"], memory_budget=budget,
                                    workers=cfg.runner["workers"]))
    ups = n // max(len(own), 1)
    files, nbytes = len(cfg.store_grid) * ZARR_JSON + ZARR_JSON, 0
    for name, var in exp.variables.items():
        if any(extra.get(d, 1) == 0 for d in var.dims):
            continue
        cell_bytes = np.dtype(var.dtype).itemsize * math.prod(extra.get(d, 1) for d in var.dims)
        files += n + ZARR_JSON
        nbytes += n * cell_bytes
    hashes = 1 + bool(exp.reads)  # done, failed, cell_hash (, upstream_hash)
    files += (2 + hashes) * (n + ZARR_JSON)
    nbytes += n * (2 + 8 * hashes)
    largest = max(own, key=exp.memory) if own else {}
    held = _done(store, cfg.name)
    return {"stage": cfg.name, "experiment": exp.name, "cells": n, "done": held,
            "bundles": per_upstream * ups,  # a reading stage: its own cells' bundles per upstream cell
            "files": files, "bytes": nbytes, "largest_cell_bytes": exp.memory(largest) if own else 0.0,
            "largest_cell": {k: largest[k] for k in exp.memory_fields if k in largest}, "checksum": schema.CHECKSUM}


def _done(store: str, group: str) -> int | None:
    """Cells ``store`` already holds for ``group`` (None: no such group yet)."""
    from storage.query import groups, status

    if not (pathlib.Path(store) / "zarr.json").exists() or group not in groups(store):
        return None
    return next((s["done"] for s in status(store) if s["group"] == group), None)


def _size(b: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if b < 1024 or unit == "TB":
            return f"{b:,.0f} {unit}" if unit == "B" else f"{b:,.1f} {unit}"
        b /= 1024
    return ""


def print_plan(cfgs, stores, out=sys.stdout) -> None:
    """One block per config: a line per stage and the store's totals."""
    for cfg, store in zip(cfgs, stores):
        rows = [stage_plan(stage, store) for stage in cfg.stages]
        print(f"[dry run] {cfg.name} -> {store} (nothing is started or written)", file=out)
        for r in rows:
            held = "new group" if r["done"] is None else f"{r['done']:,} done already"
            fields = ", ".join(f"{k}={v}" for k, v in r["largest_cell"].items())
            print(f"  {r['stage']} ({r['experiment']}): {r['cells']:,} cells ({held}), ~{r['bundles']:,} bundles, "
                  f"{r['files']:,} files, {_size(r['bytes'])} uncompressed; largest cell "
                  f"{_size(r['largest_cell_bytes']) if r['largest_cell_bytes'] else 'unknown'}"
                  + (f" ({fields})" if fields else ""), file=out)
        print(f"  store total: {sum(r['files'] for r in rows):,} files, "
              f"{_size(sum(r['bytes'] for r in rows))} uncompressed", file=out)
