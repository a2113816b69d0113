"""Paper 000 (forging sets): models, batched forging membership, mixed Hessian and nullity.

Spec IDs: D000-1 (Eq 1), D000-2 (linreg), D000-3 (one-hidden-layer ReLU, Eq 20), D000-4 (general
smooth model, M0 = ∇_x∇_w f), D000-6 (batch forging, Eq 41-43), T000-9/T000-10 (nullity), §3
"Computing r and L numerically".

All models are squared losses with a scalar output, f(w; (z, t)) = ½(φ(w; z) - t)², written as
torch functions of a *flat* float64 parameter vector ``w`` and a data vector ``x = (z, t)`` (the
label is the last coordinate), so that torch.func (grad / vmap / jacfwd) applies to any of them.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import torch
from torch.func import grad, jacfwd, jvp, vmap

__all__ = [
    "SquaredLossModel", "MODELS", "make_model", "make_target", "grad_w", "feature_grad",
    "forging_mismatch", "in_forging_set", "mixed_hessian", "nullity", "estimate_lipschitz",
    "batch_mixed_hessian", "batch_forging_mismatch", "whole_batch_mismatch", "relu_unbounded",
]

Phi = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclasses.dataclass(frozen=True)
class SquaredLossModel:
    """f(w; (z, t)) = ½(φ(w; z) - t)², parameters ``w`` flat (float64), data dim d (+1 label)."""

    name: str
    phi: Phi
    w: torch.Tensor
    d: int
    width: int = 0  # hidden width n (0 for linreg)

    def loss(self, w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * (self.phi(w, x[:-1]) - x[-1]) ** 2

    @property
    def n_params(self) -> int:
        return self.w.numel()

    def split(self, w: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(W (n, d), v (n)) of a one-hidden-layer model."""
        w = self.w if w is None else w
        n, d = self.width, self.d
        return w[: n * d].reshape(n, d), w[n * d:]


def _relu(u: torch.Tensor) -> torch.Tensor:
    # ρ(u) = u 1[u > 0]: autograd gives ρ'(u) = 1[u > 0], pinning ρ'(0) = 0 (spec §6.8, D000-3).
    return u * (u > 0).to(u.dtype)


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu1": _relu,
    "tanh1": torch.tanh,
    "softplus1": torch.nn.functional.softplus,
}
MODELS = ("linreg", *ACTIVATIONS)


# ρ' as autograd differentiates each activation (softplus is linear above its threshold 20)
DERIVATIVES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu1": lambda u: (u > 0).to(u.dtype),
    "tanh1": lambda u: 1 - torch.tanh(u) ** 2,
    "softplus1": lambda u: torch.where(u > 20, torch.ones_like(u), torch.sigmoid(u)),
}


