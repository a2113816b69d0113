"""Grouping grid cells into bundles that run as one stacked tensor problem."""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict

from core.declare import Experiment
from storage.schema import NO_HASH


def make_bundles(exp: Experiment, cells: list[tuple[tuple, dict]], bundle_size: int,
                 max_waste: float = 2.0, memory_budget: float = float("inf"),
                 workers: int = 1, block: tuple[int, ...] | None = None) -> list[list[tuple[tuple, dict]]]:
    """Group ``(index, cell)`` pairs by ``exp.bundle_key``; within a group sort by cost and cut
    bundles of at most ``bundle_size`` cells (and at most 1/``workers`` of the group, so every
    worker gets work) whose padded cost (cells x largest cost) stays
    within ``max_waste`` of their real cost and whose padded memory (cells x largest
    ``exp.memory``) stays within ``memory_budget`` bytes. The cells of one block (``block``: the
    group's chunk of cells, storage/blocks.py) always go to one bundle, so no two bundles write one
    chunk; a block is the smallest bundle. Deterministic for a given input order."""
    groups: dict[tuple, list] = defaultdict(list)
    for item in cells:
        groups[exp.bundle_key(item[1])].append(item)
    bundles = []
    if not exp.stacked:
        for key in sorted(groups, key=repr):
            bundles += _sequential(exp, by_block(groups[key], block), bundle_size, workers)
        return bundles
    for key in sorted(groups, key=repr):
        units = sorted(by_block(groups[key], block), key=lambda u: (max(exp.cost(c) for _, c in u), u[0][0]))
        size = max(1, min(bundle_size, math.ceil(len(groups[key]) / max(workers, 1))))
        current, total, peak = [], 0.0, 0.0
        for unit in units:
            c = max(exp.cost(cell) for _, cell in unit)
            mem = max(exp.memory(cell) for _, cell in unit)
            n = len(current) + len(unit)
            if current and (n > size or n * c > max_waste * (total + c * len(unit))  # units by cost: c the largest
                            or n * max(peak, mem) > memory_budget):
                bundles.append(current)
                current, total, peak = [], 0.0, 0.0
            current += unit
            total += c * len(unit)
            peak = max(peak, mem)
        if current:
            bundles.append(current)
    return bundles


