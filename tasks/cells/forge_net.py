"""Paper 000's forging volume on stored two-layer ReLU nets (experiment ``forge_net``).

For a stored net θ, f(x) = Σ_j v_j ρ(w_j·x + b_j), and a training point (x_i, y_i), the ε-forging
set is S_ε = {x' : ‖∇_θ ℓ(θ; x', y_i) − ∇_θ ℓ(θ; x_i, y_i)‖ ≤ ε} (spec 000 Eq 1, D000-1), the
gradient taken over the TRAINED blocks of θ only (``trained`` ⊂ {"W", "b", "v"}). Domain: x' in the
open ball B_R(0) ⊂ R^d, Lebesgue measure (D000-3's convention: z ∈ B_R; here the label is not free,
y' = y_i, because the nets are classifiers with labels ±1). ε is relative, ε = eps·‖∇_θ ℓ(θ; x_i, y_i)‖
(spec §4 sweeps ε/A, A = ‖∇f(x*)‖): nets trained to a loss of 1e-30 have gradients of that size, and
the loss reduction (mean / sum) rescales both sides alike. eps < 1 keeps out the all-off cone
{Wx + b ≤ 0} and the saturated-margin region, where the gradient is ~0 (T000-4's hypothesis
ε < ‖∇f(x*)‖, spec §6 item 4(ii)).

The volume is estimated with ``tasks.forging.estimators`` (subset simulation + importance sampling,
nested sampling, ...) on a :class:`~tasks.forging.problems.ForgingProblem` whose law is the uniform
law on B_R (spec §6 item 5: Gaussian latents through the ball map). Pure torch, float64, CPU.
"""

from __future__ import annotations

import hashlib
import math

import torch

from tasks.forging.estimators import ESTIMATORS
from tasks.forging.exact import log_ball_volume
from tasks.forging.problems import ForgingProblem, _ball_points
from tasks.nets.losses import log_loss_terms

__all__ = ["BLOCKS", "grad_factors", "loss_grad", "forging_problem", "measure_net", "measured_points", "STATUS"]

BLOCKS = ("W", "b", "v")
# per point: 0 ok, 2 estimator stalled (eps below the mismatch's minimum on B_R, e.g. x_i outside it),
# 3 estimate unreliable: flagged by its estimator (importance weights: Pareto k-hat too large, ESS < 100,
# fewer than 10 hits) or not a finite volume with a finite SE (the set holds x_i: -inf is a failed
# estimate, never a volume), 4 zero gradient at x_i
STATUS = {"ok": 0, "stalled": 2, "unreliable": 3, "zero_grad": 4}
MAX_LOG_RATIO = 300.0  # cap on log |ℓ'(q')/ℓ'(q_i)| (a badly misclassified x'): keeps g finite, far above eps


def grad_factors(W, b, v, X, y, trained, loss: str) -> tuple[torch.Tensor, torch.Tensor]:
    """∇_θ ℓ(θ; x, y) = −exp(a)·J per row of X, ℓ(q) of the margin q = y f(x) (logistic or exp):
    a = log|ℓ'(q)| (N,), J = y ∇_θ f(x) (N, P) over the trained blocks in the order W (row-major),
    b, v: ∇_W f = (v ⊙ ρ'(h)) xᵀ, ∇_b f = v ⊙ ρ'(h), ∇_v f = ρ(h), h = Wx + b, ρ'(0) = 0 (spec §6.8,
    D000-3). W (k, d), b, v (k), X (N, d), y (N). Split so that the gradient's scale (1e-30 on a net
    trained that far) stays in a."""
    unknown = set(trained) - set(BLOCKS)
    if unknown or not trained:
        raise ValueError(f"trained must be a non-empty subset of {BLOCKS}, got {sorted(trained)}")
    H = X @ W.T + b  # (N, k)
    on = (H > 0).to(H.dtype)
    q = y * ((H * on) @ v)
    a = log_loss_terms(q, loss)[1]
    parts = []
    if "W" in trained:
        parts.append(((on * v) * y[:, None]).unsqueeze(-1).mul(X.unsqueeze(1)).flatten(1))  # (N, k·d)
    if "b" in trained:
        parts.append((on * v) * y[:, None])
    if "v" in trained:
        parts.append((H * on) * y[:, None])
    return a, torch.cat(parts, 1)