def _one_layer_phi(d: int, n: int, act: Callable[[torch.Tensor], torch.Tensor]) -> Phi:
    def phi(w: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        W, v = w[: n * d].reshape(n, d), w[n * d:]
        return v @ act(W @ z)

    return phi


def _linreg_phi(w: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    return z @ w


def make_model(name: str, d: int, width: int, generator: torch.Generator) -> SquaredLossModel:
    """linreg: φ = zᵀw, w ~ N(0, I_d). One-layer nets: φ = vᵀρ(Wz), W ~ N(0, 1/d), v ~ N(0, 1)."""
    if name not in MODELS:
        raise ValueError(f"model must be one of {MODELS}, got {name!r}")
    if int(d) != d or d < 1:
        raise ValueError(f"d must be an integer >= 1, got {d!r}")
    kw = dict(dtype=torch.float64, generator=generator)
    if name == "linreg":
        return SquaredLossModel(name, _linreg_phi, torch.randn(d, **kw), d)
    if int(width) != width or width < 1:
        raise ValueError(f"width must be an integer >= 1 for {name}, got {width!r}")
    W = torch.randn(width, d, **kw) / math.sqrt(d)
    v = torch.randn(width, **kw)
    phi = _one_layer_phi(d, width, ACTIVATIONS[name])
    phi.activation = name  # marks the closed-form gradients of feature_grad / grad_w
    return SquaredLossModel(name, phi, torch.cat([W.reshape(-1), v]), d, width)


def _closed_form(model: SquaredLossModel, Z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(φ(z), ∇_w φ(z)) for a batch Z (N, d) as batched matrix products, for the models that
    :func:`make_model` builds (linreg: φ = zᵀw, ∇ = z; one layer: φ = vᵀρ(Wz), ∇_W = (v ⊙ ρ'(Wz)) zᵀ,
    ∇_v = ρ(Wz)); None for any other φ. Issue 19: 2.0x (CPU time) / 2.95x (wall) vmap(grad) on a CPU
    (benchmarks/results/kernel_alternatives_forging.json), equal to it to round-off
    (tests/test_forging_grad_issue19.py)."""
    phi = getattr(model, "phi", None)  # duck-typed models (problems._LossModel) have only a loss
    if phi is _linreg_phi:
        return Z @ model.w, Z
    act = getattr(phi, "activation", None)
    if act not in DERIVATIVES:
        return None
    W, v = model.split()
    H = Z @ W.T  # (N, n)
    A = ACTIVATIONS[act](H)
    gW = (DERIVATIVES[act](H) * v).unsqueeze(-1) * Z.unsqueeze(1)  # (N, n, d)
    return A @ v, torch.cat([gW.flatten(1), A], 1)


def feature_grad(model: SquaredLossModel, Z: torch.Tensor) -> torch.Tensor:
    """h(z) = ∇_w φ(w; z) for a batch Z (N, d) -> (N, n_params) (spec T000-2 generalisation); in
    closed form for the models of :func:`make_model`, torch.func vmap(grad) for any other φ."""
    closed = _closed_form(model, Z)
    if closed is not None:
        return closed[1]
    return vmap(grad(model.phi, argnums=0), in_dims=(None, 0))(model.w, Z)


def make_target(model: SquaredLossModel, A: float, generator: torch.Generator,
                max_tries: int = 100) -> torch.Tensor:
    """x* = (z*, y*) with z* ~ N(0, I_d) and y* = φ(z*) - A/||h(z*)||, so ||∇_w f(x*)|| = A (spec §4).

    For ReLU nets z* is redrawn (same generator, deterministic) until both gradient blocks are
    non-zero (hypothesis of Props 3-4).
    """
    if not (A > 0 and math.isfinite(A)):
        raise ValueError(f"A must be a finite number > 0, got {A!r}")
    for _ in range(max_tries):
        z = torch.randn(model.d, dtype=torch.float64, generator=generator)
        h = feature_grad(model, z[None])[0]
        if model.width and (h[: model.width * model.d].norm() == 0 or h[model.width * model.d:].norm() == 0):
            continue
        return torch.cat([z, (model.phi(model.w, z) - A / h.norm())[None]])
    raise ValueError(f"could not draw a target with non-zero gradient blocks for {model.name} in {max_tries} tries")


def grad_w(model: SquaredLossModel, X: torch.Tensor) -> torch.Tensor:
    """∇_w f(w; x) = (φ(z) - t) ∇_w φ(z) for a batch X (N, d+1) -> (N, n_params): closed form for
    the models of :func:`make_model`, torch.func vmap(grad) for any other φ."""
    closed = _closed_form(model, X[:, :-1])
    if closed is not None:
        phi, h = closed
        return (phi - X[:, -1]).unsqueeze(-1) * h
    return vmap(grad(model.loss, argnums=0), in_dims=(None, 0))(model.w, X)


def forging_mismatch(model: SquaredLossModel, x_star: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
    """||∇_w f(w; x) - ∇_w f(w; x*)|| for each row of X (Eq 1, 10, 20; Frobenius = flat norm)."""
    g_star = grad(model.loss, argnums=0)(model.w, x_star)
    return (grad_w(model, X) - g_star).norm(dim=-1)


def in_forging_set(model: SquaredLossModel, x_star: torch.Tensor, X: torch.Tensor, eps: float) -> torch.Tensor:
    """Boolean membership of each row of X in S_eps(w, x*) (no domain restriction)."""
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps!r}")
    return forging_mismatch(model, x_star, X) <= eps


def mixed_hessian(loss: Callable, w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """M0 = ∇_x∇_w f (D000-4): (n, D) with entry [i, j] = ∂²f/∂x_j∂w_i.

    jacfwd over x of grad over w when D <= n, else jacrev (spec §3, "Computing r")."""
    inner = grad(loss, argnums=0)
    if x.numel() <= w.numel():
        return jacfwd(inner, argnums=1)(w, x)
    return torch.func.jacrev(inner, argnums=1)(w, x)


def nullity(M: torch.Tensor, rtol: float | None = None) -> tuple[int, torch.Tensor]:
    """r = D - #{σ_i > tol} for M (n, D) and the singular values (float64 only, spec §6.7).

    tol = max(n, D) · eps_float64 · σ_max (NumPy's default) when ``rtol`` is None, else rtol · σ_max.
    """
    if M.dtype != torch.float64:
        raise ValueError("M must be float64 for rank decisions (spec §6.7)")
    s = torch.linalg.svdvals(M)
    smax = s.max() if s.numel() else torch.tensor(0.0, dtype=M.dtype)
    tol = (max(M.shape) * torch.finfo(torch.float64).eps if rtol is None else rtol) * smax
    return int(M.shape[1] - int((s > tol).sum())), s


def estimate_lipschitz(loss: Callable, w: torch.Tensor, center: torch.Tensor, radius: float,
                       n_pairs: int, generator: torch.Generator) -> float:
    """Estimate (a lower bound on) L = Lip of x -> M(w, x) in operator norm on B_radius(center):
    max of ||M(x1) - M(x2)||_2/||x1 - x2|| over random pairs and of ||∂_u M(x)||_2 (jvp) over random
    points and unit directions u (spec §3)."""
    if n_pairs < 1 or not radius > 0:
        raise ValueError("n_pairs must be >= 1 and radius > 0")
    D = center.numel()
    kw = dict(dtype=torch.float64, generator=generator)

    def ball(k: int) -> torch.Tensor:
        u = torch.randn(k, D, **kw)
        u = u / u.norm(dim=1, keepdim=True)
        return center + radius * torch.rand(k, 1, **kw) ** (1.0 / D) * u

    M = vmap(lambda x: mixed_hessian(loss, w, x))
    X1, X2 = ball(n_pairs), ball(n_pairs)
    diff = torch.linalg.matrix_norm(M(X1) - M(X2), ord=2) / (X1 - X2).norm(dim=1)
    U = torch.randn(n_pairs, D, **kw)
    U = U / U.norm(dim=1, keepdim=True)
    dM = vmap(lambda x, u: jvp(lambda y: mixed_hessian(loss, w, y), (x,), (u,))[1])(X1, U)
    return float(torch.maximum(diff.max(), torch.linalg.matrix_norm(dM, ord=2).max()))


def relu_unbounded(model: SquaredLossModel, x_star: torch.Tensor, eps: float) -> bool:
    """True when the ReLU forging set has infinite volume with t unrestricted (spec T000-4, §6.4):
    eps >= ||∇f(x*)||_F and the all-off cone {Wz <= 0} has interior (LP: ∃ z with Wz <= -1)."""
    if model.name != "relu1":
        return False
    if eps < float(grad(model.loss, argnums=0)(model.w, x_star).norm()):
        return False
    from scipy.optimize import linprog

    W, _ = model.split()
    res = linprog(c=[0.0] * model.d, A_ub=W.numpy(), b_ub=[-1.0] * model.width, bounds=[(None, None)] * model.d)
    return bool(res.status == 0)


# --- §5 batch forging ------------------------------------------------------------------------

def batch_mixed_hessian(loss: Callable, w: torch.Tensor, X: torch.Tensor, B: int) -> torch.Tensor:
    """Eq 42: ∇_X∇_w F = (1/B)[M(w, x_1) | ... | M(w, x_m)] (n × md) for X (m, D)."""
    if int(B) != B or B < X.shape[0]:
        raise ValueError(f"B must be an integer >= m = {X.shape[0]}, got {B!r}")
    Ms = vmap(lambda x: mixed_hessian(loss, w, x))(X)  # (m, n, D)
    return Ms.permute(1, 0, 2).reshape(w.numel(), -1) / B


def batch_forging_mismatch(model: SquaredLossModel, x_star: torch.Tensor, Xt: torch.Tensor, B: int) -> torch.Tensor:
    """Eq 41: ||(1/B) Σ_j (∇f(x*) - ∇f(x̃_j))|| for replacement sets Xt (N, m, D) -> (N,)."""
    N, m, D = Xt.shape
    if int(B) != B or B < m:
        raise ValueError(f"B must be an integer >= m = {m}, got {B!r}")
    g_star = grad(model.loss, argnums=0)(model.w, x_star)
    G = grad_w(model, Xt.reshape(N * m, D)).reshape(N, m, -1)
    return (g_star[None, None] - G).sum(1).norm(dim=-1) / B


def whole_batch_mismatch(model: SquaredLossModel, batch: torch.Tensor, new_batches: torch.Tensor) -> torch.Tensor:
    """Remark 7: replace the whole batch (B, D) by each of new_batches (N, B, D): ||mean ∇f - mean ∇f̃||."""
    B, D = batch.shape
    g = grad_w(model, batch).mean(0)
    N = new_batches.shape[0]
    G = grad_w(model, new_batches.reshape(N * B, D)).reshape(N, B, -1).mean(1)
    return (G - g[None]).norm(dim=-1)
