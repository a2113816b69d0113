"""Registry of experiments: what a config's ``experiment:`` may name.

Each module of this package declares one :class:`core.declare.Experiment` (parameters, stored
variables, bundle key, cost) and wires its ``run_bundle`` to a pure cell function of
``tasks/cells/``; importing the module registers it."""

from __future__ import annotations

import functools
import time

from core.declare import REQUIRED, Cell, Experiment, Param, Result, Var

__all__ = ["REQUIRED", "Cell", "Experiment", "Param", "Result", "Var", "EXPERIMENTS", "register", "get", "names",
           "timed", "by_shape"]

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


def by_shape(run_bundle):
    """A reading experiment's ``run_bundle(cells, device, inputs=Nets)`` that runs the nets of each
    true shape (d, m, width; test points where the producer keeps them) as a stacked bundle of its
    own, cut to that shape: no padding enters, so a cell's values are bit for bit the same whatever
    its bundle mates (issue 29 item 2: padded axes change the order of the kernels' sums). The chain
    cuts a reading stage's bundles by the reader's own parameters, blind to its upstream nets' shapes."""
    @functools.wraps(run_bundle)
    def run(cells: list[Cell], device: str = "auto", inputs=None, **kwargs) -> list[Result]:
        if inputs is None:
            return run_bundle(cells, device, **kwargs)
        groups: dict[tuple, list[int]] = {}
        n_test = inputs.extra.get("n_test_used")
        for i in range(len(cells)):
            shape = (int(inputs.d[i]), int(inputs.m[i]), int(inputs.width[i]), inputs.problems[i],
                     None if n_test is None else int(n_test.reshape(len(cells), -1)[i, 0]))
            groups.setdefault(shape, []).append(i)
        if len(groups) == 1:
            return run_bundle(cells, device, inputs=inputs.select(list(range(len(cells)))), **kwargs)
        from flows import bundle_progress

        out: list[Result] = [{}] * len(cells)
        before = 0
        for idx in groups.values():
            with bundle_progress.current().part(before, len(idx), len(cells)):  # the bundle's step count goes on
                for i, res in zip(idx, run_bundle([cells[i] for i in idx], device, inputs=inputs.select(idx), **kwargs)):
                    out[i] = res
            before += len(idx)
        return out

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
