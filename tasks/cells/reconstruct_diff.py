"""The cell of experiment ``reconstruct_diff``: the second threat model of the chain (Bertran et al.,
NeurIPS 2024): the attacker holds the net before and after the deletion and reads the deleted point
off the update (``tasks.reconstruct.difference``). Scored as ``reconstruct`` scores its candidates
(spec 004 §2.5 read from the point's side: best distance, best cosine, recovered within ρ; forgotten
and retained points apart, ``tasks.cells.reconstruct.point_recovery``), with the chance baseline
beside it: what the nearest *other* training point already achieves for each point.

An unchanged net (``identity``, or a step of size 0) gives no candidate: its distances and cosines
are NaN and nothing is recovered (status ``unchanged``), never an error.
"""

from __future__ import annotations

import math

import torch

from tasks.cells.reconstruct import point_recovery
from tasks.reconstruct.difference import update_candidates

DONE, UNCHANGED = 1, 2


def check_pair(before: dict, after: dict) -> None:
    """The two nets are one net before and after a deletion: same shapes, same training set, same
    output layer; else ValueError naming what differs."""
    for name in ("W", "b", "v", "X", "y"):
        if tuple(before[name].shape) != tuple(after[name].shape):
            raise ValueError(f"before/after nets: {name} has shape {tuple(before[name].shape)} before and "
                             f"{tuple(after[name].shape)} after (not one net before and after a deletion)")
    for name in ("X", "y", "v"):
        if not torch.equal(before[name], after[name]):
            raise ValueError(f"before/after nets: {name} differs (the unlearn stage keeps the training set and "
                             "the frozen output layer of the net it read)")


def chance_baseline(X: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per training point the best cosine and the smallest distance of the nearest *other* training
    point (E,m) each (NaN past m or with no other point): what an attacker who outputs another
    training point already scores, the reference a recovery is judged against."""
    m = X.shape[1]
    unit = torch.nn.functional.normalize(X, dim=-1)
    other = mask[:, :, None] & mask[:, None, :] & ~torch.eye(m, dtype=torch.bool, device=X.device)
    cos = torch.where(other, unit @ unit.transpose(1, 2), torch.full((), -math.inf, dtype=X.dtype))
    dist = torch.where(other, torch.cdist(X, X, compute_mode="donot_use_mm_for_euclid_dist"),
                       torch.full((), math.inf, dtype=X.dtype))
    best_cos, best_dist = cos.amax(-1), dist.amin(-1)
    none = ~other.any(-1)
    nan = torch.full((), math.nan, dtype=X.dtype)
    return torch.where(none, nan, best_cos), torch.where(none, nan, best_dist)


def run(before: dict, after: dict, mask, d, m, width, forgotten, cells: list[dict], bias=None) -> list[dict]:
    """``before`` / ``after``: dicts of W (E,k,d), b, v (E,k), X (E,M,d), y (E,M) float64 (storage.nets.Nets
    of the unlearn stage's upstream and of the unlearn stage), mask (E,M) the real samples, d, m, width
    (E,) int true sizes, forgotten (E,M) bool the points the deletion removed, ``bias`` (E,) bool whose
    bias was trained (the nets contract); ``cells`` one per net (its rho, n_candidates, tol). One dict
    of numbers per cell."""
    check_pair(before, after)
    c0 = cells[0]
    X = after["X"]
    k = max(c["n_candidates"] for c in cells)
    # the attacker's norm prior: the training points' mean norm (Haim's box, read as a sphere)
    radius = (X.norm(dim=-1) * mask).sum(-1) / mask.sum(-1).clamp_min(1)
    res = update_candidates(before["W"], before["b"], after["W"], after["b"], radius, k=k, tol=c0["tol"],
                            bias=bias)
    gone = forgotten[:, : mask.shape[1]] & mask
    # NaN candidates (no k-th direction) stand in as copies of the first: min / max over candidates unchanged
    fill = torch.where(torch.isnan(res.x), res.x[:, :1].expand_as(res.x), res.x)
    rho = c0["rho"]
    per_point = point_recovery(fill, X, mask, gone, rho)
    none = ~res.changed.cpu()  # no candidate: nothing recovered (0), no distance or cosine (NaN, never 0)
    for key, t in per_point.items():
        if not key.startswith("recovered_"):
            t[none] = math.nan
    chance_cos, chance_dist = chance_baseline(X, mask)
    unit = torch.nn.functional.normalize
    cand_cos = torch.bmm(unit(res.x, dim=-1), unit(X, dim=-1).transpose(1, 2))  # (E,k,M)
    cand_cos = torch.where(mask[:, None, :], cand_cos, torch.full((), -math.inf, dtype=X.dtype))
    cand_dist = torch.cdist(res.x, X, compute_mode="donot_use_mm_for_euclid_dist")
    cand_dist = torch.where(mask[:, None, :], cand_dist, torch.full((), math.inf, dtype=X.dtype))
    size = torch.cat([before["W"], before["b"].unsqueeze(-1)], -1).flatten(1).norm(dim=1)
    upd = torch.cat([after["W"] - before["W"], (after["b"] - before["b"]).unsqueeze(-1)], -1).flatten(1).norm(dim=1)
    out = []
    for e, c in enumerate(cells):
        me, de, kc = int(m[e]), int(d[e]), c["n_candidates"]
        mean = lambda t, sel: float(t[e, :me][sel].mean()) if bool(sel.any()) else math.nan  # noqa: E731
        forg, kept = gone[e, :me], mask[e, :me] & ~gone[e, :me]
        nearest = cand_dist[e, :kc, :me].argmin(-1)
        ok = ~torch.isnan(res.x[e, :kc, 0])
        out.append({
            "status": DONE if bool(res.changed[e]) else UNCHANGED,
            "update_rel": float(upd[e] / size[e]) if float(size[e]) > 0 else math.nan,
            "rank1": float(res.rank1[e]),
            "radius": float(radius[e]),
            "n_forgotten": int(forg.sum()),
            **{k_: (t[e, :me].numpy() if t.dim() == 2 else float(t[e])) for k_, t in per_point.items()},
            "chance_cos_forgotten": mean(chance_cos, forg), "chance_cos_retained": mean(chance_cos, kept),
            "chance_dist_forgotten": mean(chance_dist, forg), "chance_dist_retained": mean(chance_dist, kept),
            "point_chance_cos": chance_cos[e, :me].numpy(),
            "sv": res.sv[e, :kc].numpy(),
            "exact_scale": res.exact_scale[e, :kc].to(torch.int8).numpy(),
            "pattern_agree": res.pattern_agree[e, :kc].numpy(),
            "cand_norm": res.x[e, :kc, :de].norm(dim=-1).numpy(),
            "dist": torch.where(ok, cand_dist[e, :kc, :me].amin(-1), math.nan).numpy(),
            "nearest": torch.where(ok, nearest, -1).numpy(),
            "cos": torch.where(ok, cand_cos[e, :kc, :me].amax(-1), math.nan).numpy(),
            "candidates": res.x[e, :kc, :de].numpy(),
        })
    return out
