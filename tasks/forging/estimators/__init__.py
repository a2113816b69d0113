"""Forging-volume estimators by name (spec 000 §6), one function each with one signature:
``fn(problem, eps, *, generator, n_samples, **options) -> VolumeEstimate``.

A new estimator is a function in its own module plus one line here; configs name it in the
``estimator`` grid axis (``exact`` is the closed form, handled by ``tasks.cells.forging``)."""

from __future__ import annotations

from typing import Callable

from tasks.forging.estimators.common import VolumeEstimate, estimate_from_runs
from tasks.forging.estimators.importance import subset_importance
from tasks.forging.estimators.naive_mc import naive_mc, naive_mc_samples_for
from tasks.forging.estimators.nested import nested_sampling
from tasks.forging.estimators.subset_simulation import subset_simulation

ESTIMATORS: dict[str, Callable[..., VolumeEstimate]] = {
    "naive_mc": naive_mc,                    # plain Monte Carlo (§6 item 1)
    "subset_simulation": subset_simulation,  # multilevel splitting with pCN moves (§6 item 5a)
    "subset_importance": subset_importance,  # splitting pilot + defensive importance sampling (§6 item 6)
    "nested_sampling": nested_sampling,      # nested sampling, the whole log mu(eps) curve per run (§6 item 5b)
}
LEVELLED = ("subset_simulation", "subset_importance")  # levels of probability p0 from n_samples points
REPEATED = (*LEVELLED, "nested_sampling")  # stated stderr from n_repeats independent runs (spec §5)

__all__ = ["ESTIMATORS", "LEVELLED", "REPEATED", "VolumeEstimate", "estimate_from_runs", "naive_mc",
           "naive_mc_samples_for", "nested_sampling", "subset_importance", "subset_simulation"]
