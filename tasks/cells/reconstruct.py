"""The cell of experiment ``reconstruct`` (paper 004 F004-1 / F004-2 on a chain): the stored nets of
a ``train`` stage in (one row per cell: net × hyper-parameters × restart), the KKT reconstruction
attack run as ONE stacked problem over the bundle (``tasks.reconstruct.attack.optimise``), every
score of spec §2.5 out, with the candidates themselves.

Shift defence (App D, spec §3.8): a cell with ``shift`` = s attacks the bias-transformed net
b ↦ b − W u, u = s·1 over the net's true features, and is scored against the shifted training set
x + u (the set that net is "trained" on). The true shifted set's KKT residual under the attacked net
(``train_eps``, ε*/‖θ‖ by NNLS) is stored with it (X004-6).
"""

from __future__ import annotations

import math

import torch

from tasks import data
from tasks.reconstruct import attack as atk
from tasks.reconstruct import bounds, objective, score, shift

N_TRACE = 11


def check_shapes(W, b, v, X, y, d, m, width) -> None:
    """Net and data of every row agree (W (E,k,d), b, v (E,k), X (E,m,d), y (E,m)); else ValueError
    naming the array."""
    E, k, dW = W.shape
    for name, t, shape in (("b", b, (E, k)), ("v", v, (E, k)), ("X", X, (E, X.shape[1], dW)), ("y", y, X.shape[:2])):
        if tuple(t.shape) != tuple(shape):
            raise ValueError(f"upstream nets: {name} has shape {tuple(t.shape)}, the net W {tuple(W.shape)} "
                             f"needs {tuple(shape)} (shape mismatch between net and data)")
    if bool((d > dW).any()) or bool((width > k).any()) or bool((m > X.shape[1]).any()):
        raise ValueError("upstream nets: d_used / width_used / m_used exceed the stored arrays (shape mismatch)")


