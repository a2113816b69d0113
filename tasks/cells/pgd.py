"""The cell of experiment ``pgd`` (paper 003 §5.2 test time; spec 003 §2.8, §2.10): robust test
accuracy of stored nets under PGD-l2 (optionally with random restarts: a point is robust only if
every restart fails, X3), stacked over the bundle's nets."""

from __future__ import annotations

import torch

from tasks.attacks import pgd_l2
from tasks.nets import TwoLayer


def attack(W, b, v, Xt, yt, n_test, R, cells: list[dict], seeds: list[int],
           forgotten: torch.Tensor | None = None, progress=None) -> list[dict]:
    """W (E,m,d), b, v (E,m), Xt (E,nt,d), yt (E,nt), n_test (E,), R (E,) budgets (float64);
    ``seeds`` (E,) each net's random-start seed (per cell, never its place in the bundle);
    ``forgotten`` (E,nt) bool: points an upstream unlearn stage forgot (robust accuracy apart);
    ``progress`` (optional): ``progress(done, of)`` in PGD steps of all restarts (``pgd_l2``'s)."""
    c = cells[0]
    net = TwoLayer(W, b, v)
    E, nt, _ = Xt.shape
    mask = torch.arange(nt)[None, :] < n_test[:, None]
    robust = torch.ones(E, nt, dtype=torch.bool)
    strict = torch.ones(E, nt, dtype=torch.bool)
    dist = torch.zeros(E, nt, dtype=torch.float64)
    clip = (0.0, 1.0) if c["clip"] == "unit_box" else None
    gens = [torch.Generator().manual_seed(int(s)) for s in seeds]
    for r in range(c["restarts"]):
        inner = None if progress is None else (lambda done, of, r=r: progress(r * of + done, c["restarts"] * of))
        res = pgd_l2(net, Xt, yt, R, steps=c["T2"], alpha=c["alpha_factor"] * R / c["T2"],
                     random_start=c["random_start"] or r > 0, generators=gens, clip=clip, chunk=c["chunk"],
                     step=c.get("pgd_step", "normalised"), progress=inner)
        robust &= res.robust
        strict &= res.robust_strict
        dist = torch.maximum(dist, (res.x_adv - Xt).norm(dim=-1))
    clean = yt * net(Xt) > 0
    gone = torch.zeros_like(mask) if forgotten is None else forgotten[:, :nt] & mask
    cnt = n_test.double()
    out = []
    for e in range(E):
        k = mask[e]
        out.append({
            "rta": float(robust[e][k].double().sum() / cnt[e]), "rta_strict": float(strict[e][k].double().sum() / cnt[e]),
            "clean_acc": float(clean[e][k].double().sum() / cnt[e]), "R_used": float(R[e]),
            "max_delta": float(dist[e][k].max()),
            "robust": torch.where(k, robust[e].double(), torch.full((nt,), float("nan"), dtype=torch.float64)).numpy(),
            **_apart(robust[e], k, gone[e]),
        })
    return out


def _apart(robust: torch.Tensor, real: torch.Tensor, gone: torch.Tensor) -> dict:
    """Robust accuracy over the forgotten points and over the retained ones (NaN where there are none)."""
    frac = lambda sel: float(robust[sel].double().mean()) if bool(sel.any()) else float("nan")  # noqa: E731
    return {"rta_forgotten": frac(real & gone), "rta_retained": frac(real & ~gone)}
