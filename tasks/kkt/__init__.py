"""KKT measures of the max-margin problem, shared by papers 001, 002 and 004: margins,
multipliers, residuals, theorem checks."""

from tasks.kkt.margins import margin_set, margins, normalized_margin
from tasks.kkt.multipliers import KKTFit, gram, kkt_fit, nnls
from tasks.kkt.theory import TheoryCheck, balance_error, theory_check

__all__ = ["margin_set", "margins", "normalized_margin", "KKTFit", "gram", "kkt_fit", "nnls", "TheoryCheck",
           "balance_error", "theory_check"]