def run(W, b, v, X, y, mask, d, m, width, cells: list[dict], device: str = "cpu", blocks=None,
        forgotten=None, progress=None) -> list[dict]:
    """W (E,k,d), b, v (E,k), X (E,m,d), y (E,m), mask (E,m), d, m, width (E,) as ``storage.nets.Nets``
    holds them (float64, zero padded); ``cells`` the rows' parameters (one init, objective,
    candidate count, step count and box flag per bundle). The inits are drawn on the CPU, the attack
    runs on ``device`` in float64. ``blocks`` (E,3) bool: which of W, b, v each net trained (the
    nets contract; stationarity over those only); ``forgotten`` (E,m) bool: the training points an
    upstream unlearn stage removed (recovery of forgotten and retained points apart); ``progress`` the
    optional ``progress(done, of, loss)`` of :func:`tasks.reconstruct.attack.optimise`. Returns one
    dict of numbers per cell."""
    check_shapes(W, b, v, X, y, d, m, width)
    W, b, v, X, y, mask, d = (t.to(device) for t in (W, b, v, X, y, mask, d))
    blocks = torch.ones(W.shape[0], 3, dtype=torch.bool) if blocks is None else blocks
    blocks = blocks.to(device)
    gone = torch.zeros_like(mask) if forgotten is None else forgotten[:, : mask.shape[1]].to(device) & mask
    c0 = cells[0]
    E, _, D = W.shape
    l = c0["n_candidates"]
    dev_t = lambda key: torch.tensor([float(c[key]) for c in cells], dtype=torch.float64, device=device)  # noqa: E731
    fmask = (torch.arange(D, device=device)[None, :] < d[:, None]).to(torch.float64)  # (E,D) the true features
    u = dev_t("shift")[:, None] * fmask
    b_att = shift.bias_transform(W, b, u)
    Xs = (X + u[:, None, :]) * mask[..., None].to(X.dtype)
    gens = [data.seed_streams(c["seed"], salt=(c["restart"],))["init"] for c in cells]
    x0, lam0 = atk.init_candidates(c0["init"], l, [int(t) for t in d], D, [c["radius"] for c in cells], gens)
    x0, lam0 = x0.to(device), lam0.to(device)
    yc = atk.candidate_labels(l).to(device).expand(E, l)
    alpha = dev_t("alpha") if c0["surrogate"] else None
    lam_min = dev_t("lam_min")
    x_scale = torch.maximum(dev_t("radius"), Xs.norm(dim=-1).amax(-1))  # the data scale of the divergence rule
    res = atk.optimise(W, b_att, v, x0, lam0, yc, lr_x=dev_t("lr_x"), lr_lam=dev_t("lr_lam"), alpha=alpha,
                       lam_min=lam_min, steps=c0["steps"], objective_name=c0["objective"], box=c0["box"],
                       feature_mask=fmask, n_trace=N_TRACE, blocks=blocks, x_scale=x_scale,
                       norm_prior=torch.tensor([float(c.get("norm_prior", 0.0)) for c in cells], dtype=torch.float64,
                                               device=device), progress=progress)
    bw = blocks.to(W.dtype)  # ||theta||^2 over the trained blocks
    theta2 = bw[:, 0] * W.pow(2).sum((1, 2)) + bw[:, 1] * b_att.pow(2).sum(1) + bw[:, 2] * v.pow(2).sum(1)
    scale = objective.SCALES[c0["objective"]](l)
    R = objective.residual(W, b_att, v, res.x, yc, res.lam, scale=scale)  # exact step derivative (X004-2)
    res_exact = objective.residual_norm2(R, blocks).sqrt() / theta2.sqrt()
    per_point = point_recovery(res.x - u[:, None, :], X, mask, gone, c0["rho"])
    sc = score.score_all(res.x, res.lam, Xs, mask, fmask, lam_min, c0["rho"])
    sc0 = score.score_all(x0, lam0, Xs, mask, fmask, lam_min, c0["rho"])
    best10 = sc.dist.argsort(1)[:, : min(10, l)]  # P004-17: the 10 best, judged with the shift taken off
    closer, ratio, _ = score.knn_averages(res.x - u[:, None, :], X * mask[..., None].to(X.dtype), mask, best10)
    closer, ratio = closer.cpu(), ratio.cpu()
    res, sc = _cpu(res), _cpu(sc)
    Xs_cpu, u_cpu = Xs.cpu(), u.cpu()
    out = []
    for e, c in enumerate(cells):
        de, me = int(d[e]), int(m[e])
        sim = image_ssim(res.x[e, :, :de] - u_cpu[e, :de], Xs_cpu[e, :me, :de] - u_cpu[e, :de], sc.nearest[e])
        eps = train_eps(W[e, :, :de], b_att[e], v[e], Xs[e, :me, :de], y[e, :me], blocks[e]) * theta2[e].sqrt()
        out.append({
            "status": int(res.status[e]), "objective": float(res.objective[e]),
            "objective_rel": float(res.objective[e] / theta2[e]), "objective_init": float(res.trace[e, 0]),
            "residual_exact_rel": float(res_exact[e]), "train_eps": float(eps / theta2[e].sqrt()),
            "score5": float(sc.score5[e]), "score10": float(sc.score10[e]),
            "score5_unique": float(sc.score5_unique[e]), "score5_active": float(sc.score5_active[e]),
            "score5_init": float(sc0.score5[e].cpu()), "n_recovered": int(sc.n_recovered[e]),
            "objective_trace": res.trace[e].numpy(),
            "dist": sc.dist[e].numpy(), "nearest": sc.nearest[e].numpy(), "ncc": sc.ncc[e].numpy(),
            "lam": res.lam[e].numpy(), "cand_norm": res.x[e, :, :de].norm(dim=1).numpy(),
            "candidates": res.x[e, :, :de].numpy(), "ssim": sim.numpy(),
            "ssim10": float(sim[sc.dist[e].argsort()[:10]].mean()), "ssim_max": float(sim.max()),
            "avg_frac": float(closer[e].double().mean()), "avg_ratio": float(score.median(ratio[e])),
            **{k: (t[e, :me].numpy() if t.dim() == 2 else float(t[e])) for k, t in per_point.items()},  # own m
        })
        if out[-1]["status"] == atk.DIVERGED:
            out[-1] = not_a_result(out[-1])
    return out


# What a diverged row (tasks/reconstruct/attack.py BLOWUP) stores as not-a-result: everything computed
# from its final candidates and multipliers. Kept: its status, the init's objective and score, the
# trace (where it blew up) and the training set's own ε*.
NOT_A_RESULT = ("objective", "objective_rel", "residual_exact_rel", "score5", "score10", "score5_unique",
                "score5_active", "n_recovered", "dist", "nearest", "ncc", "lam", "cand_norm", "candidates", "ssim",
                "ssim10", "ssim_max", "avg_frac", "avg_ratio", "point_dist", "point_cos", "recovered_forgotten",
                "recovered_retained", "dist_forgotten", "dist_retained", "cos_forgotten", "cos_retained")


