"""The cell of experiment ``kkt_constructions`` (paper 004 F004-3, spec §4 F004-3, §3.1-3.7): the
non-uniqueness constructions checked on a stored trained net, numbers out.

Per net (θ = (W, b, v), its training set S with the NNLS multipliers λ of the raw net, spec §2.3):
(a) SPLIT / MERGE (Lemmas 2-3): ``n_ops`` splits along ν = U_d (App C), each of another support point
    (λ_i > 1e-6 max λ), α = ½ α_max, β = 0.3 β_max (asymmetric, so swapped multipliers would show),
    then the merges of the pieces, in reverse order; after each operation ‖R(S_t) − R(S_0)‖/‖θ‖ (exact
    step derivative); it should stay at round-off.
(b) Thm 4 (n < d): the net exactified (W projected on span X, spec §3.3 (a)), far sets S_τ for
    τ ∈ TAUS: d(S, S_τ), ‖ΔR‖/‖θ‖, max relative change of |Φ|, pattern kept. NaN when n ≥ d.
(c) Thm 5 / Thm 8 per training point along ν = U_d: B8 (raw net, ε = ε*), B5 (corrected, with |v_j|,
    at the exact W-block W − R_W, as tests/test_reconstruct_lemmas.py::P004-7), the printed B5
    (no |v_j|), and the exact admissible range; the fraction with bound ≤ range, and with the
    pattern kept by splits at ±0.99·B8. (All bounds and ranges are scale-free: B(cθ) = B(θ).)
(e) App C: γ(U_d) = max_i |⟨x_i, U_d⟩|, σ_d, σ_d/√n, and |Σ⟨x_i, U_d⟩² − σ_d²|.
(d) (B8 vs epoch) is P004-12 and needs nets at training checkpoints: not computed here.

The constructions change the set's size, so they act on one net at a time (``tasks/reconstruct/
constructions.py``); the cell loops over the bundle's nets, the maths inside is tensor-wide.
"""

from __future__ import annotations

import math

import torch

from tasks.reconstruct import bounds, constructions as C
from tasks.reconstruct.objective import residual

TAUS = (1.0, 10.0, 100.0, 1e4)  # P004-4
SPLIT, MERGE = 1, 2


def _norm(W, b, v) -> float:
    return float(torch.cat([W.flatten(), b, v]).norm())


def merge_split(W, b, v, X, y, lam, nu, n_ops: int, progress=None) -> tuple[list[float], list[int]]:
    """(a): ‖R(S_t) − R(S_0)‖/‖θ‖ after each of ``n_ops`` splits then their merges, and the op kinds;
    ``progress`` (optional): called as ``progress(operations done)`` after each."""
    theta = _norm(W, b, v)
    R0 = C.set_residual(W, b, v, X, y, lam)
    support = (lam > 1e-6 * lam.max()).nonzero().flatten().tolist()
    out, kinds = [], []
    Xs, ys, ls = X, y, lam
    pieces = []
    for i in support[:n_ops]:
        a_max, b_max = C.admissible_range(W, b, X[i], nu)
        alpha = 0.5 * a_max if math.isfinite(a_max) else 1.0
        beta = 0.3 * b_max if math.isfinite(b_max) else 0.6
        # the point i sits at its original index until split: find it in the current set
        j = int(((Xs - X[i]).abs().amax(1) == 0).nonzero()[0, 0])
        Xs, ys, ls = C.split(W, b, Xs, ys, ls, j, nu, alpha, beta)
        pieces.append((X[i], alpha, beta))
        out.append(float((C.set_residual(W, b, v, Xs, ys, ls) - R0).norm()) / theta)
        kinds.append(SPLIT)
        if progress is not None:
            progress(len(out))
    for x, alpha, beta in reversed(pieces):
        i1 = int(((Xs - (x + alpha * nu)).abs().amax(1) == 0).nonzero()[0, 0])
        i2 = int(((Xs - (x - beta * nu)).abs().amax(1) == 0).nonzero()[0, 0])
        Xs, ys, ls = C.merge(W, b, Xs, ys, ls, i1, i2)
        out.append(float((C.set_residual(W, b, v, Xs, ys, ls) - R0).norm()) / theta)
        kinds.append(MERGE)
        if progress is not None:
            progress(len(out))
    return out, kinds


def far_sets(W, b, v, X, y) -> dict[str, list[float]]:
    """(b) Thm 4 on the exactified net for every τ of TAUS (NaN rows when n ≥ d)."""
    n, d = X.shape
    if n >= d:
        nan = [math.nan] * len(TAUS)
        return {"far_dist": nan, "far_residual": nan, "far_phi_err": nan, "far_pattern_kept": [-1] * len(TAUS)}
    We = C.exactify(W, X)
    _, lam = bounds.eps_star(We, b, v, X, y)
    theta = _norm(We, b, v)
    R0 = C.set_residual(We, b, v, X, y, lam)
    phi0 = C.phi(We, b, v, X).repeat(2).abs()
    pat0 = C.pattern(We, b, X).repeat(2, 1)
    out = {"far_dist": [], "far_residual": [], "far_phi_err": [], "far_pattern_kept": []}
    xhat = C.orthogonal_direction(X)
    for tau in TAUS:
        X2, y2, lam2, _ = C.far_set(X, y, lam, tau, xhat)
        out["far_dist"].append(C.set_distance(X, X2))
        out["far_residual"].append(float((C.set_residual(We, b, v, X2, y2, lam2) - R0).norm()) / theta)
        out["far_phi_err"].append(float((C.phi(We, b, v, X2).abs() - phi0).abs().max() / phi0.max()))
        out["far_pattern_kept"].append(int(bool((C.pattern(We, b, X2) == pat0).all())))
    return out


