"""Unlearning methods of paper 001, a registry by name (one file per method; spec 001 §2, §5).

Every method maps trained weights W (E,n,d) (linear: (E,1,d), u None), data X (E,m,d), y (E,m),
the trained net's multipliers λ (E,m) at the scale of W, forget sets (E,L,m) bool and step
fractions α (A,) to unlearned weights (E,L,A,n,d): ``METHODS[name](W, u, X, y, lam, forget, alphas, **kw)``.
"""

from tasks.unlearn.ga import ga
from tasks.unlearn.identity import identity
from tasks.unlearn.k_ga import k_ga
from tasks.unlearn.retrain import retrain
from tasks.unlearn.sequential_ga import sequential_ga
from tasks.unlearn.step import ga_step, log_beta

METHODS = {"ga": ga, "k_ga": k_ga, "sequential_ga": sequential_ga, "retrain": retrain, "identity": identity}

__all__ = ["METHODS", "ga", "k_ga", "sequential_ga", "retrain", "identity", "ga_step", "log_beta"]
