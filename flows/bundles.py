"""Grouping grid cells into bundles that run as one stacked tensor problem."""

from __future__ import annotations

from collections import defaultdict

from flows.experiments import Experiment


def make_bundles(exp: Experiment, cells: list[tuple[tuple, dict]], bundle_size: int,
                 max_waste: float = 2.0) -> list[list[tuple[tuple, dict]]]:
    """Group ``(index, cell)`` pairs by ``exp.bundle_key``; within a group sort by cost and cut
    bundles of at most ``bundle_size`` cells whose padded cost (cells x largest cost) stays
    within ``max_waste`` of their real cost. Deterministic for a given input order."""
    groups: dict[tuple, list] = defaultdict(list)
    for item in cells:
        groups[exp.bundle_key(item[1])].append(item)
    bundles = []
    for key in sorted(groups, key=repr):
        items = sorted(groups[key], key=lambda it: (exp.cost(it[1]), it[0]))
        current, total = [], 0.0
        for item in items:
            c = exp.cost(item[1])
            if current and (len(current) >= bundle_size or (len(current) + 1) * c > max_waste * (total + c)):
                bundles.append(current)
                current, total = [], 0.0
            current.append(item)
            total += c
        if current:
            bundles.append(current)
    return bundles
