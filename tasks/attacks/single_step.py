"""The smallest single gradient step that flips the sign (paper 003 §5.1; spec 003 §2.7), exact
by a sort of the ReLU breakpoints along the ray, and its bisection oracle.

For ``u = -sign(f(x)) ∇_x f(x)`` the net along the ray, ``h(t) = f(x + t u) = Σ_s v_s σ(p_s + t q_s)``
with ``p = W x + b``, ``q = W u``, is piecewise linear; ``t*`` is its first root (``|η*| = t*``,
``δ* = t* u``). Stacked over E nets and chunked over examples; the cumulative sums over up to m
neurons run in float64 (spec 003 §7).
"""

from __future__ import annotations

import dataclasses

import torch

from tasks.nets.lazy import input_grad
from tasks.nets.two_layer import TwoLayer


@dataclasses.dataclass
class StepResult:
    """Per example (E,n): ``f`` = f(x), ``gnorm`` = ||∇_x f(x)||, ``t_star`` = |η*| (0 where f(x) = 0,
    inf where no positive step flips), ``t_lin`` = |f|/||∇f||² (the linearised prediction)."""

    f: torch.Tensor
    gnorm: torch.Tensor
    t_star: torch.Tensor
    t_lin: torch.Tensor


def _direction(net: TwoLayer, X: torch.Tensor):
    f, g = input_grad(net, X)
    s = torch.sign(f)
    gn = g.norm(dim=-1)
    t_lin = f.abs() / gn.pow(2).clamp_min(torch.finfo(X.dtype).tiny)
    return f, g, s, gn, t_lin


def exact_roots(p: torch.Tensor, q: torch.Tensor, v: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """First root t > 0 of ``h(t) = Σ_s v_s σ(p_s + t q_s)`` with ``sign h(0) = s`` (spec 003 §2.7).
    p, q (E,n,m), v (E,m), s (E,n). Float64 sort of the breakpoints ``τ = -p/q``, cumulative
    slopes/intercepts per segment, first segment whose end value changes sign."""
    p, q, v = p.double(), q.double(), v.double().unsqueeze(1)
    on0 = (p > 0) | ((p == 0) & (q > 0))  # active just after t = 0
    tau = -p / q
    cross = (q != 0) & (tau > 0) & torch.isfinite(tau) & ((p > 0) & (q < 0) | (p < 0) & (q > 0))
    tau = torch.where(cross, tau, torch.full_like(tau, float("inf")))
    A0 = (v * p * on0).sum(-1)  # (E,n): h = A + tB on the current segment
    B0 = (v * q * on0).sum(-1)
    sign = torch.where(q > 0, 1.0, -1.0).to(p.dtype) * cross  # +: turns on, -: turns off, 0: never crosses
    tau_s, order = torch.sort(tau, dim=-1)
    dA = torch.gather(sign * v * p, -1, order)
    dB = torch.gather(sign * v * q, -1, order)
    zero = torch.zeros_like(A0).unsqueeze(-1)
    A = A0.unsqueeze(-1) + torch.cat([zero, dA.cumsum(-1)], -1)  # (E,n,m+1), segment k
    B = B0.unsqueeze(-1) + torch.cat([zero, dB.cumsum(-1)], -1)
    start = torch.cat([zero, tau_s], -1)
    end = torch.cat([tau_s, torch.full_like(zero, float("inf"))], -1)
    sd = s.double().unsqueeze(-1)
    finite_end = torch.isfinite(end)
    h_end = A + torch.where(finite_end, end, torch.zeros_like(end)) * B
    hit = torch.where(finite_end, sd * h_end <= 0, sd * B < 0)
    hit &= start < float("inf")
    k = hit.to(torch.int8).argmax(-1, keepdim=True)
    found = hit.any(-1)
    Ak, Bk = A.gather(-1, k).squeeze(-1), B.gather(-1, k).squeeze(-1)
    lo, hi = start.gather(-1, k).squeeze(-1), end.gather(-1, k).squeeze(-1)
    r = torch.where(Bk != 0, -Ak / torch.where(Bk != 0, Bk, torch.ones_like(Bk)), lo)
    r = torch.minimum(torch.maximum(r, lo), hi)
    r = torch.where(found, r, torch.full_like(r, float("inf")))
    return torch.where(s == 0, torch.zeros_like(r), r)


BLOCKS = 10  # (E, chunk, m) float64/int64 blocks alive at once in the exact search (p, q, tau, sort, cumsums)


def chunk_for(E: int, m: int, budget_bytes: float, blocks: int = BLOCKS) -> int:
    """Examples per chunk so that ``blocks`` (E, chunk, m) 8-byte blocks fit ``budget_bytes``
    (spec 003 §7 "Memory": a 1e5-wide net never materialises a larger n x m block); at least 1."""
    return max(1, int(budget_bytes // (8 * blocks * max(E, 1) * max(m, 1))))


def single_step_exact(net: TwoLayer, X: torch.Tensor, *, chunk: int = 512, progress=None) -> StepResult:
    """The exact minimal flipping step for every example of X (E,n,d) against E nets (spec 003 §2.7).
    ``chunk`` examples at a time bound the (E, chunk, m) blocks (about 8 float64/int64 of them).
    ``progress`` (optional): called as ``progress(examples done, n)`` before each chunk and at the end."""
    outs = []
    for lo in range(0, X.shape[1], chunk):
        if progress is not None:
            progress(lo, X.shape[1])
        x = X[:, lo:lo + chunk]
        f, g, s, gn, t_lin = _direction(net, x)
        u = -s.unsqueeze(-1) * g
        p = net.pre(x)
        q = torch.bmm(u, net.W.transpose(1, 2))
        outs.append((f, gn, exact_roots(p, q, net.v, s).to(X.dtype), t_lin))
    if progress is not None:
        progress(X.shape[1], X.shape[1])
    return StepResult(*(torch.cat(z, 1) for z in zip(*outs)))


def single_step_bisect(net: TwoLayer, X: torch.Tensor, *, iters: int = 60, max_doublings: int = 60,
                       chunk: int = 512, progress=None) -> StepResult:
    """Oracle for :func:`single_step_exact` (spec 003 §2.7 "Fallback / test oracle"): bracket
    ``t_hi = 2^j t_lin`` until ``sign(f) h(t_hi) <= 0``, then bisect ``iters`` times; returns the
    upper end (a flipping step). Vectorised over all (E, n). ``progress`` as in :func:`single_step_exact`."""
    outs = []
    for lo in range(0, X.shape[1], chunk):
        if progress is not None:
            progress(lo, X.shape[1])
        x = X[:, lo:lo + chunk]
        f, g, s, gn, t_lin = _direction(net, x)
        u = -s.unsqueeze(-1) * g

        def flipped(t, s=s, x=x, u=u):
            return s * net(x + t.unsqueeze(-1) * u) <= 0

        hi = t_lin.clone()
        for _ in range(max_doublings):
            hi = torch.where(flipped(hi), hi, 2 * hi)
        ok = flipped(hi)
        a = torch.zeros_like(hi)
        for _ in range(iters):
            mid = (a + hi) / 2
            fm = flipped(mid)
            hi, a = torch.where(fm, mid, hi), torch.where(fm, a, mid)
        t = torch.where(ok, hi, torch.full_like(hi, float("inf")))
        outs.append((f, gn, torch.where(s == 0, torch.zeros_like(t), t), t_lin))
    if progress is not None:
        progress(X.shape[1], X.shape[1])
    return StepResult(*(torch.cat(z, 1) for z in zip(*outs)))