def by_block(items: list, block: tuple[int, ...] | None) -> list[list]:
    """``(index, cell)`` pairs grouped by the block (storage/blocks.py) that holds them, in order of
    their first cell."""
    if block is None or all(b == 1 for b in block):
        return [[it] for it in items]
    units: dict[tuple, list] = {}
    for item in items:
        units.setdefault(tuple(int(i) // b for i, b in zip(item[0], block)), []).append(item)
    return list(units.values())


BUNDLES_PER_WORKER = 4  # cells run one after another: a few bundles per worker balance the load and move the bar


def _sequential(exp: Experiment, units: list[list], bundle_size: int, workers: int) -> list[list]:
    """Cells that a bundle runs one after another (``exp.stacked`` False): contiguous runs of the
    grid order (readable task names) cut between blocks (``units``), ``BUNDLES_PER_WORKER`` per
    worker or more where ``bundle_size`` asks, cut where the summed cost passes each equal share of
    the total."""
    n = sum(len(u) for u in units)
    k = min(len(units), max(BUNDLES_PER_WORKER * max(workers, 1), math.ceil(n / bundle_size)))
    costs = [sum(max(float(exp.cost(cell)), 0.0) for _, cell in u) for u in units]
    share, total = sum(costs) / k if k else 0.0, 0.0
    bundles: list[list] = [[]]
    for unit, c in zip(units, costs):
        share_reached = len(bundles) < k and total >= share * len(bundles)  # cumulative cost past the i-th share
        if bundles[-1] and (len(bundles[-1]) + len(unit) > bundle_size or share_reached):
            bundles.append([])
        bundles[-1].extend(unit)
        total += c
    return bundles


def memory_budget(device: str, workers: int, fraction: float = 0.5) -> float:
    """Bytes one bundle may use: ``fraction`` of the free GPU memory (one worker per GPU), or of
    the available RAM shared by ``workers`` worker processes. Measured where the flow runs,
    which for local and cuda clusters is where the workers run."""
    import torch

    if device in ("cuda", "auto") and torch.cuda.is_available():
        free, _ = torch.cuda.mem_get_info()
        return fraction * free
    try:
        with open("/proc/meminfo") as f:
            avail = next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("MemAvailable"))
    except (OSError, StopIteration):
        avail = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    return fraction * avail / max(workers, 1)


def bundle_name(stage: str, dims: list[str], cells: list[dict]) -> str:
    """A task run's name that says what runs: ``nets d=25..50 seed=0..2 (6 cells)`` (each dim's
    value, or its first..last value in the bundle when the cells differ along it)."""
    parts = []
    for dim in dims:
        values = [c.get(dim) for c in cells]
        distinct = list(dict.fromkeys(map(str, values)))
        if len(distinct) == 1:
            parts.append(f"{dim}={distinct[0]}")
        else:
            try:
                lo, hi = min(values), max(values)
            except TypeError:
                lo, hi = distinct[0], distinct[-1]
            parts.append(f"{dim}={lo}..{hi}")
    return f"{stage} {' '.join(parts)} ({len(cells)} cell{'s' if len(cells) != 1 else ''})"[:200]



def block_for(cfg, up_block: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """The block (storage/blocks.py) of a new group of stage ``cfg``: cells of one bundle key (and,
    for stacked bundles, one cost), at most the runner's ``chunk_cells`` (0: its ``bundle_size``,
    and at most the cells over the workers, so that every worker gets a bundle).
    A reading stage's block lies within its upstream's block ``up_block`` along the upstream dims
    (one along them when it is not given) and spans its own dims."""
    import numpy as np

    from storage import blocks

    exp, shape = cfg.exp, tuple(len(v) for v in cfg.store_grid.values())
    k = len(cfg.upstream_grid)
    up_block = tuple(up_block) if up_block else (1,) * k
    cells = cfg.cells()  # this stage's own cells; along the upstream dims the upstream cells vary
    ids: dict[str, int] = {}
    keys = np.asarray([ids.setdefault(repr(exp.bundle_key(c)), len(ids)) for c in cells]).reshape(shape[k:])
    costs = np.asarray([float(exp.cost(c)) if exp.stacked else 0.0 for c in cells]).reshape(shape[k:])
    if k and any(b > 1 for b in up_block):  # what the cells take from their upstream cells may change their key
        ups = cfg_upstream_cells(cfg)
        keys = np.asarray([[ids.setdefault(repr(exp.bundle_key(exp.with_inherited(c, u))), len(ids)) for c in cells]
                           for u in ups]).reshape(shape)
        costs = np.broadcast_to(costs, shape)
    else:
        keys, costs = np.broadcast_to(keys, shape), np.broadcast_to(costs, shape)
    cap = cfg.runner.get("chunk_cells") or min(cfg.runner["bundle_size"],  # and a bundle for every worker
                                               math.ceil(math.prod(shape) / max(1, cfg.runner.get("workers", 1))))
    return blocks.choose(keys, costs, cap, within=up_block + (None,) * (len(shape) - k))


def cfg_upstream_cells(cfg) -> list[dict]:
    """The upstream cells a reading stage's cells read, in C order of the upstream dims (their
    parameters as the upstream stage runs them: its grid and params)."""
    import itertools

    axes = list(cfg.upstream_grid.values())
    return [dict(zip(cfg.upstream_grid, combo)) for combo in itertools.product(*axes)]


def with_upstream_values(exp: Experiment, items: list[tuple[tuple, dict]], up_cfg) -> list[tuple[tuple, dict]]:
    """A reading stage's ``(index, cell)`` items with the values each cell takes from the upstream
    cell it reads (``exp.with_inherited``; the index's leading dims are the upstream's), so that they
    bundle by those too. The one rule of the run (flows/chain.py) and its dry run (kktlab/plan.py)."""
    if up_cfg is None or not exp.inherits:
        return items
    import numpy as np

    ups, shape = up_cfg.store_cells(), [len(v) for v in up_cfg.store_grid.values()]
    return [(idx, exp.with_inherited(cell, ups[int(np.ravel_multi_index(tuple(idx[:len(shape)]), shape))]))
            for idx, cell in items]


def same_input(exp, cells: list[dict], ok: list[int], nets) -> dict[int, int]:
    """For each usable cell ``i`` of a reading bundle, the first cell computed from the same input: the
    same upstream content (``cell_hash``; the net before it too, where read) and the same own parameters.
    A reading cell's numbers are a function of those alone (its random streams come from its own
    seeds; tests/test_bundle_invariance_readers.py), so an unlearn stage's references (``identity``,
    ``retrain``: the same net at every α, issue 39) are attacked once per bundle and their cells share
    the result. Cells without a recorded hash are each their own."""
    before = nets.before.hashes if nets.before is not None and nets.before.hashes else None
    first: dict[int, int] = {}
    seen: dict[tuple, int] = {}
    for i in ok:
        h = nets.hashes[i] if nets.hashes else NO_HASH
        if h == NO_HASH or (before is not None and before[i] == NO_HASH):
            first[i] = i
            continue
        own = json.dumps({k: cells[i].get(k) for k in sorted(exp.params)}, sort_keys=True, default=str)
        first[i] = seen.setdefault((int(h), None if before is None else int(before[i]), own), i)
    return first
