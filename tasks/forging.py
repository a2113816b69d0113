"""Paper 000 (forging sets): public entry point re-exporting the forging kernels.

Modules (pure torch/numpy/scipy, float64, log space, randomness only via passed generators):
  forging_exact       exact linreg volume (T000-2x quadrature + closed form), exact forgers (T000-1/3)
  forging_bounds      the paper's bounds (Props 2/4, Cor 1/2, Lemma 2, Thm 2-5, Eq 47), paper + corrected
  forging_models      models, batched membership (Eq 1), mixed Hessian M0, nullity, Lipschitz, batch (§5)
  forging_estimators  ForgingProblem, naive_mc, subset_simulation, slope fits
  forging_importance  subset_importance: subset-simulation pilot + defensive Student-t importance sampling
  forging_nested      nested_sampling: generalised adaptive multilevel splitting, whole log mu(eps) curve per run
  forging_registry    ESTIMATORS: estimator name -> function (what configs name)
  forging_sgd         Fig 1 two-basin SGD trajectories (F000-1)
  forging_cell        one grid cell -> dict of stored numbers (used by flows/experiments/forging.py)
"""

from tasks.forging_bounds import *  # noqa: F401,F403
from tasks.forging_cell import forging_cell  # noqa: F401
from tasks.forging_estimators import *  # noqa: F401,F403
from tasks.forging_exact import *  # noqa: F401,F403
from tasks.forging_importance import *  # noqa: F401,F403
from tasks.forging_models import *  # noqa: F401,F403
from tasks.forging_nested import *  # noqa: F401,F403
from tasks.forging_registry import ESTIMATORS  # noqa: F401
from tasks.forging_sgd import *  # noqa: F401,F403
