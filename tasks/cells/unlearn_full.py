"""Unlearning nets whose every block was trained (issue 39): paper 002 / 004's two-layer ReLU nets
N(x) = Σ_j v_j σ(w_j·x + b_j) with W, b and v trained, the nets from which paper 004's KKT attack
recovers training points. The step is paper 001's Eq. 3 over the blocks the producer trained:

    θ̂(α) = θ − α Σ_{l∈S_f} λ_l y_l ∇_θN(x_l; θ),
    ∇_{w_j}N = v_j σ'(h_lj) x_l,   ∇_{b_j}N = v_j σ'(h_lj),   ∇_{v_j}N = σ(h_lj),

with λ the KKT multipliers of the trained net over (W, b, v) (paper 002 Eqs. 9-10, paper 004
Eq. 4: the NNLS on the margin gradients' Gram matrix, tasks/kkt/multipliers.py). N is 2-homogeneous
in θ, so ∇N is 1-homogeneous and the λ that certify θ̂ = θ/√q_min certify θ at its raw scale too:
θ = Σ λ_i y_i ∇N(x_i; θ) (no rescaling, unlike the 1-homogeneous frozen-output case). At α = 1 the
step removes the forgotten points' terms from that sum (their gradients taken at θ, as in paper 001).

The unlearned net is judged as paper 001 judges it (Def 2.2): ε, δ of a fresh KKT fit on the
retained set at min margin 1. Paper 001's bounds, lemmas and fixed net are for a frozen output
layer: NaN here, and ``violated`` carries the bit of its precondition "output layer frozen".
"""

from __future__ import annotations

import math

import torch

from tasks.kkt.multipliers import kkt_fit
from tasks.nets import TwoLayer
from tasks.unlearn import bounds as bnd
from tasks.unlearn.step import log_beta

METHODS = ("identity", "ga", "k_ga", "retrain")


def full_step(W, b, v, X, y, lam, forget, alphas, blocks=("W", "b", "v")):
    """W (E,n,d), b, v (E,n), X (E,M,d), y (E,M), lam (E,M) multipliers of θ, forget (E,L,M) bool,
    alphas (A,) -> (W, b, v) of θ̂, each with (E,L,A) in front. ``blocks``: those stepped (the trained ones)."""
    H = torch.baddbmm(b.unsqueeze(1), X, W.transpose(1, 2))  # (E,M,n)
    G = (H > 0).to(W.dtype) * v.unsqueeze(1)  # v_j σ'(h_ij)
    coef = (alphas.to(W.dtype)[None, None, :, None] * (lam * y)[:, None, None, :]
            * forget.to(W.dtype)[:, :, None, :]).unsqueeze(-1)  # (E,L,A,M,1)
    Gc = coef * G[:, None, None]  # (E,L,A,M,n)
    dW = Gc.transpose(-1, -2) @ X[:, None, None]  # (E,L,A,n,d)
    db, dv = Gc.sum(-2), (coef * torch.relu(H)[:, None, None]).sum(-2)
    out = []
    for name, p, dp in (("W", W, dW), ("b", b, db), ("v", v, dv)):
        p = p[:, None, None].expand_as(dp)
        out.append(p - dp if name in blocks else p.clone())
    return tuple(out)


def measure(W, b, v, X, y, valid):
    """Paper 001's K1 for a net with every block trained, batched over the leading dims of W: the KKT fit at
    min margin 1 over ``valid`` points. Returns dict of (...) tensors: eps (‖θ̂ − Σλ_i y_i∇N‖), eps_rel
    (ε/‖θ̂‖), delta (max λ_i (q̂_i − 1)), feasible, q_min (raw), n_support, lam (...,M) at θ's scale."""
    lead, (n, d), M = W.shape[:-2], W.shape[-2:], X.shape[-2]
    flat = lambda t, *s: t.expand(*lead, *s).reshape(-1, *s)  # noqa: E731
    net = TwoLayer(flat(W, n, d), flat(b, n), flat(v, n))
    Xf, yf, vf = flat(X, M, d), flat(y, M), flat(valid, M)
    fit = kkt_fit(net, Xf, yf, vf)
    q = yf * net(Xf)
    q_min = q.masked_fill(~vf, math.inf).amin(-1)
    feasible = q_min > 0
    theta = torch.sqrt(net.sq_norm() / q_min.clamp_min(1e-300))
    q_hat = q / q_min.clamp_min(1e-300).unsqueeze(-1)
    delta = (fit.lam * (q_hat - 1)).masked_fill(~vf, -math.inf).amax(-1).clamp_min(0)
    inf = torch.full_like(fit.eps, math.inf)
    out = {"eps": torch.where(feasible, fit.eps * theta, inf), "eps_rel": torch.where(feasible, fit.eps, inf),
           "delta": torch.where(feasible, delta, inf), "feasible": feasible, "q_min": q_min,
           "n_support": (fit.lam > 1e-9 * fit.lam.amax(-1, keepdim=True).clamp_min(1e-300)).sum(-1), "lam": fit.lam}
    return {k: t.reshape(*lead, *t.shape[1:]) for k, t in out.items()}


