"""Non-uniqueness of KKT sets (paper 004 Sec 3, App B-C; spec §3.1-3.3, §3.7) as functions on one
net θ = (W (k,d), b (k), v (k)) and one labelled set with multipliers (X (n,d), y (n), λ (n)).
These are set operations (the set changes size), so they act on one set; the residual they
preserve (``set_residual``) is the batched kernel of ``objective.py`` with B = 1, exact step
derivative (X004-1: σ'(0) = 0, patterns compared as z > 0).
"""

from __future__ import annotations

import math

import torch

from tasks.reconstruct.objective import residual


def set_residual(W, b, v, X, y, lam) -> torch.Tensor:
    """R(S, λ) = θ − Σ λ_i y_i ∇_θΦ(θ; x_i) flattened (spec §3 common setup), (k·d + 2k,)."""
    RW, Rb, Rv = residual(W[None], b[None], v[None], X[None], y[None], lam[None], scale=1.0)
    return torch.cat([RW.flatten(), Rb.flatten(), Rv.flatten()])


def phi(W, b, v, X) -> torch.Tensor:
    """Φ(θ; x) = Σ_j v_j [w_j·x + b_j]_+ for X (n,d), (n,)."""
    return torch.relu(X @ W.T + b) @ v


def pattern(W, b, X) -> torch.Tensor:
    """Activation pattern a(x) = 1[z > 0], (n,k) bool."""
    return (X @ W.T + b) > 0


def merge(W, b, X, y, lam, i1: int, i2: int):
    """MERGE (Lemma 2 / 6, spec §3.1): replace x_{i1}, x_{i2} (same label, same pattern, λ > 0) by
    x_m = α x_{i1} + (1 − α) x_{i2}, α = λ_{i1}/λ', with λ' = λ_{i1} + λ_{i2}. Returns (X', y', λ')
    with x_m last. Lemma 6 as printed omits the premises; the proof needs them, so they are checked."""
    if y[i1] != y[i2]:
        raise ValueError(f"merge needs one label: y[{i1}] = {float(y[i1])}, y[{i2}] = {float(y[i2])}")
    a = pattern(W, b, X[[i1, i2]])
    if not bool((a[0] == a[1]).all()):
        raise ValueError(f"merge needs one activation pattern: points {i1}, {i2} differ on "
                         f"{int((a[0] != a[1]).sum())} neurons")
    if not (lam[i1] > 0 and lam[i2] > 0):
        raise ValueError("merge needs λ_{i1}, λ_{i2} > 0")
    tot = lam[i1] + lam[i2]
    alpha = lam[i1] / tot
    xm = alpha * X[i1] + (1 - alpha) * X[i2]
    keep = [i for i in range(X.shape[0]) if i not in (i1, i2)]
    return (torch.cat([X[keep], xm[None]]), torch.cat([y[keep], y[i1:i1 + 1]]),
            torch.cat([lam[keep], tot[None]]))


def admissible_range(W, b, x, nu) -> tuple[float, float]:
    """Exact split range along ±ν at x (spec §3.2): crossings s_j = −z_j(x)/(w_j·ν);
    α_max = min{s_j > 0}, β_max = min{−s_j : s_j < 0} (inf if none)."""
    z, t = W @ x + b, W @ nu
    s = -z / torch.where(t != 0, t, torch.ones_like(t))
    s = torch.where(t != 0, s, torch.full_like(s, math.nan))
    pos, neg = s[s > 0], -s[s < 0]
    return (float(pos.min()) if pos.numel() else math.inf, float(neg.min()) if neg.numel() else math.inf)


def split(W, b, X, y, lam, i: int, nu, alpha: float, beta: float, *, swap: bool = False):
    """SPLIT (Lemma 3 / 7, spec §3.2): x_i → z1 = x_i + αν with λ_i β/(α+β) and z2 = x_i − βν with
    λ_i α/(α+β) (the paper's names λ_β, λ_α attach λ_β to z1). ``swap`` exchanges the two
    multipliers (the wrong reading, P004-3). Raises ValueError if z1 or z2 leaves x_i's pattern.
    Returns (X', y', λ') with z1, z2 last."""
    a_max, b_max = admissible_range(W, b, X[i], nu)
    if not (0 < alpha < a_max and 0 < beta < b_max):
        raise ValueError(f"split of point {i}: need 0 < alpha < {a_max:.6g} and 0 < beta < {b_max:.6g} "
                         f"(pattern kept), got alpha={alpha:.6g}, beta={beta:.6g}")
    z1, z2 = X[i] + alpha * nu, X[i] - beta * nu
    l1, l2 = lam[i] * beta / (alpha + beta), lam[i] * alpha / (alpha + beta)
    if swap:
        l1, l2 = l2, l1
    keep = [j for j in range(X.shape[0]) if j != i]
    return (torch.cat([X[keep], z1[None], z2[None]]), torch.cat([y[keep], y[i:i + 1], y[i:i + 1]]),
            torch.cat([lam[keep], l1[None], l2[None]]))


def orthogonal_direction(X) -> torch.Tensor:
    """A unit x̂ ⊥ every x_i: the last left singular vector of [x_1..x_n] (Thm 4; needs n < d)."""
    n, d = X.shape
    if n >= d:
        raise ValueError(f"no direction orthogonal to the data: n = {n} >= d = {d} (Thm 4 needs span != R^d)")
    U, _, _ = torch.linalg.svd(X.T, full_matrices=True)
    return U[:, -1]


def exactify(W, X) -> torch.Tensor:
    """W with each w_j projected on span{x_i} (spec §3.3 option (a)): w_j·x̂ = 0 for x̂ ⊥ span X."""
    Q, _ = torch.linalg.qr(X.T)  # (d,n) orthonormal basis of the span (X full row rank)
    return (W @ Q) @ Q.T


def far_set(X, y, lam, tau: float, xhat: torch.Tensor | None = None):
    """FAR(S, λ, τ) (Thm 4, spec §3.3): every x_l → x_l ± α x̂ with α = 2τ (> τ), multipliers λ_l/2
    each; d(S, S_τ) > τ since x̂ ⊥ x_l − x_i. Returns (X', y', λ', x̂)."""
    xhat = orthogonal_direction(X) if xhat is None else xhat
    a = 2.0 * tau
    return (torch.cat([X + a * xhat, X - a * xhat]), torch.cat([y, y]), torch.cat([lam, lam]) / 2, xhat)


def set_distance(A, B) -> float:
    """d(A, B) = min over pairs ‖a − b‖ (spec §2.5)."""
    return float(torch.cdist(A, B, compute_mode="donot_use_mm_for_euclid_dist").min())


def svd_direction(X):
    """App C Thm 15: ν = U_d (last left singular vector of X = [x_1..x_n] ∈ R^{d×n}, full SVD) and
    σ_d (0 when n < d). Then |⟨x_i, ν⟩| ≤ σ_d and Σ_i ⟨x_i, ν⟩² = σ_d². Returns (ν, σ_d)."""
    n, d = X.shape
    U, S, _ = torch.linalg.svd(X.T, full_matrices=True)
    sigma_d = S[d - 1] if n >= d else torch.zeros((), dtype=X.dtype)
    return U[:, d - 1], sigma_d
