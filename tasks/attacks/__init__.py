"""Attacks on stacked nets, by name (torchattacks-style: one method per file).

- ``universal``: paper 002's smallest universal flip c* along a direction ẑ (``universal.py``);
  the directions it may use are registered in ``DIRECTIONS`` (``directions.py``).
- ``single_step_exact`` / ``single_step_bisect``: paper 003's minimal flipping gradient step
  (``single_step.py``); ``pgd_l2`` (``pgd.py``); ``deepfool`` (``deepfool.py``).

``ATTACKS`` maps every name to its function; ``STEP_ATTACKS`` are those with the single-step
signature ``(net, X) -> StepResult`` that experiment ``single_step`` may name.
"""

from tasks.attacks.deepfool import DeepFoolResult, deepfool
from tasks.attacks.directions import all_samples_direction, margin_direction, random_direction
from tasks.attacks.pgd import PGDResult, pgd_l2, random_in_ball
from tasks.attacks.single_step import StepResult, chunk_for, exact_roots, single_step_bisect, single_step_exact
from tasks.attacks.universal import (FlipResult, c_star_bisection, c_star_exact, f_along, first_roots, flipped_fraction,
                                     flips_all)

DIRECTIONS = {
    "margin_direction": margin_direction,
    "all_samples_direction": all_samples_direction,
    "random_direction": random_direction,
}
STEP_ATTACKS = {"single_step_exact": single_step_exact, "single_step_bisect": single_step_bisect}
ATTACKS = {"universal": c_star_exact, **STEP_ATTACKS, "pgd_l2": pgd_l2, "deepfool": deepfool}


def get_attack(name: str):
    """The attack registered as ``name``; ValueError naming the allowed ones otherwise."""
    if name not in ATTACKS:
        raise ValueError(f"unknown attack {name!r}; allowed: {', '.join(sorted(ATTACKS))}")
    return ATTACKS[name]


__all__ = ["ATTACKS", "DIRECTIONS", "STEP_ATTACKS", "DeepFoolResult", "FlipResult", "PGDResult", "StepResult",
           "c_star_bisection", "c_star_exact", "chunk_for", "deepfool", "exact_roots", "f_along", "first_roots",
           "flipped_fraction", "flips_all", "get_attack", "all_samples_direction", "margin_direction", "pgd_l2",
           "random_direction", "random_in_ball", "single_step_bisect", "single_step_exact"]
