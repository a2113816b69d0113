"""The cell of experiment ``single_step`` (paper 003 §5.1, Figs 2, 3, 5, 6, 7): on stored lazy nets,
per test point the minimal flipping gradient step and every diagnostic of spec 003 §2.11, plus the
theorem's plug-in step of §3.6 (G-plugin), so the figures and any later question read the store.
Stacked over the bundle's nets, chunked over test points."""

from __future__ import annotations

import math

import torch

from tasks.attacks import STEP_ATTACKS, deepfool
from tasks.nets import TwoLayer
from tasks.nets.lazy import input_grad

SAMPLE_VARS = ("f", "f0", "gnorm", "gnorm0", "eta_star", "t_lin", "t_ratio", "delta_rel", "eta_rel", "x_norm", "rho",
               "C2_hat", "t_thm", "n_flip_W", "n_margin_V", "n_flip_delta", "correct", "delta_deepfool")


def _median(t: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-net median over the points in ``mask`` (finite values only; the usual median: the midpoint
    of the two middle values for an even count, not torch's lower median), (E,)."""
    out = []
    for row, keep in zip(t, mask):
        x = row[keep & torch.isfinite(row)]
        out.append(torch.quantile(x, 0.5) if len(x) else torch.tensor(float("nan"), dtype=row.dtype))
    return torch.stack(out)


def attack(W, b, v, W0, b0, Xt, yt, n_test, V_nominal, cells: list[dict], chunk: int,
           forgotten: torch.Tensor | None = None, progress=None) -> list[dict]:
    """W (E,m,d), b, v (E,m), Xt (E,nt,d), yt (E,nt) float64 as stored; ``n_test`` (E,) real
    points attacked (a test set, or the training set); ``V_nominal`` (E,) the lazy radius C0/√m of
    each net (for ``n_margin_V``). The "at init" diagnostics (f0, gnorm0, n_flip_W, n_margin_V) are
    on the init net (W0, b0), spec 003 §2.11; W0 None (nets that store no init): NaN.
    ``forgotten`` (E,nt) bool: the points an upstream unlearn stage forgot (medians apart).
    ``progress`` (optional): ``progress(done, of)`` in attacked points of the step search."""
    no_init = W0 is None
    if no_init:
        W0, b0 = torch.zeros_like(W), torch.zeros_like(b)
    net, net0 = TwoLayer(W, b, v), TwoLayer(W0, b0, v)
    E, nt, _ = Xt.shape
    mask = torch.arange(nt)[None, :] < n_test[:, None]
    method = STEP_ATTACKS[cells[0]["single_step_method"]]
    r = method(net, Xt, chunk=chunk, progress=progress)
    s = torch.sign(r.f)
    f0, g0 = input_grad(net0, Xt)
    _, g = input_grad(net, Xt)
    xn = Xt.norm(dim=-1)
    t = r.t_star
    t_fin = torch.where(torch.isfinite(t), t, torch.zeros_like(t))
    x_adv = Xt - (s * 1.000001 * t_fin).unsqueeze(-1) * g  # just past the flip (spec §2.7)
    _, g_adv = input_grad(net, x_adv)
    rho = (g_adv - g).norm(dim=-1) / r.gnorm.clamp_min(1e-300)
    P, P_adv, P0 = net.pre(Xt), net.pre(x_adv), net0.pre(Xt)
    n_flip_W = ((P > 0) != (P0 > 0)).sum(-1)
    n_flip_delta = (torch.sign(P) != torch.sign(P_adv)).sum(-1)
    pre0_nobias = torch.bmm(Xt, W0.transpose(1, 2)).abs()
    n_margin_V = (pre0_nobias <= (V_nominal[:, None] * xn).unsqueeze(-1)).sum(-1) - (v == 0).sum(-1, keepdim=True)
    t_thm = 2 * r.f.abs() / ((1 - rho) * r.gnorm.pow(2))
    t_thm = torch.where(rho < 1, t_thm, torch.full_like(t_thm, float("inf")))
    delta_df = deepfool(net, Xt).norm if cells[0]["deepfool"] else torch.full_like(t, float("nan"))
    vals = {
        "f": r.f, "f0": f0, "gnorm": r.gnorm, "gnorm0": g0.norm(dim=-1), "eta_star": t, "t_lin": r.t_lin,
        "t_ratio": t / r.t_lin, "delta_rel": t * r.gnorm / xn, "eta_rel": t / xn, "x_norm": xn, "rho": rho,
        "C2_hat": t * r.gnorm.pow(2), "t_thm": t_thm, "n_flip_W": n_flip_W.double(),
        "n_margin_V": n_margin_V.double(), "n_flip_delta": n_flip_delta.double(),
        "correct": (yt * r.f > 0).double(), "delta_deepfool": delta_df,
    }
    if no_init:
        vals.update({k: torch.full_like(t, float("nan")) for k in ("f0", "gnorm0", "n_flip_W", "n_margin_V")})
    vals = {k: torch.where(mask, x.double(), torch.full_like(x.double(), float("nan"))) for k, x in vals.items()}
    med = {k: _median(vals[k], mask) for k in ("delta_rel", "eta_star", "eta_rel", "gnorm", "rho", "t_ratio", "t_thm")}
    gone = torch.zeros_like(mask) if forgotten is None else forgotten[:, :nt] & mask
    delta = vals["eta_star"] * vals["gnorm"]  # ||delta*|| = t* ||grad f||
    med["delta_forgotten"], med["delta_retained"] = _median(delta, gone), _median(delta, mask & ~gone)
    flip = (torch.isfinite(t) & mask).double().sum(1) / n_test.double()
    out = []
    for e in range(E):
        res = {k: vals[k][e].numpy() for k in SAMPLE_VARS}
        res.update({f"med_{k}": float(x[e]) for k, x in med.items()})
        res["flip_frac"] = float(flip[e])
        res["test_acc"] = float(vals["correct"][e][mask[e]].mean())
        res["sqrt_d"] = math.sqrt(int((W[e].abs().sum(0) > 0).sum()))
        out.append(res)
    return out