def split_budgets(W, b, v, X, y, lam, eps, nu) -> dict:
    """(c) per training point: B8, B5 (corrected / printed, at the exact W-block) and exact ranges."""
    b8 = bounds.b8(W, b, v, X, lam, nu, eps)
    exact = bounds.ranges(W, b, X, nu)
    RW = residual(W[None], b[None], v[None], X[None], y[None], lam[None])[0][0]
    We = W - RW  # the W-block of an exact KKT point (Lemma 11), spec P004-7
    b5 = bounds.b5(We, b, v, X, lam, nu)
    b5p = bounds.b5(We, b, v, X, lam, nu, printed=True)
    exact_e = bounds.ranges(We, b, X, nu)
    p0 = C.pattern(W, b, X)
    keep = torch.ones(X.shape[0], dtype=torch.bool)
    for sign in (1.0, -1.0):
        keep &= (C.pattern(W, b, X + sign * 0.99 * b8.unsqueeze(1) * nu) == p0).all(1)
    return {"b8": b8.numpy(), "exact_range": exact.numpy(), "b5": b5.numpy(), "exact_range_b5": exact_e.numpy(),
            "b8_ok_frac": float((b8 <= exact).double().mean()), "b8_keep_frac": float(keep.double().mean()),
            "b5_ok_frac": float((b5 <= exact_e).double().mean()),
            "b5_printed_violations": int((b5p > exact_e).sum())}


def units(n_ops: int) -> int:
    """The steps :func:`run_one` reports for one net: ε*, each split and merge, the far sets, the budgets."""
    return 2 * n_ops + 3


def run_one(W, b, v, X, y, n_ops: int, progress=None) -> dict:
    """Every F004-3 check on one net (W (k,d), b, v (k)) and its training set (X (n,d), y (n)), float64.
    ``progress`` (optional): called as ``progress(done, units(n_ops))`` at the start and after each
    step (fewer support points than ``n_ops``: the missing operations are skipped at once)."""
    of = units(n_ops)
    step = (lambda done: progress(done, of)) if progress is not None else (lambda done: None)  # noqa: E731
    step(0)
    eps, lam = bounds.eps_star(W, b, v, X, y)
    step(1)
    nu, sigma_d = C.svd_direction(X)
    proj = X @ nu
    n = X.shape[0]
    ops, kinds = merge_split(W, b, v, X, y, lam, nu, n_ops, progress=lambda t: step(1 + t))
    out = {"eps_rel": float(eps) / _norm(W, b, v), "n_support": int((lam > 1e-6 * lam.max()).sum()),
           "op_residual": ops, "op_kind": kinds, "merge_split_max": max(ops) if ops else math.nan,
           "sigma_d": float(sigma_d), "gamma_ud": float(proj.abs().max()),
           "sigma_d_sqrt_n": float(sigma_d) / math.sqrt(n),
           "thm15_sumsq_err": abs(float(proj.pow(2).sum()) - float(sigma_d) ** 2), "far_tau": list(TAUS)}
    far = far_sets(W, b, v, X, y)
    step(of - 1)
    out.update(far)
    out["far_ok"] = -1 if X.shape[0] >= X.shape[1] else int(all(
        dist > tau and res <= 1e-10 and err <= 1e-10 and kept == 1 for tau, dist, res, err, kept in
        zip(TAUS, far["far_dist"], far["far_residual"], far["far_phi_err"], far["far_pattern_kept"])))
    out.update(split_budgets(W, b, v, X, y, lam, eps, nu))
    step(of)
    return out


def run(W, b, v, X, y, d, m, width, n_ops: list[int], progress=None) -> list[dict]:
    """The bundle's nets as ``storage.nets.Nets`` holds them (E leading, zero padded, float64 CPU), each
    cut to its true sizes; one dict of numbers per net. ``progress`` (optional): ``progress(done, of)``
    in :func:`run_one`'s steps over all the nets."""
    out, per = [], [units(k) for k in n_ops]
    for e in range(W.shape[0]):
        de, me, ke = int(d[e]), int(m[e]), int(width[e])
        inner = None if progress is None else (lambda done, of, base=sum(per[:e]): progress(base + done, sum(per)))
        out.append(run_one(W[e, :ke, :de], b[e, :ke], v[e, :ke], X[e, :me, :de], y[e, :me], n_ops[e], inner))
    return out
