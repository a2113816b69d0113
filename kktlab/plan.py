"""``kktlab run --dry-run CONFIG``: what a run would do, before it does anything (issue 33 item 4):
per stage the cells (and how many a store already holds), the bundles they are cut into, the files
and bytes of its store group, and the largest cell's memory. No server, cluster or store is made."""

from __future__ import annotations

import math
import pathlib
import sys

import numpy as np

ZARR_JSON = 1  # metadata file per array (and per group)


def stage_plan(cfg, store: str, up_block: tuple | None = None, up_bundles: list[list] | None = None,
               up_cfg=None) -> dict:
    """The numbers of one stage (a :class:`flows.config.Config` of a chain or a single config);
    ``up_block``: the block of the stage it reads from (storage/blocks.py); ``up_bundles``: that
    stage's bundles, as the index tuples of their cells (``bundle_cells`` of its plan); ``up_cfg``
    that stage's config."""
    from flows.bundles import block_for, make_bundles, memory_budget, with_upstream_values
    from storage import schema

    exp, n = cfg.exp, cfg.n_cells
    extra = cfg.extra_sizes()
    own = cfg.cells()
    budget = memory_budget(cfg.runner["device"], cfg.runner["workers"])
    block = block_for(cfg, up_block)  # a new group's chunk of cells (storage/blocks.py)
    own_idx = list(np.ndindex(*[len(v) for v in cfg.grid.values()]))

    def cut(ups: list[tuple]) -> list[list]:  # the bundles of this stage's cells that read ``ups``, as indices
        items = with_upstream_values(exp, [(u + i, c) for u in ups for i, c in zip(own_idx, own)], up_cfg)
        return [[idx for idx, _ in b] for b in make_bundles(exp, items, cfg.runner["bundle_size"], memory_budget=budget,
                                                           workers=cfg.runner["workers"], block=block)]

    # as the run cuts them (flows/chain.py): a reading stage's cells per upstream bundle, as each is stored and
    # releases them (``_release``), in whole blocks; not per upstream cell
    bundles = cut([()]) if up_bundles is None else [b for ups in up_bundles for b in cut([tuple(u) for u in ups])]
    ds = schema.template(exp, cfg.store_grid, extra, block)  # lazy: what the store is made from
    files = ZARR_JSON + sum(ZARR_JSON + math.prod(math.ceil(s / c) for s, c in zip(var.shape, _chunks(var)))
                            for var in ds.variables.values())
    nbytes = sum(var.size * var.dtype.itemsize for var in ds.data_vars.values())
    largest = max(own, key=exp.memory) if own else {}
    held = _done(store, cfg.name)
    return {"stage": cfg.name, "experiment": exp.name, "cells": n, "done": held,
            "bundles": len(bundles), "bundle_cells": bundles,
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


def print_plan(cfgs, stores, out=None) -> None:
    """One block per config: a line per stage and the store's totals, to ``out`` (the standard output
    at the time of the call, not of the import: a redirected one too)."""
    out = out or sys.stdout
    for cfg, store in zip(cfgs, stores):
        rows, by_name = [], {}
        for stage in cfg.stages:
            up = by_name.get(stage.source)
            rows.append(stage_plan(stage, store, *(up or (None, None, None))[:3]))
            # a reader declares no memory of its own: it holds at least the largest net it reads (its upstream's
            # largest cell, or what that one reads in turn)
            rows[-1]["reads_bytes"] = (up[3]["largest_cell_bytes"] or up[3]["reads_bytes"]) if up else 0.0
            by_name[stage.name] = (tuple(rows[-1]["block"]), rows[-1]["bundle_cells"], stage, rows[-1])
        print(f"[dry run] {cfg.name} -> {store} (nothing is started or written)", file=out)
        for r in rows:
            held = "new group" if r["done"] is None else f"{r['done']:,} done already"
            fields = ", ".join(f"{k}={v}" for k, v in r["largest_cell"].items())
            print(f"  {r['stage']} ({r['experiment']}): {r['cells']:,} cells ({held}), ~{r['bundles']:,} bundles, "
                  f"{r['files']:,} files (a chunk per {math.prod(r['block']):,} cells), {_size(r['bytes'])} uncompressed; largest cell "
                  + (_size(r["largest_cell_bytes"]) if r["largest_cell_bytes"] else
                     f"at least {_size(r['reads_bytes'])} (the largest net it reads; its own tensors not estimated)"
                     if r["reads_bytes"] else "unknown")
                  + (f" ({fields})" if fields else ""), file=out)
        print(f"  store total: {sum(r['files'] for r in rows):,} files, "
              f"{_size(sum(r['bytes'] for r in rows))} uncompressed", file=out)
