"""Two-layer ReLU nets in the lazy regime (paper 003 §2.1; spec 003 §2.2-2.3), stacked on a
leading model axis E and stored in the project's :class:`TwoLayer` form.

``f(x) = m^{-1/2} Σ_s a_s σ(w_s·x + b_s)`` with a fixed top layer ``a_s = ±1``: as a
``TwoLayer`` this is ``v = a/√m`` (so every stage that reads "nets" reads these nets as they are).
Weights are W (E,m,d) (one row per hidden neuron), the lazy deviation ``U = W - W0``.
"""

from __future__ import annotations

import math

import torch

from tasks.nets.two_layer import TwoLayer


def init_lazy(d: int, m: int, generator: torch.Generator, *, bias: bool, dtype=torch.float64,
              device="cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One net's W0 (m,d) ~ N(0, I_d) per row, v = a/√m with a ~ unif{±1}, b0 (m) ~ U(±1/√d) when
    ``bias`` else 0 (spec 003 §2.2 Def. 2.1 and the bias variant). Drawn on the CPU in float64 from
    ``generator`` in this order (W0, a, b0), so the device never changes the draw."""
    W0 = torch.randn(m, d, generator=generator, dtype=torch.float64)
    a = torch.randint(0, 2, (m,), generator=generator).double() * 2 - 1
    b0 = (torch.rand(m, generator=generator, dtype=torch.float64) * 2 - 1) / math.sqrt(d)
    if not bias:
        b0 = torch.zeros_like(b0)
    return tuple(t.to(device=device, dtype=dtype) for t in (W0, a / math.sqrt(m), b0))


def input_grad(net: TwoLayer, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``f(x)`` (E,n) and the closed-form ``∇_x f = Σ_s v_s 1[w_s·x + b_s > 0] w_s`` (E,n,d)
    (spec 003 §2.2, σ'(0) := 0 as autograd); X (E,n,d)."""
    P = net.pre(X)
    act = P > 0
    f = torch.bmm(torch.relu(P), net.v.unsqueeze(-1)).squeeze(-1)
    g = torch.bmm(act.to(X.dtype) * net.v.unsqueeze(1), net.W)
    return f, g


def weight_grad(net: TwoLayer, X: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``Σ_i c_i ∂f(x_i)/∂W`` (E,m,d) and ``/∂b`` (E,m) for per-sample weights c (E,n): the
    closed form ``∂f/∂w_s = v_s 1[w_s·x + b_s > 0] x`` (spec 003 §2.2)."""
    M = (c.unsqueeze(-1) * (net.pre(X) > 0).to(X.dtype)) * net.v.unsqueeze(1)  # (E,n,m)
    return torch.bmm(M.transpose(1, 2), X), M.sum(1)


def logistic_dloss(z: torch.Tensor) -> torch.Tensor:
    """``ℓ'(z) = -1/(1+e^z) = -σ(-z)`` for ``ℓ(z) = softplus(-z)`` (spec 003 §2.4)."""
    return -torch.sigmoid(-z)


def col_norms(U: torch.Tensor) -> torch.Tensor:
    """Per-neuron ``||u_s||`` (E,m) of U (E,m,d)."""
    return U.norm(dim=-1)


def deviation_C0(U: torch.Tensor) -> torch.Tensor:
    """``C0_reached = √m ||U||_{2,∞}`` (E,) (spec 003 §2.3)."""
    return math.sqrt(U.shape[1]) * col_norms(U).amax(-1)


def project_ball(U: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    """Exact projection onto ``B_{2,∞}(0, V)`` per neuron: ``u_s min(1, V/||u_s||)`` (spec 003 §2.3);
    U (E,m,d), V (E,) per model."""
    n = col_norms(U)
    s = torch.clamp(V.unsqueeze(-1) / n.clamp_min(torch.finfo(U.dtype).tiny), max=1.0)
    return U * s.unsqueeze(-1)


def project_rows(Xt: torch.Tensor, X: torch.Tensor, R: torch.Tensor) -> torch.Tensor:
    """Projection onto ``B_{2,∞}(X, R)``: one l2 ball of radius R[e] per example (Alg. 1 line 5,
    spec 003 §2.3); Xt, X (E,n,d) (X may broadcast), R (E,)."""
    D = Xt - X
    n = D.norm(dim=-1)
    s = torch.clamp(R.unsqueeze(-1) / n.clamp_min(torch.finfo(Xt.dtype).tiny), max=1.0)
    return X + D * s.unsqueeze(-1)


def cone_C0(W: torch.Tensor, W0: torch.Tensor, iters: int = 80) -> torch.Tensor:
    """``C0_cone = √m min_{r>0} max_s ||r w_s - w_{s,0}||`` (E,) by golden-section search on log r
    over [1e-3, 1e3] (spec 003 §2.3; the objective is convex in r). W, W0 (E,m,d)."""
    E = W.shape[0]

    def obj(log_r):
        return (torch.exp(log_r)[:, None, None] * W - W0).norm(dim=-1).amax(-1)

    lo = torch.full((E,), math.log(1e-3), dtype=W.dtype, device=W.device)
    hi = torch.full((E,), math.log(1e3), dtype=W.dtype, device=W.device)
    phi = (math.sqrt(5) - 1) / 2
    for _ in range(iters):
        a, b = hi - phi * (hi - lo), lo + phi * (hi - lo)
        left = obj(a) <= obj(b)
        hi, lo = torch.where(left, b, hi), torch.where(left, lo, a)
    return math.sqrt(W.shape[1]) * obj((lo + hi) / 2)
