"""Slopes of log-volume curves (P000-5, P000-8)."""

from __future__ import annotations

import math

import numpy as np


def fit_log_slope(eps: np.ndarray, log_volume: np.ndarray) -> tuple[float, float, float]:
    """Least-squares fit log mu = slope · log eps + intercept over the finite entries (P000-5, P000-8).

    Returns (slope, intercept, standard error of the slope; nan with < 3 points)."""
    x = np.log(np.asarray(eps, dtype=float))
    y = np.asarray(log_volume, dtype=float)
    ok = np.isfinite(x) & np.isfinite(y)
    if ok.sum() < 2:
        raise ValueError("fit_log_slope needs at least two finite (eps, log_volume) points")
    x, y = x[ok], y[ok]
    X = np.stack([x, np.ones_like(x)], 1)
    coef, res, *_ = np.linalg.lstsq(X, y, rcond=None)
    if len(x) < 3:
        return float(coef[0]), float(coef[1]), math.nan
    s2 = float(np.sum((y - X @ coef) ** 2)) / (len(x) - 2)
    se = math.sqrt(s2 / float(np.sum((x - x.mean()) ** 2)))
    return float(coef[0]), float(coef[1]), se