def loss_grad(W, b, v, X, y, trained, loss: str) -> torch.Tensor:
    """∇_θ ℓ(θ; x, y) over the trained blocks, (N, P) (:func:`grad_factors`; ℓ' < 0 for both losses)."""
    a, J = grad_factors(W, b, v, X, y, trained, loss)
    return -torch.exp(a)[:, None] * J


def forging_problem(W, b, v, x_i, y_i, trained, loss: str, R: float) -> tuple[ForgingProblem, float]:
    """The volume of S_ε ∩ B_R(0) for ε = eps·‖∇ℓ(x_i)‖ as a ForgingProblem in relative units (eps < 1):
    mismatch g(x') = ‖∇ℓ(x') − ∇ℓ(x_i)‖ / ‖∇ℓ(x_i)‖ = ‖exp(a' − a_i) J' − J_i‖ / ‖J_i‖ (Eq 1), x' uniform
    in B_R (latent (ξ0, ξ) ↦ R Φ(ξ0)^{1/d} ξ/‖ξ‖, spec §6 item 5), indicator weight. Also returns
    log ‖∇ℓ(x_i)‖ (−inf when it is zero).

    The level function the estimators descend is g where g < 1 and 1 + ‖x' − x_i‖/R where g >= 1
    (issue 41): the same set {level <= eps} as {g <= eps} for every eps < 1 (``eps_max`` just below 1),
    so the same volume, but without g's plateau g = 1 on the all-off cone {Wx' + b <= 0} (ties that
    stalled subset simulation's pilot there: 8 of 40 seeds at n_samples = 100 on a train_kkt net) nor
    the barrier g > 1 between that cone and x_i's activation region (the runs seeded on the plateau
    died at the next level: 8 more of 40 returned −inf; with the plateau rule of the pilot alone,
    3 of 20 still stalled and 1 returned −inf). Above 1 the level leads to x_i, a member of
    the set; every region with g < 1 stays in every level, so no mode of g is cut off."""
    d = x_i.numel()
    a_i, J_i = grad_factors(W, b, v, x_i[None], y_i.reshape(1), trained, loss)
    a_i, J_i = a_i[0], J_i[0]
    nJ = J_i.norm()

    def evaluate(xi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = _ball_points(xi, R, d)
        a, J = grad_factors(W, b, v, z, y_i.expand(z.shape[0]), trained, loss)
        r = torch.exp((a - a_i).clamp_max(MAX_LOG_RATIO))
        g = (r[:, None] * J - J_i).norm(dim=1) / nJ
        level = torch.where(g < 1, g, 1 + (z - x_i).norm(dim=1) / R)
        return level, torch.ones_like(g)

    problem = ForgingProblem(d + 1, evaluate, "indicator", log_ball_volume(d, R), 1, math.nextafter(1.0, 0.0),
                             f"two-layer ReLU net, x' uniform in B_{R:.4g}(0) ⊂ R^{d}, y' = y_i", ((1, d + 1),))
    return problem, float(a_i + torch.log(nJ)) if nJ > 0 else -math.inf


def point_generator(own: dict, W, b, v, X, y, trained, i: int) -> torch.Generator:
    """The estimator's generator for training point i, a function of what the point's estimate is
    (issue 41): the net's own content (the bytes of W, b, v, X, y as float64, cut to its own sizes,
    and the trained blocks), the point index i, the estimator seed ``own["seed"]`` and the cell's
    other estimator params (eps, R, estimator, sizes, loss), except ``points`` (how many points are
    measured changes no point's problem). Never a grid coordinate of the upstream cell (unlearn's
    alpha, its method name, a net's training seed as a label) nor a position in the bundle: two
    bit-identical nets get bit-identical estimates wherever they sit in the grid, and a resumed or
    recomputed cell reproduces its stored values (hence its content hash, storage/hashing.py)."""
    h = hashlib.sha256()
    params = sorted((k, val) for k, val in own.items() if k != "points")
    h.update(f"{params!r}|{sorted(trained)!r}|{i}".encode())
    for t in (W, b, v, X, y):
        a = t.detach().to(torch.float64).contiguous()
        h.update(f"|{tuple(a.shape)}|".encode())
        h.update(a.numpy().tobytes())
    return torch.Generator().manual_seed(int(h.hexdigest()[:15], 16))


def measured_points(forgotten: torch.Tensor, points: int) -> torch.Tensor:
    """(m,) bool: the training points a cell measures, the first ``points`` (-1: all) and every forgotten one."""
    m = forgotten.shape[0]
    return forgotten | (torch.arange(m) < (m if points < 0 else points))


def measure_net(W, b, v, X, y, forgotten, trained, own: dict, progress=None) -> dict:
    """One cell: the forging log-volume of the measured training points of one net (its own sizes:
    W (k, d), b, v (k), X (m, d), y (m); ``forgotten`` (m,) bool). Measured: the first ``points``
    (-1: all) and every forgotten point. Per point (m,): logvol, logvol_stderr (the estimator's
    stated standard error of the log), log_grad_norm, point_status (NaN where not measured); per cell
    the means over finite logvol of forgotten / retained measured points (NaN when none).
    ``progress`` (optional): called as ``progress(points done, points measured)`` before each point and
    at the end."""
    m = X.shape[0]
    measured = measured_points(forgotten, own["points"])
    R = float(own["R"]) or float(X.norm(dim=1).max())
    nan = torch.full((m,), math.nan, dtype=torch.float64)
    logvol, stderr, lgn, status = nan.clone(), nan.clone(), nan.clone(), nan.clone()
    evals = 0
    sizes = dict(n_samples=own["n_samples"], n_repeats=own["n_repeats"], n_importance=own["n_importance"])
    todo = measured.nonzero().flatten().tolist()
    for k, i in enumerate(todo):
        if progress is not None:
            progress(k, len(todo))
        problem, lgn[i] = forging_problem(W, b, v, X[i], y[i], trained, own["loss"], R)
        if not math.isfinite(lgn[i]):
            status[i] = STATUS["zero_grad"]
            continue
        gen = point_generator(own, W, b, v, X, y, trained, i)
        est = ESTIMATORS[own["estimator"]](problem, own["eps"], generator=gen, **sizes)
        evals += est.n_gradient_evals
        finite = math.isfinite(est.log_volume) and math.isfinite(est.log_volume_stderr)
        status[i] = STATUS["stalled"] if est.extra.get("stalled") else \
            STATUS["unreliable"] if not (est.extra.get("reliable", True) and finite) else STATUS["ok"]
        if status[i] == STATUS["ok"]:
            logvol[i], stderr[i] = est.log_volume, est.log_volume_stderr
    if progress is not None:
        progress(len(todo), len(todo))

    def mean(sel: torch.Tensor) -> float:
        vals = logvol[sel & measured & torch.isfinite(logvol)]
        return float(vals.mean()) if vals.numel() else math.nan

    return {"logvol": logvol.numpy(), "logvol_stderr": stderr.numpy(), "log_grad_norm": lgn.numpy(),
            "point_status": status.numpy(), "logvol_forgotten": mean(forgotten), "logvol_retained": mean(~forgotten),
            "n_forgotten": int(forgotten.sum()), "n_retained": int((measured & ~forgotten).sum()),
            "n_failed": int(((status != STATUS["ok"]) & measured).sum()), "R_used": R,
            "log_domain_volume": log_ball_volume(X.shape[1], R), "n_gradient_evals": float(evals)}
