"""Attacks on stacked nets, by name (torchattacks-style: one method per file).

- ``universal``: paper 002's smallest universal flip c* along a direction ẑ (``universal.py``);
  the directions it may use are registered in ``DIRECTIONS`` (``directions.py``).
"""

from tasks.attacks.directions import all_samples_direction, margin_direction, random_direction
from tasks.attacks.universal import (FlipResult, c_star_bisection, c_star_exact, f_along, first_roots, flipped_fraction,
                                     flips_all)

DIRECTIONS = {
    "margin_direction": margin_direction,
    "all_samples_direction": all_samples_direction,
    "random_direction": random_direction,
}
ATTACKS = {"universal": c_star_exact}

__all__ = ["ATTACKS", "DIRECTIONS", "FlipResult", "c_star_bisection", "c_star_exact", "f_along", "first_roots",
           "flipped_fraction", "flips_all", "all_samples_direction", "margin_direction", "random_direction"]
