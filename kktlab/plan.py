"""``kktlab run --dry-run CONFIG``: what a run would do, before it does anything (issue 33 item 4):
per stage the cells (and how many a store already holds), the bundles they are cut into, the files
and bytes of its store group, and the largest cell's memory. No server, cluster or store is made."""

from __future__ import annotations

import math
import pathlib
import sys

import numpy as np

ZARR_JSON = 1  # metadata file per array (and per group)


def stage_plan(cfg, store: str, up_block: tuple | None = None) -> dict:
    """The numbers of one stage (a :class:`flows.config.Config` of a chain or a single config);
    ``up_block``: the block of the stage it reads from (storage/blocks.py)."""
    from flows.bundles import block_for, make_bundles, memory_budget
    from storage import schema

    exp, n = cfg.exp, cfg.n_cells
    extra = cfg.extra_sizes()
    own = cfg.cells()
    items = [((i,), c) for i, c in enumerate(own)]
    budget = memory_budget(cfg.runner["device"], cfg.runner["workers"])
    per_upstream = len(make_bundles(exp, items, cfg.runner["bundle_size"], memory_budget=budget,
                                    workers=cfg.runner["workers"]))
    ups = n // max(len(own), 1)
    block = block_for(cfg, up_block)  # a new group's chunk of cells (storage/blocks.py)
    ds = schema.template(exp, cfg.store_grid, extra, block)  # lazy: what the store is made from
    files = ZARR_JSON + sum(ZARR_JSON + math.prod(math.ceil(s / c) for s, c in zip(var.shape, _chunks(var)))
                            for var in ds.variables.values())
    nbytes = sum(var.size * var.dtype.itemsize for var in ds.data_vars.values())
    largest = max(own, key=exp.memory) if own else {}
    held = _done(store, cfg.name)
    return {"stage": cfg.name, "experiment": exp.name, "cells": n, "done": held,
            "bundles": per_upstream * ups,  # a reading stage: its own cells' bundles per upstream cell
            "files": files, "bytes": nbytes, "block": list(block), "largest_cell_bytes": exp.memory(largest) if own else 0.0,
            "largest_cell": {k: largest[k] for k in exp.memory_fields if k in largest}, "checksum": schema.CHECKSUM}


def _chunks(var) -> tuple[int, ...]:
    """The Zarr chunks of a template variable (a coordinate: one chunk)."""
    return tuple(var.encoding.get("chunks") or var.shape)


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
        rows, by_name = [], {}
        for stage in cfg.stages:
            rows.append(stage_plan(stage, store, by_name.get(stage.source)))
            by_name[stage.name] = tuple(rows[-1]["block"])
        print(f"[dry run] {cfg.name} -> {store} (nothing is started or written)", file=out)
        for r in rows:
            held = "new group" if r["done"] is None else f"{r['done']:,} done already"
            fields = ", ".join(f"{k}={v}" for k, v in r["largest_cell"].items())
            print(f"  {r['stage']} ({r['experiment']}): {r['cells']:,} cells ({held}), ~{r['bundles']:,} bundles, "
                  f"{r['files']:,} files (a chunk per {math.prod(r['block']):,} cells), {_size(r['bytes'])} uncompressed; largest cell "
                  f"{_size(r['largest_cell_bytes']) if r['largest_cell_bytes'] else 'unknown'}"
                  + (f" ({fields})" if fields else ""), file=out)
        print(f"  store total: {sum(r['files'] for r in rows):,} files, "
              f"{_size(sum(r['bytes'] for r in rows))} uncompressed", file=out)
