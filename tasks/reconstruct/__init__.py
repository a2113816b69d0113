"""Paper 004 (Refael et al., "No Prior, No Leakage"): the KKT reconstruction attack of Haim et al.
as one stacked problem, its scores, the merge/split constructions, the split budgets and the
shift defence (spec paper-004-reconstruction.md §2.4-§3.8)."""

from tasks.reconstruct.attack import INITS, AttackResult, candidate_labels, init_candidates, optimise
from tasks.reconstruct.objective import OBJECTIVES, residual, residual_norm2
from tasks.reconstruct.score import Scores, nearest, score_all, ssim

__all__ = ["INITS", "AttackResult", "candidate_labels", "init_candidates", "optimise", "OBJECTIVES", "residual",
           "residual_norm2", "Scores", "nearest", "score_all", "ssim"]