def unlearn_full(W, b, v, X, y, mask, d, m, width, rng, keys: list[str], cells: list[dict],
                 blocks=("W", "b", "v"), retrain=None) -> list[dict]:
    """tasks/cells/unlearn.py's ``unlearn`` for nets with v trained: the same arguments (``blocks``: the
    trained ones) and per cell the same names; paper 001's frozen-output bounds, lemmas, fixed net and
    references NaN (``violated``: the bit of "output layer frozen"); the unlearned net stored where the cell
    has one forget set and ``store_nets``. ``retrain`` (unlearn_method ``retrain``): ``retrain(rows, drop)`` -> (W, b,
    v) of the nets at ``rows`` (indices into the arguments) trained again without the points ``drop`` (R,M)
    marks, padded like W (the producer's training: flows/experiments/train.py ``retrain``)."""
    from tasks.cells.unlearn import NO_NET, app_e_anchor, forget_sets  # one direction: unlearn.py never imports this

    c0 = cells[0]
    method = c0["unlearn_method"]
    if method not in METHODS:
        raise ValueError(f"unlearn_method: {method!r} needs a frozen output layer (train_kkt's nets); nets with v trained "
                         f"take {', '.join(METHODS)}")
    for f in ("unlearn_method", "tie_tol", "ref_retrain", "test_points"):
        if len({c[f] for c in cells}) > 1:
            raise ValueError(f"{f}: the cells of one bundle have different values {sorted({c[f] for c in cells})}")
    if c0["ref_retrain"] or c0["test_points"] > 0 or c0["model"] != "two_layer":
        raise ValueError("ref_retrain, test_points and model: linear redraw or assume train_kkt's nets (frozen output "
                         "layer); not for nets with v trained")
    uniq = list(dict.fromkeys(keys))
    pick = torch.tensor([keys.index(k) for k in uniq])
    W, b, v, X, y, mask = (t[pick].double() if t.is_floating_point() else t[pick] for t in (W, b, v, X, y, mask))
    d, m, width, rng = d[pick], m[pick], width[pick], rng[pick]
    y = torch.where(mask, y, torch.zeros_like(y))
    stats = bnd.data_stats(X, mask, 1)  # Assumption 2.3's ψ̂, φ̂ (data only)
    F, anchors, ok = forget_sets(c0, m, uniq)
    k = F.sum(-1)
    if method == "ga" and bool(((k != 1) & (k != 0)).any()):
        raise ValueError("k: method 'ga' forgets one point; use 'k_ga' for k > 1")
    alphas = torch.tensor(sorted({float(c["alpha"]) for c in cells}), dtype=torch.float64)
    r1 = measure(W, b, v, X, y, mask)
    lam = torch.where(r1["feasible"].unsqueeze(-1), r1["lam"], torch.zeros_like(r1["lam"]))
    Wh, bh, vh = full_step(W, b, v, X, y, lam, F, alphas if method != "identity" else 0 * alphas, blocks)
    E, L, A = Wh.shape[:3]
    if method == "retrain":  # the same net at every α: trained again without the forget set
        if retrain is None:
            raise ValueError("unlearn_method: 'retrain' needs the producer's training (none given)")
        rows = pick.repeat_interleave(L).tolist()
        Wr, br, vr = retrain(rows, F.reshape(E * L, -1))
        Wh, bh, vh = (t.reshape(E, L, 1, *t.shape[1:]).expand(E, L, A, *t.shape[1:]) for t in (Wr, br, vr))
    retain = (mask[:, None] & ~F)[:, :, None].expand(E, L, A, -1)
    after = measure(Wh, bh, vh, X[:, None, None], y[:, None, None], retain)
    q1 = y[:, None, None] * (torch.relu(X[:, None, None] @ Wh.transpose(-1, -2) + bh.unsqueeze(-2))
                             * vh.unsqueeze(-2)).sum(-1)  # (E,L,A,M)
    q0 = y * (torch.relu(X @ W.transpose(1, 2) + b.unsqueeze(1)) * v.unsqueeze(1)).sum(-1)
    logb = log_beta(r1["lam"].clamp_min(1e-300), q0, c0["loss"])  # (E,M)
    cnt = lambda hit, w: (hit.double() * w).sum(-1) / w.sum(-1).clamp_min(1)  # noqa: E731
    acc_after, forgot_after = cnt(q1 > 0, retain.double()), cnt(q1 > 0, F[:, :, None].expand(E, L, A, -1).double())
    acc_before = cnt(q0[:, None] > 0, (mask[:, None] & ~F).double())
    out = []
    for i, c in enumerate(cells):
        e, a = uniq.index(keys[i]), int((alphas == float(c["alpha"])).nonzero()[0, 0])
        okL, me, ne = ok[e], int(m[e]), int(width[e])
        mx = lambda t: float(t[e, okL, a].max())  # noqa: E731
        mean = lambda t: float(t[e, okL, a].double().mean())  # noqa: E731
        lam_e, anc = r1["lam"][e, :me], anchors[e, okL]
        eps_l = torch.full((me,), math.nan, dtype=torch.float64)
        eps_l[anc] = after["eps"][e, okL, a]
        res = {k_: math.nan for k_ in NAN}
        res.update({
            "m_used": me, "width_used": ne, "n_forget_sets": int(okL.sum()),
            "feasible": int(bool(after["feasible"][e, okL, a].all())),
            "eps": mx(after["eps"]), "delta": mx(after["delta"]), "eps_rel": mx(after["eps_rel"]),
            "eps_mean": mean(after["eps"]), "delta_mean": mean(after["delta"]), "eps_rel_mean": mean(after["eps_rel"]),
            "eps_app_e": float(eps_l[app_e_anchor(c, keys[i], me)]) if c["forget"] in (-1, -2) and not
            c.get("forget_set") else math.nan,
            "eps1": float(r1["eps"][e]), "delta1": float(r1["delta"][e]), "eps1_rel": float(r1["eps_rel"][e]),
            "feasible1": int(r1["feasible"][e]), "q_min1": float(r1["q_min"][e]),
            "lam_l": float(lam_e[anc].mean()), "q_l": float(q0[e, anc].mean()), "log_beta_l": float(logb[e, anc].mean()),
            "psi": float(stats["psi"][e]), "phi": float(stats["phi"][e]),
            "lam_min": float(lam_e.min()), "lam_max": float(lam_e.max()),
            "n_support": int(r1["n_support"][e]), "n_support_after": mean(after["n_support"]),
            "train_acc_before": float(acc_before[e, okL].mean()), "train_acc_after": mean(acc_after),
            "forget_acc_after": mean(forgot_after),
            "preconditions_met": 0, "violated": 1 << bnd.PRECONDITIONS.index(FROZEN_OUTPUT),
            "lemma_upper": -1, "lemma_lower": -1, "eps_l": eps_l.numpy(),
        })
        if L == 1 and c.get("store_nets", True):
            n_, de = ne, int(d[e])
            res.update({"W": Wh[e, 0, a, :n_, :de].numpy(), "b": bh[e, 0, a, :n_].numpy(),
                        "v": vh[e, 0, a, :n_].numpy(), "X": X[e, :me, :de].numpy(), "y": y[e, :me].numpy(),
                        "forgotten": F[e, 0, :me].to(torch.int8).numpy(), "d_used": de, "nets_stored": 1,
                        "batch_rng_state": rng[e].to(torch.uint8).numpy()})
        else:
            res.update(dict(NO_NET, d_used=int(d[e])))
        out.append(res)
    return out


# paper 001's frozen-output numbers (bounds, lemmas, fixed net, references, D_MG test points): not defined here
NAN = ("act_mass_min", "act_mass_max", "eps_inherited", "delta_inherited", "eps_dynamics",
       "tau_fixed", "eps_fixed", "delta_fixed", "tau_retrain", "eps_retrain", "delta_retrain", "cos_svm", "tau_svm",
       "test_acc_before", "test_acc_after", "sign_id_before", "sign_id_after", "eps_d", "bound_eps",
       "bound_eps_stated", "bound_delta_stated", "bound_delta_proof", "bound_tau_stated", "bound_tau_proof")
FROZEN_OUTPUT = "output layer frozen"  # paper 001's setting: the bit ``violated`` sets for nets with v trained
