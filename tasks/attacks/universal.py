"""Attacks on stacked two-layer nets (paper 002 Sec. 6, spec §2.8-2.9).

The paper's attack is universal: one direction ẑ for all margin samples, and the reported
number is the smallest c > 0 that flips all of them at once,

    c* = inf { c > 0 : max_{i∈I} y_i N(x_i - y_i c ẑ) < 0 }.

Along the ray each f_i(c) = y_i N(x_i - y_i c ẑ) is piecewise linear with one breakpoint per
neuron, so c* is computed exactly (sort the breakpoints, cumulative-sum the slopes); bisection
on the predicate is kept as the test oracle. Directions live in ``tasks/attacks/directions.py``.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from tasks.nets import TwoLayer


@dataclasses.dataclass
class FlipResult:
    c_star: torch.Tensor  # (E,) smallest simultaneous flip size (inf if none below the cap)
    r: torch.Tensor  # (E,m) first root of f_i per sample (inf if never, NaN outside I)
    simultaneous_at_c0: torch.Tensor  # (E,) bool: c* = max_i r_i (the usual case)


def _ray(net: TwoLayer, X, y, z_hat):
    """Per (sample, neuron): a_ij = w_j·x_i + b_j and β_ij = y_i w_j·ẑ."""
    a = net.pre(X)
    wz = torch.bmm(net.W, z_hat.unsqueeze(-1)).squeeze(-1)  # (E,k)
    beta = y.unsqueeze(-1) * wz.unsqueeze(1)
    return a, beta


def f_along(net: TwoLayer, X, y, z_hat, c: torch.Tensor) -> torch.Tensor:
    """f_i(c) = y_i N(x_i - y_i c ẑ) for c of shape (E,) or (E,m): (E,m)."""
    c = c.unsqueeze(1) if c.dim() == 1 else c
    Xp = X - (y * c).unsqueeze(-1) * z_hat.unsqueeze(1)
    return y * net(Xp)


def _segments(a, beta, v, y):
    """Sorted breakpoints and the values/slopes of f_i on each segment between them."""
    active0 = (a > 0) | ((a == 0) & (beta < 0))
    s0 = -y * (active0 * v.unsqueeze(1) * beta).sum(-1)  # slope at 0+
    f0 = y * (torch.relu(a) * v.unsqueeze(1)).sum(-1)
    toggles = (active0 & (beta > 0)) | (~active0 & (beta < 0))
    t = torch.where(toggles, a / beta, torch.full_like(a, math.inf))
    t, order = torch.sort(t, dim=-1)
    dslope = torch.gather(y.unsqueeze(-1) * v.unsqueeze(1) * beta.abs(), -1, order)
    finite = torch.isfinite(t)
    t_start = torch.cat([torch.zeros_like(t[..., :1]), t[..., :-1]], -1)
    dt = torch.where(finite, t - t_start, torch.zeros_like(t))
    slope = torch.cat([s0.unsqueeze(-1), s0.unsqueeze(-1) + torch.cumsum(dslope, -1)], -1)  # k+1 segments
    f_end = f0.unsqueeze(-1) + torch.cumsum(slope[..., :-1] * dt, -1)  # value at each breakpoint
    f_start = torch.cat([f0.unsqueeze(-1), f_end[..., :-1]], -1)
    return t, t_start, finite, slope, f0, f_start, f_end


def first_roots(net: TwoLayer, X, y, z_hat) -> torch.Tensor:
    """First c > 0 with f_i(c) <= 0 for every sample, exactly (spec §2.9): (E,m)."""
    a, beta = _ray(net, X, y, z_hat)
    t, t_start, finite, slope, f0, f_start, f_end = _segments(a, beta, net.v, y)
    cross = finite & (f_end <= 0)
    has = cross.any(-1)
    n = cross.to(torch.int8).argmax(-1, keepdim=True)
    ts, fs, sl = (torch.gather(x, -1, n).squeeze(-1) for x in (t_start, f_start, slope[..., :-1]))
    r_in = ts + fs / (-sl)
    # after the last finite breakpoint: f = f_last + slope_final (c - t_last)
    last = finite.sum(-1, keepdim=True) - 1
    t_last = torch.where(last >= 0, torch.gather(t, -1, last.clamp_min(0)), torch.zeros_like(last, dtype=t.dtype)).squeeze(-1)
    f_last = torch.where(last >= 0, torch.gather(f_end, -1, last.clamp_min(0)), f0.unsqueeze(-1)).squeeze(-1)
    s_fin = slope[..., -1]
    r_tail = torch.where(s_fin < 0, t_last + f_last / (-s_fin), torch.full_like(s_fin, math.inf))
    r = torch.where(has, r_in, r_tail)
    return torch.where(f0 <= 0, torch.zeros_like(r), r)


def _all_down_roots(net: TwoLayer, X, y, z_hat) -> torch.Tensor:
    """Every c where some f_i crosses from > 0 to <= 0 (candidates for c*), one net: (n,)."""
    a, beta = _ray(net, X, y, z_hat)
    t, t_start, finite, slope, f0, f_start, f_end = _segments(a, beta, net.v, y)
    down = finite & (f_start > 0) & (f_end <= 0)
    roots = (t_start + f_start / (-slope[..., :-1]))[down]
    last = finite.sum(-1) - 1
    t_last = torch.where(last >= 0, torch.gather(t, -1, last.clamp_min(0).unsqueeze(-1)).squeeze(-1), torch.zeros_like(f0))
    f_last = torch.where(last >= 0, torch.gather(f_end, -1, last.clamp_min(0).unsqueeze(-1)).squeeze(-1), f0)
    tail = (f_last > 0) & (slope[..., -1] < 0)
    roots = torch.cat([roots, (t_last + f_last / (-slope[..., -1]))[tail]])
    return torch.sort(roots).values


def flips_all(net: TwoLayer, X, y, I, z_hat, c: torch.Tensor) -> torch.Tensor:
    """Predicate: every i ∈ I has y_i N(x_i - y_i c ẑ) < 0. c (E,) -> (E,) bool."""
    f = f_along(net, X, y, z_hat, c)
    return (f < 0).logical_or(~I).all(1)


def flipped_fraction(net: TwoLayer, X, y, valid, z_hat, c: torch.Tensor) -> torch.Tensor:
    """Fraction of the valid samples with y_i N(x_i - y_i c ẑ) < 0, just past c (E,); c may be inf."""
    finite = torch.where(torch.isfinite(c), c, torch.zeros_like(c))
    f = f_along(net, X, y, z_hat, finite * (1 + 1e-9) + 1e-12)
    frac = ((f < 0) & valid).sum(1) / valid.sum(1)
    return torch.where(torch.isfinite(c), frac, torch.full_like(frac, math.nan))


def c_star_exact(net: TwoLayer, X, y, I, z_hat, *, cap: float | torch.Tensor = math.inf) -> FlipResult:
    """Exact c* (spec §2.9): c0 = max_{i∈I} r_i, verified; non-monotone cases scan all roots."""
    r = first_roots(net, X, y, z_hat)
    c0 = r.masked_fill(~I, -math.inf).max(1).values
    probe = c0 * (1 + 1e-9) + 1e-12
    ok = torch.isfinite(c0) & flips_all(net, X, y, I, z_hat, torch.where(torch.isfinite(probe), probe, torch.zeros_like(probe)))
    c_star = torch.where(ok, c0, torch.full_like(c0, math.inf))
    for e in torch.nonzero(~ok & torch.isfinite(c0)).flatten().tolist():  # rare fallback
        one = net.select(slice(e, e + 1))
        cand = _all_down_roots(one, X[e:e + 1, I[e]], y[e:e + 1, I[e]], z_hat[e:e + 1])
        cand = cand[cand >= c0[e]]
        for chunk in torch.split(cand, 256):
            probes = chunk * (1 + 1e-9) + 1e-12
            Xs = X[e, I[e]].expand(len(chunk), -1, -1)
            ys = y[e, I[e]].expand(len(chunk), -1)
            rep = one.select([0] * len(chunk))
            good = flips_all(rep, Xs, ys, torch.ones_like(ys, dtype=torch.bool), z_hat[e].expand(len(chunk), -1), probes)
            if good.any():
                c_star[e] = chunk[int(good.to(torch.int8).argmax())]
                break
    c_star = torch.where(c_star <= torch.as_tensor(cap, dtype=c_star.dtype, device=c_star.device), c_star,
                         torch.full_like(c_star, math.inf))
    return FlipResult(c_star=c_star, r=r.masked_fill(~I, math.nan), simultaneous_at_c0=ok)


def c_star_bisection(net: TwoLayer, X, y, I, z_hat, *, cap: torch.Tensor, iters: int = 60) -> torch.Tensor:
    """Bisection on the flip predicate with a capped doubling search (the test oracle, §2.9)."""
    E = X.shape[0]
    hi = torch.ones(E, dtype=X.dtype, device=X.device)
    cap = torch.as_tensor(cap, dtype=X.dtype, device=X.device).expand(E)
    while True:
        need = ~flips_all(net, X, y, I, z_hat, hi) & (hi < cap)
        if not need.any():
            break
        hi = torch.where(need, torch.minimum(hi * 2, cap), hi)
    found = flips_all(net, X, y, I, z_hat, hi)
    lo = torch.zeros_like(hi)
    for _ in range(iters):
        mid = (lo + hi) / 2
        ok = flips_all(net, X, y, I, z_hat, mid)
        hi, lo = torch.where(ok, mid, hi), torch.where(ok, lo, mid)
    return torch.where(found, hi, torch.full_like(hi, math.inf))
