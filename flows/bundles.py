"""Grouping grid cells into bundles that run as one stacked tensor problem."""

from __future__ import annotations

import math
import os
from collections import defaultdict

from core.declare import Experiment


def make_bundles(exp: Experiment, cells: list[tuple[tuple, dict]], bundle_size: int,
                 max_waste: float = 2.0, memory_budget: float = float("inf"),
                 workers: int = 1) -> list[list[tuple[tuple, dict]]]:
    """Group ``(index, cell)`` pairs by ``exp.bundle_key``; within a group sort by cost and cut
    bundles of at most ``bundle_size`` cells (and at most 1/``workers`` of the group, so every
    worker gets work) whose padded cost (cells x largest cost) stays
    within ``max_waste`` of their real cost and whose padded memory (cells x largest
    ``exp.memory``) stays within ``memory_budget`` bytes. Deterministic for a given input order."""
    groups: dict[tuple, list] = defaultdict(list)
    for item in cells:
        groups[exp.bundle_key(item[1])].append(item)
    bundles = []
    if not exp.stacked:
        for key in sorted(groups, key=repr):
            bundles += _sequential(exp, groups[key], bundle_size, workers)
        return bundles
    for key in sorted(groups, key=repr):
        items = sorted(groups[key], key=lambda it: (exp.cost(it[1]), it[0]))
        size = max(1, min(bundle_size, math.ceil(len(items) / max(workers, 1))))
        current, total, peak = [], 0.0, 0.0
        for item in items:
            c, mem = exp.cost(item[1]), exp.memory(item[1])
            n = len(current) + 1
            if current and (n > size or n * c > max_waste * (total + c) or n * max(peak, mem) > memory_budget):
                bundles.append(current)
                current, total, peak = [], 0.0, 0.0
            current.append(item)
            total += c
            peak = max(peak, mem)
        if current:
            bundles.append(current)
    return bundles


BUNDLES_PER_WORKER = 4  # cells run one after another: a few bundles per worker balance the load and move the bar


def _sequential(exp: Experiment, items: list, bundle_size: int, workers: int) -> list[list]:
    """Cells that a bundle runs one after another (``exp.stacked`` False): contiguous runs of the
    grid order (readable task names), ``BUNDLES_PER_WORKER`` per worker or more where
    ``bundle_size`` asks, cut where the summed cost passes each equal share of the total."""
    k = min(len(items), max(BUNDLES_PER_WORKER * max(workers, 1), math.ceil(len(items) / bundle_size)))
    costs = [max(float(exp.cost(cell)), 0.0) for _, cell in items]
    share, total = sum(costs) / k if k else 0.0, 0.0
    bundles: list[list] = [[]]
    for item, c in zip(items, costs):
        share_reached = len(bundles) < k and total >= share * len(bundles)  # cumulative cost past the i-th share
        if bundles[-1] and (len(bundles[-1]) >= bundle_size or share_reached):
            bundles.append([])
        bundles[-1].append(item)
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

