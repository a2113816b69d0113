"""Registry of experiments: what a config's ``experiment:`` may name.

Each module of this package declares one :class:`core.declare.Experiment` (parameters, stored
variables, bundle key, cost) and wires its ``run_bundle`` to a pure cell function of
``tasks/cells/``; importing the module registers it."""

from __future__ import annotations

import functools
import time

from core.declare import REQUIRED, Cell, Experiment, Param, Result, Var

__all__ = ["REQUIRED", "Cell", "Experiment", "Param", "Result", "Var", "EXPERIMENTS", "register", "get", "names",
           "timed"]

EXPERIMENTS: dict[str, Experiment] = {}


def timed(run_bundle):
    """``run_bundle`` whose cells each get ``wall_s``: the bundle's wall time divided by its cells."""
    @functools.wraps(run_bundle)
    def run(cells: list[Cell], *args, **kwargs) -> list[Result]:
        t0 = time.perf_counter()
        out = run_bundle(cells, *args, **kwargs)
        wall = (time.perf_counter() - t0) / max(len(cells), 1)
        return [dict(res, wall_s=wall) for res in out]

    return run


def register(exp: Experiment) -> Experiment:
    if exp.name in EXPERIMENTS:
        raise ValueError(f"experiment {exp.name!r} registered twice")
    EXPERIMENTS[exp.name] = exp
    return exp


def get(name: str) -> Experiment:
    _load_all()
    return EXPERIMENTS[name]


def names() -> list[str]:
    _load_all()
    return sorted(EXPERIMENTS)


def _load_all() -> None:
    """Import every module of this package; importing one registers its experiments."""
    import importlib
    import pkgutil

    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")