def not_a_result(row: dict) -> dict:
    """``row`` with every :data:`NOT_A_RESULT` value replaced by NaN (integers: -1, the store's fill)."""
    import numpy as np

    def blank(value):
        if isinstance(value, np.ndarray):
            return np.full_like(value, -1 if value.dtype.kind in "iu" else np.nan)
        return -1 if isinstance(value, int) else math.nan

    return dict(row, **{k: blank(row[k]) for k in NOT_A_RESULT})


def train_eps(W, b, v, X, y, blocks) -> torch.Tensor:
    """ε*/‖θ‖ of one net over its trained blocks: all of θ (spec 004 §2.3, NNLS on the full Jacobian),
    or W alone (paper 001's frozen-output nets: K1 of tasks/kkt/measure.py, scale free; inf where the
    net does not classify its points)."""
    if bool(blocks[0]) and not bool(blocks[1:].any()):
        from tasks.kkt.measure import kkt_measure

        return kkt_measure(W[None], v[None], X[None], y[None], None, "nnls").eps_rel[0].to(W.device)
    eps, _ = bounds.eps_star(W, b, v, X, y)
    return eps / (W.pow(2).sum() + b.pow(2).sum() + v.pow(2).sum()).sqrt()


def point_recovery(Xc, X, mask, gone, rho: float) -> dict:
    """Per training point the distance of the best candidate to it (spec 004 §2.5 read from the
    point's side), the best cosine of a candidate to it (the direction: where the output layer is
    frozen, stationarity over W alone is blind to x' -> s x', λ -> λ/s, so only directions are
    identifiable), and, for the points an upstream unlearn stage forgot and for the retained ones,
    the fraction recovered (best candidate within ``rho``), the mean best distance and cosine.
    Xc (E,l,d) candidates with any shift taken off, X (E,m,d), mask / gone (E,m) bool."""
    D = torch.cdist(X, Xc, compute_mode="donot_use_mm_for_euclid_dist").amin(-1)  # (E,m)
    D = torch.where(mask, D, torch.full_like(D, math.nan)).cpu()
    unit = torch.nn.functional.normalize
    cos = torch.bmm(unit(X, dim=-1), unit(Xc, dim=-1).transpose(1, 2)).amax(-1)  # (E,m) best direction
    cos = torch.where(mask, cos, torch.full_like(cos, math.nan)).cpu()
    rec = (D <= rho).to(D.dtype)
    out = {"point_dist": D, "point_cos": cos}
    for name, sel in (("forgotten", (gone & mask).cpu()), ("retained", (mask & ~gone).cpu())):
        n = sel.sum(1).to(D.dtype)
        none = n == 0
        mean = lambda t: torch.where(none, math.nan, torch.nan_to_num(t * sel).sum(1) / n.clamp_min(1))  # noqa: E731
        out[f"recovered_{name}"] = torch.where(none, math.nan, (rec * sel).sum(1) / n.clamp_min(1))
        out[f"dist_{name}"], out[f"cos_{name}"] = mean(D), mean(cos)
    return out


IMAGE = (3, 32, 32)  # CIFAR-10, channel-major rows (storage/datasets.py)


def image_ssim(cand: torch.Tensor, train: torch.Tensor, nearest: torch.Tensor) -> torch.Tensor:
    """SSIM of each candidate (l, 3072) with its nearest training image, both with the shift taken
    off (Haim's metric, F004-2); data range = the training set's. NaN unless d = 3072 (images)."""
    if cand.shape[1] != 3 * 32 * 32:
        return torch.full((cand.shape[0],), math.nan, dtype=torch.float64)
    rng = float(train.max() - train.min())
    return score.ssim(cand.reshape(-1, *IMAGE), train[nearest].reshape(-1, *IMAGE), rng)


def _cpu(obj):
    """A result dataclass with every tensor moved to the CPU (for numpy)."""
    import dataclasses

    return dataclasses.replace(obj, **{f.name: getattr(obj, f.name).cpu() for f in dataclasses.fields(obj)})


def random_reference(n_points: int, n_cand: int, d: int, radius: float, seed: int = 0) -> float:
    """Spec §2.5's reference: mean of the 5 best distances of n_cand random points on the sphere of
    ``radius`` to n_points uniform unit vectors (≈ 1.30 for 1000 candidates, 500 points, d = 784)."""
    g = torch.Generator().manual_seed(seed)
    P = atk.sphere(n_points, d, 1.0, g)
    Q = atk.sphere(n_cand, d, radius, g)
    dmin = torch.cdist(Q, P, compute_mode="donot_use_mm_for_euclid_dist").min(1).values
    return float(dmin.topk(5, largest=False).values.mean()) if n_cand >= 5 else math.nan
