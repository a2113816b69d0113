"""Attacks on stacked two-layer nets (paper 002 Sec. 6, spec §2.8-2.9).

The paper's attack is universal: one direction ẑ for all margin samples, and the reported
number is the smallest c > 0 that flips all of them at once,

    c* = inf { c > 0 : max_{i∈I} y_i N(x_i - y_i c ẑ) < 0 }.

Along the ray each f_i(c) = y_i N(x_i - y_i c ẑ) is piecewise linear with one breakpoint per
neuron, so c* is computed exactly: each {c > 0 : f_i(c) < 0} is a finite union of open intervals
read off the sorted breakpoints, and c* is the infimum of their intersection over i ∈ I (strict
< 0: a stretch where f_i is exactly 0 is not a flip). Bisection on the predicate, with a
brute-force scan for the bracket, is kept as the test oracle. Directions live in
``tasks/attacks/directions.py``.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from tasks.nets import TwoLayer


@dataclasses.dataclass
class FlipResult:
    c_star: torch.Tensor  # (E,) smallest simultaneous flip size (inf if none below the cap)
    r: torch.Tensor  # (E,m) r_i = inf{c > 0 : f_i(c) < 0} per sample (inf if never, NaN outside I)
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


def _negative_intervals(a, beta, v, y):
    """The set {c > 0 : f_i(c) < 0} of every sample as one open interval (lo, hi) per segment.

    f_i is linear between consecutive sorted breakpoints T (k+1 segments, the last one to +∞):
    on segment n, f_i(c) = A_n - c B_n, with A, B summed over the neurons active there. Only
    finite breakpoints toggle a neuron. The value at each breakpoint is shared by the two
    segments that meet there, and it is exactly 0 next to a segment with no active neuron (a zero
    plateau), so the intervals of adjacent segments meet exactly and a plateau at 0 is never
    negative. Returns lo, hi (E,m,k+1), empty segments as lo = hi = inf.
    """
    yv = y.unsqueeze(-1) * v.unsqueeze(1)  # (E,m,k)
    active0 = (a > 0) | ((a == 0) & (beta < 0))  # on just after c = 0
    toggles = (active0 & (beta > 0)) | (~active0 & (beta < 0))
    t = torch.where(toggles, a / beta, torch.full_like(a, math.inf))
    t, order = torch.sort(t, dim=-1)
    finite = torch.isfinite(t)
    sign = torch.gather(torch.where(active0, -1.0, 1.0).to(a.dtype), -1, order) * finite  # +1 on, -1 off, 0 never
    live = (v != 0).unsqueeze(1).expand_as(a)
    dA = sign * torch.gather(yv * a, -1, order)
    dB = sign * torch.gather(yv * beta, -1, order)
    dn = sign.to(torch.int64) * torch.gather(live, -1, order)
    A0 = (active0 * yv * a).sum(-1, keepdim=True)
    B0 = (active0 * yv * beta).sum(-1, keepdim=True)
    n0 = (active0 & live).sum(-1, keepdim=True)
    A = torch.cat([A0, A0 + torch.cumsum(dA, -1)], -1)  # (E,m,k+1): f = A - c B on segment n
    B = torch.cat([B0, B0 + torch.cumsum(dB, -1)], -1)
    n_on = torch.cat([n0, n0 + torch.cumsum(dn, -1)], -1)
    zero_seg = n_on == 0
    A, B = A.masked_fill(zero_seg, 0.0), B.masked_fill(zero_seg, 0.0)
    # value at breakpoint n (end of segment n, start of n+1); exactly 0 beside a zero plateau
    fT = torch.where(zero_seg[..., :-1] | zero_seg[..., 1:], torch.zeros_like(t), A[..., :-1] - t * B[..., :-1])
    fT = torch.where(finite, fT, torch.zeros_like(fT))
    f0 = torch.where(zero_seg[..., :1], torch.zeros_like(A0), A0)  # f(0)
    s = torch.cat([torch.zeros_like(t[..., :1]), t], -1)  # segment starts (inf: no segment)
    e = torch.cat([t, torch.full_like(t[..., :1], math.inf)], -1)  # segment ends
    fs = torch.cat([f0, fT], -1)
    fe = torch.cat([fT, torch.zeros_like(f0)], -1)
    tail = torch.isinf(e) & torch.isfinite(s)  # the last segment, up to +∞
    # bounded segments: linear from fs to fe
    frac = fs / torch.where(fs - fe != 0, fs - fe, torch.ones_like(fs))
    cross = s + (e - s) * frac
    lo = torch.where(fs < 0, s, torch.where(fe < 0, cross, e))
    hi = torch.where(fe < 0, e, torch.where(fs < 0, cross, s))
    # the last segment: f = fs - B (c - s)
    B_tail = B
    root = s + fs / torch.where(B_tail != 0, B_tail, torch.ones_like(B_tail))
    lo_t = torch.where(fs < 0, s, torch.where(B_tail > 0, root, torch.full_like(s, math.inf)))
    hi_t = torch.where(B_tail < 0, torch.where(fs < 0, root, s), torch.full_like(s, math.inf))
    lo, hi = torch.where(tail, lo_t, lo), torch.where(tail, hi_t, hi)
    empty = ~(lo < hi) | torch.isinf(s)
    inf = torch.full_like(lo, math.inf)
    return torch.where(empty, inf, lo), torch.where(empty, inf, hi)


def _next_negative(lo, hi, c):
    """Per sample, the smallest c' >= c with f_i(c'+) < 0 (inf if none): lo, hi (E,m,K), c (E,) -> (E,m)."""
    c = c.view(-1, 1, 1)
    inside = ((lo <= c) & (c < hi)).any(-1)
    ahead = torch.where(lo > c, lo, torch.full_like(lo, math.inf)).min(-1).values
    return torch.where(inside, c.view(-1, 1).expand_as(ahead), ahead)


def _intervals(net: TwoLayer, X, y, z_hat, max_elems: int = 2 ** 24):
    """``_negative_intervals`` of every sample, in chunks of samples (memory O(chunk · k) for the
    temporaries, spec §2.9): lo, hi (E,m,k+1)."""
    E, m, _ = X.shape
    step = max(1, max_elems // (E * max(1, net.W.shape[1])))
    parts = [_negative_intervals(*_ray(net, X[:, i:i + step], y[:, i:i + step], z_hat), net.v, y[:, i:i + step])
             for i in range(0, m, step)]
    return torch.cat([p[0] for p in parts], 1), torch.cat([p[1] for p in parts], 1)


def first_roots(net: TwoLayer, X, y, z_hat) -> torch.Tensor:
    """r_i = inf{c > 0 : f_i(c) < 0} for every sample, exactly (spec §2.9): (E,m), inf if never.

    A zero plateau is not a flip: f_i = 0 on [1, 2] and < 0 after 2 gives r_i = 2."""
    lo, hi = _intervals(net, X, y, z_hat)
    return _next_negative(lo, hi, torch.zeros(X.shape[0], dtype=X.dtype, device=X.device))


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
    """Exact c* = inf{c > 0 : f_i(c) < 0 for every i ∈ I} (spec §2.9), (E,) with per-sample roots.

    Each {c : f_i(c) < 0} is a finite union of open intervals (``_negative_intervals``). Starting
    from c = 0, every i ∈ I moves c to the next point ≥ c where f_i is negative just after it, and c
    becomes the largest of those: the first step gives c0 = max_{i∈I} r_i, and c stops exactly when
    every f_i (i ∈ I) is negative just past c, which is then c*. Each step passes at least one
    interval start, so the loop ends; the usual case stops at c0 (``simultaneous_at_c0``). c* is inf
    above ``cap`` or when I is empty.
    """
    E = X.shape[0]
    lo, hi = _intervals(net, X, y, z_hat)
    cap = torch.as_tensor(cap, dtype=X.dtype, device=X.device).expand(E)
    nonempty = I.any(1)
    r = _next_negative(lo, hi, torch.zeros(E, dtype=X.dtype, device=X.device))
    c0 = r.masked_fill(~I, -math.inf).max(1).values
    c0 = torch.where(nonempty, c0, torch.full_like(c0, math.inf))
    c, steps = c0, 0
    while True:  # c only grows, over the finitely many interval starts
        nxt = _next_negative(lo, hi, torch.where(torch.isfinite(c), c, torch.zeros_like(c)))
        nxt = torch.where(torch.isfinite(c).unsqueeze(1), nxt, torch.full_like(nxt, math.inf))
        new = nxt.masked_fill(~I, -math.inf).max(1).values
        new = torch.where(nonempty, new, c)
        if steps == 0:
            simultaneous = torch.isfinite(c0) & (new == c0)
        moved = (new > c) & (c <= cap)
        c = torch.where(moved, new, c)
        steps += 1
        if not moved.any():
            break
    c_star = torch.where(c <= cap, c, torch.full_like(c, math.inf))
    return FlipResult(c_star=c_star, r=r.masked_fill(~I, math.nan), simultaneous_at_c0=simultaneous)


def _first_flip_on_grid(net: TwoLayer, X, y, I, z_hat, cap: torch.Tensor, scan: int):
    """Brackets (lo, hi) of the first grid point in [0, cap] where every i ∈ I is flipped; hi = inf
    where none is (brute force over ``scan + 1`` evenly spaced c, each net on its own grid)."""
    E, m, d = X.shape
    grid = torch.linspace(0, 1, scan + 1, dtype=X.dtype, device=X.device)
    hi = torch.full((E,), math.inf, dtype=X.dtype, device=X.device)
    lo = torch.zeros_like(hi)
    chunk = max(1, 2 ** 22 // (E * m * net.W.shape[1]))
    for part in torch.split(grid, chunk):
        cs = cap.unsqueeze(1) * part  # (E,n)
        Xc = X.unsqueeze(1) - (cs.unsqueeze(-1) * y.unsqueeze(1)).unsqueeze(-1) * z_hat[:, None, None, :]  # (E,n,m,d)
        f = y.unsqueeze(1) * net(Xc.reshape(E, -1, d)).view(E, len(part), m)
        ok = ((f < 0) | ~I.unsqueeze(1)).all(-1)  # (E,n)
        first = ok.to(torch.int8).argmax(1, keepdim=True)
        new = ok.any(1) & torch.isinf(hi)
        c_hit = torch.gather(cs, 1, first).squeeze(1)
        hi = torch.where(new, c_hit, hi)
        lo = torch.where(new, (c_hit - cap / scan).clamp_min(0), lo)
        if torch.isfinite(hi).all():
            break
    return lo, hi


def c_star_bisection(net: TwoLayer, X, y, I, z_hat, *, cap: torch.Tensor, iters: int = 60,
                     scan: int = 0) -> torch.Tensor:
    """Bisection on the flip predicate (the test oracle, §2.9): (E,), inf where nothing below ``cap`` flips.

    The bracket comes from a capped doubling search from c = 1 (``scan = 0``; right when the flip
    set {c : max_i f_i(c) < 0} is one interval) or, with ``scan > 0``, from the first of
    ``scan + 1`` evenly spaced points of [0, cap] that flips every i ∈ I (brute force: right for
    non-monotone f_i too, unless the first flip interval is narrower than cap / scan).
    """
    E = X.shape[0]
    cap = torch.as_tensor(cap, dtype=X.dtype, device=X.device).expand(E)
    if scan:
        lo, hi = _first_flip_on_grid(net, X, y, I, z_hat, cap, scan)
        found = torch.isfinite(hi)
        hi = torch.where(found, hi, cap)
    else:
        hi = torch.ones(E, dtype=X.dtype, device=X.device)
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
