"""The cell of experiment ``train`` (the first stage of a paper-002 chain): a trained stack in,
per cell its training numbers and the net and training set at their true sizes out, so a later
stage (``universal_attack``) analyses exactly the net that ``nonrobust`` would have analysed.

The stack is the one ``tasks/cells/nonrobust.py::build`` pads (zeros past each cell's true m, d,
k); the store pads every cell again with zeros to the group's largest sizes (``Var(pad=0.0)``).
"""

from __future__ import annotations

import math

import torch

from tasks import kkt, nets
from tasks.reconstruct.objective import residual, residual_norm2
from tasks.cells.nonrobust import n_samples


def pack(net: nets.TwoLayer, X: torch.Tensor, y: torch.Tensor, cells: list[dict],
         gens: list[torch.Generator]) -> list[dict]:
    """Per cell: m_used, d_used, width_used, train_acc (fraction of y_i N(x_i) > 0, as
    ``nonrobust`` computes it), the parameters W (k,d), b (k), v (k), the data X (m,d), y (m)
    (float64, CPU; empty when the cell's ``store_nets`` is false), and the state of its minibatch
    generator after training (``random_direction`` continues that stream, as in ``nonrobust``)."""
    q = kkt.margins(net, X, y)
    out = []
    for e, c in enumerate(cells):
        m, d, k = n_samples(c), c["d"], c["width"]
        keep = c.get("store_nets", True)
        cut = (lambda t: t.numpy()) if keep else (lambda t: t[:0].numpy())  # noqa: E731 - empty: not stored
        out.append({
            "m_used": m, "d_used": d, "width_used": k, "nets_stored": int(keep),
            "train_acc": float((q[e, :m] > 0).double().mean()),
            "W": cut(net.W[e, :k, :d]), "b": cut(net.b[e, :k]), "v": cut(net.v[e, :k]),
            "X": cut(X[e, :m, :d]), "y": cut(y[e, :m]),
            "batch_rng_state": gens[e].get_state().numpy(),
        })
    return out


TRAJECTORY = ("iter", "log10_loss", "margin", "theta_norm", "eps_rel", "n_margin", "euler")


def log_marks(max_iters: int, points: int) -> list[int]:
    """Geometric logging steps 1 … max_iters (``points`` of them before rounding; duplicates dropped),
    for the ε*/‖θ‖ trajectory of paper 004 P004-10/11."""
    if points <= 0:
        return []
    if points == 1:
        return [max_iters]
    marks = [int(round(max_iters ** (i / (points - 1)))) for i in range(points)]
    return sorted(set(max(1, t) for t in marks))


def trajectory_point(net: nets.TwoLayer, X: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, loss: str,
                     iters: torch.Tensor, nnls_iters: int = 5000) -> dict[str, torch.Tensor]:
    """One row of the training trajectory (paper 004 §4 F004-1 "log loss, margin p, ‖θ‖, ε*/‖θ‖,
    #margin points"; P004-10/11), every net of the stack at once, float64, (E,) each:
    iter, log10 of the mean loss, margin p = min_i y_iΦ(x_i), ‖θ‖, ε*/‖θ‖ with ε* = min_{λ≥0} ‖θ − Σλ_i y_i
    ∇_θΦ(x_i)‖ (NNLS on the closed-form Gram, spec §2.3; the residual formed explicitly, exact step
    derivative), #margin points = #{λ_i > 1e-6 max λ}, and Euler's ratio h·p·Σλ/‖θ‖² (h = 2; 1 at a KKT
    point, P004-11)."""
    net = nets.TwoLayer(*(t.to(torch.float64) for t in (net.W, net.b, net.v)))
    X, y = X.to(torch.float64), y.to(torch.float64)
    q = y * net(X)
    p = q.masked_fill(~mask, math.inf).amin(1)
    lam = kkt.nnls(kkt.gram(net, X, y), 2 * q, mask, iters=nnls_iters)  # Jᵀθ = 2 y_iΦ(x_i) (Euler, h = 2)
    eps = residual_norm2(residual(net.W, net.b, net.v, X, y, lam)).sqrt()
    theta = net.sq_norm().sqrt()
    big = lam.amax(1, keepdim=True)
    return {"iter": iters.to(torch.float64), "log10_loss": nets.mean_log_loss(q, mask, loss) / math.log(10),
            "margin": p, "theta_norm": theta, "eps_rel": eps / theta,
            "n_margin": ((lam > 1e-6 * big) & (big > 0)).sum(1).to(torch.float64),
            "euler": 2 * p * lam.sum(1) / theta.pow(2)}
