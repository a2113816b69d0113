"""k sequential single-point GA steps (spec F001-4, not in the paper; the comparison for k-GA):
step r uses the gradient at the current iterate (its activation pattern) and the trained net's
multiplier λ_r, in index order of the forget set. A loop over the k ≤ m steps, never over nets."""

from __future__ import annotations

import torch

from tasks.unlearn.step import ga_step


def sequential_ga(W, u, X, y, lam, forget: torch.Tensor, alphas: torch.Tensor, **kw) -> torch.Tensor:
    E, L, m = forget.shape
    A = alphas.shape[0]
    cur = W[:, None, None].expand(E, L, A, *W.shape[1:]).reshape(E * L * A, *W.shape[1:])
    rep = lambda t: t[:, None, None].expand(E, L, A, *t.shape[1:]).reshape(E * L * A, *t.shape[1:])  # noqa: E731
    Xr, yr, lr = rep(X), rep(y), rep(lam)
    ur = None if u is None else rep(u)
    al = alphas.to(W.dtype)[None, None, :].expand(E, L, A).reshape(-1)
    F = forget[:, :, None].expand(E, L, A, m).reshape(-1, m)
    order = torch.cumsum(F.long(), -1) * F.long()  # 1..k along each forget set, 0 elsewhere
    one = torch.ones(1, dtype=W.dtype)
    for r in range(1, int(F.sum(-1).max()) + 1):
        pick = (order == r).unsqueeze(1)  # (P,1,m): one point (or none) per problem
        cur = ga_step(cur, ur, Xr, yr, lr * al[:, None], pick, one, kw.get("tol", 1e-9))[:, 0, 0]
    return cur.reshape(E, L, A, *W.shape[1:])
