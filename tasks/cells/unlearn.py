"""The cell of experiment ``unlearn`` (paper 001; spec 001 §3 K1-K3, §4, F001-1 … F001-6): trained
nets of a ``train_kkt`` stage in, per cell (unlearn_method, α, forget, k) the KKT measures of the unlearned
net on the retained set, the references' τ, accuracies, the bounds and their preconditions out.

A bundle's cells share everything but α and the upstream net; the cell dedupes the nets and the α
values and measures the whole (net × forget set × α) sweep in one call of each kernel.
Forget sets: anchor l (``forget`` >= 0), one l drawn per net (``forget`` = -1, seeded by
``forget_seed`` and the upstream cell's coordinates, App. E), or every l (``forget`` = -2,
Def 2.2's "for every l": scalars are the max over l, ``*_mean`` the mean); the set of anchor l is
{l, l+1, …, l+k−1} mod m.
"""

from __future__ import annotations

import hashlib
import math

import torch

from tasks.cells.train_kkt import RNG_BYTES
from tasks.data import mixture
from tasks.kkt.measure import kkt_measure, outputs
from tasks.train.fixed_output import init_weights
from tasks.unlearn import METHODS, log_beta
from tasks.unlearn import bounds as bnd
from tasks.unlearn import references as ref

TEST_CHUNK = 2e7  # elements of one (nets, sets, α, test points, neurons) block
ALPHA_CHUNK = 3e7  # elements of the unlearned nets of one chunk of α values (~240 MB float64)


def _check_nets(v: torch.Tensor, width: torch.Tensor, linear: bool) -> None:
    for e in range(v.shape[0]):
        n = int(width[e])
        if linear:
            if n != 1 or float(v[e, 0]) != 1.0:
                raise ValueError(f"model: 'linear' needs width-1 nets with v = 1 (a train_kkt stage with model: linear), "
                                 f"net {e} has width {n}")
        elif not torch.allclose(v[e, :n].abs(), torch.full((n,), 1 / math.sqrt(n), dtype=v.dtype), rtol=1e-12):
            raise ValueError("model: unlearn needs nets with a frozen ±1/√n output layer (a train_kkt stage); "
                             f"net {e} has |v_j| in [{float(v[e, :n].abs().min()):.3g}, {float(v[e, :n].abs().max()):.3g}]")


def parse_forget_set(text: str) -> list[int]:
    """``forget_set`` as written ('3, 17, 42') -> [3, 17, 42]; '' -> []. ValueError (one line) on anything
    but distinct non-negative integers."""
    parts = [p.strip() for p in str(text).split(",")] if str(text).strip() else []
    if any(not p.isdigit() for p in parts):
        raise ValueError(f"{text!r}: write distinct non-negative indices separated by commas, e.g. '3, 17, 42'")
    idx = [int(p) for p in parts]
    if len(set(idx)) != len(idx):
        raise ValueError(f"{text!r}: an index is given twice")
    return idx


def forgotten_count(c: dict) -> int:
    """k of a cell: the size of ``forget_set`` if given, else ``k``."""
    return len(parse_forget_set(c.get("forget_set", ""))) or c["k"]


def forget_sets(c: dict, m: torch.Tensor, keys: list[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(F (E,L,M) bool, anchors (E,L) int64, ok (E,L) bool) of the cell's forget rule per net; with
    ``forget_set`` its points (anchor: the first listed)."""
    E, M, k, f = len(keys), int(m.max()), c["k"], c["forget"]
    chosen = parse_forget_set(c.get("forget_set", ""))
    if chosen:
        for e in range(E):
            me = int(m[e])
            if max(chosen) >= me or len(chosen) >= me:
                raise ValueError(f"forget_set: {chosen} is out of range or leaves no retained point for a net "
                                 f"with m = {me} points")
        F = torch.zeros(E, 1, M, dtype=torch.bool)
        F[:, 0, chosen] = True
        return F, torch.full((E, 1), chosen[0], dtype=torch.int64), torch.ones(E, 1, dtype=torch.bool)
    for e in range(E):
        me = int(m[e])
        if f >= me:
            raise ValueError(f"forget: index {f} is out of range for a net with m = {me} points")
        if k >= me:
            raise ValueError(f"k: forgetting k = {k} of m = {me} points leaves no retained point (need k < m)")
    L = M if f == -2 else 1
    anchors = torch.zeros(E, L, dtype=torch.int64)
    ok = torch.zeros(E, L, dtype=torch.bool)
    for e, key in enumerate(keys):
        me = int(m[e])
        if f == -2:
            anchors[e, :me], ok[e, :me] = torch.arange(me), True
        elif f == -1:
            anchors[e, 0], ok[e, 0] = app_e_anchor(c, key, me), True
        else:
            anchors[e, 0], ok[e, 0] = f, True
    F = torch.zeros(E, L, M, dtype=torch.bool)
    for r in range(k):
        idx = (anchors + r) % m[:, None]
        F.scatter_(2, idx.unsqueeze(-1), True)
    return F & ok.unsqueeze(-1), anchors, ok


def app_e_anchor(c: dict, key: str, m: int) -> int:
    """App. E's one random forgotten point of a net: drawn from ``forget_seed`` and the upstream
    cell's coordinates ``key`` (``forget`` = -1; with -2 the same l is read back as ``eps_app_e``)."""
    h = int(hashlib.sha256(f"{c['forget_seed']}|{key}".encode()).hexdigest()[:15], 16)
    return int(torch.randint(0, m, (1,), generator=torch.Generator().manual_seed(h)))


def _test_acc(W, u, W_hat, rng, d, cs, linear):
    """Thm 6.1 / P001-10: accuracy on fresh D_MG points and Lemma D.7's sign-identity fraction,
    before (E,) and after (E,L,A); ``cs`` one cell per net (its mu_a, mu_scaling)."""
    E, T = W.shape[0], cs[0]["test_points"]
    Xt = torch.zeros(E, T, W.shape[-1], dtype=W.dtype)
    yt = torch.zeros(E, T, dtype=W.dtype)
    for e in range(E):
        g = torch.Generator()
        g.set_state(rng[e, RNG_BYTES:2 * RNG_BYTES].to(torch.uint8).clone())
        mu = mixture.mixture_mean(int(d[e]), cs[e]["mu_a"], cs[e]["mu_scaling"], g)
        Xt[e, :, : int(d[e])], yt[e] = mixture.mixture_points(T, mu, g, balanced_retry=False)
    uu = None if linear else u
    acc0 = ((yt * outputs(W, uu, Xt)) > 0).double().mean(-1)
    sgn = lambda Wx, Xx, uy: (torch.sign(Xx @ Wx.transpose(-1, -2)) == uy).double()  # noqa: E731
    uy = (yt.unsqueeze(-1) * torch.sign(u).unsqueeze(1))  # (E,T,n)
    live = (u != 0).double().unsqueeze(1)
    sig0 = (sgn(W, Xt, uy) * live).sum((-1, -2)) / (live.sum((-1, -2)) * T)
    E_, L, A = W_hat.shape[:3]
    acc1 = torch.zeros(E_, L, A, dtype=W.dtype)
    sig1 = torch.zeros(E_, L, A, dtype=W.dtype)
    step = max(1, int(TEST_CHUNK // max(1, E * L * T * W.shape[-2])))
    for a0 in range(0, A, step):  # chunks of α (memory), never a loop over nets
        Wa = W_hat[:, :, a0:a0 + step]
        Xb, yb = Xt[:, None, None], yt[:, None, None]
        acc1[:, :, a0:a0 + step] = ((yb * outputs(Wa, None if linear else u[:, None, None], Xb)) > 0).double().mean(-1)
        s = sgn(Wa, Xb, uy[:, None, None]) * live[:, None, None]
        sig1[:, :, a0:a0 + step] = s.sum((-1, -2)) / (live.sum((-1, -2))[:, None, None] * T)
    return acc0, acc1, sig0, sig1


def with_bias_column(W, b, X, mask, train_bias):
    """Nets whose bias is trained as first-layer weights on inputs with a constant feature: W' = [W, b],
    x' = [x, 1], so f, its gradient over (W, b), the KKT measures and the GA step all carry the bias
    (paper 003's biased lazy nets). Nets without a trained bias get a 0 feature (their b must be 0:
    a frozen non-zero bias is refused). Returns (W' (E,n,d+1), X' (E,M,d+1))."""
    frozen = ~train_bias & (b.abs().amax(-1) > 0)
    if bool(frozen.any()):
        raise ValueError("unlearn needs a trained bias or none: these nets have a fixed non-zero bias (adv_train "
                         "with bias on); the GA step and the KKT measures are over W alone")
    one = (mask & train_bias[:, None]).to(X.dtype).unsqueeze(-1)
    return torch.cat([W, b.unsqueeze(-1)], -1), torch.cat([X, one], -1)


# A cell that stores no net (forget = -2 measures m of them; store_nets: false): every array empty (all fill).
NO_NET = {"nets_stored": 0, **{k: torch.zeros((0,) * r, dtype=torch.float64).numpy() for k, r in
                              (("W", 2), ("b", 1), ("v", 1), ("X", 2), ("y", 1))},
          "forgotten": torch.zeros(0, dtype=torch.int8).numpy(), "batch_rng_state": torch.zeros(0, dtype=torch.uint8).numpy()}


def stored_nets(W_hat, v, X, y, d, m, width, rng, F, anchors_ok, biased: bool) -> list[dict]:
    """Per net and α the unlearned net as a producer stores it (the ``nets`` contract): W, b (split off
    the bias column), v, the training set X, y (forgotten points included, flagged by ``forgotten``),
    true sizes and the upstream's generator state. W_hat (E,1,A,n,d'), F (E,1,M) bool."""
    E, A = W_hat.shape[0], W_hat.shape[2]
    out = []
    for e in range(E):
        n, de, me = int(width[e]), int(d[e]), int(m[e])
        rows = []
        for a in range(A):
            Wa = W_hat[e, 0, a]
            b = Wa[:n, -1] if biased else torch.zeros(n, dtype=Wa.dtype)
            rows.append({"W": Wa[:n, :de].numpy(), "b": b.numpy(), "v": v[e, :n].numpy(), "X": X[e, :me, :de].numpy(),
                         "y": y[e, :me].numpy(), "forgotten": F[e, 0, :me].to(torch.int8).numpy(),
                         "d_used": de, "nets_stored": 1, "batch_rng_state": rng[e].to(torch.uint8).numpy()})
        out.append(rows)
    return out


def unlearn(W, b, v, X, y, mask, d, m, width, rng, keys: list[str], cells: list[dict],
            train_bias: torch.Tensor | None = None, progress=None, device=None) -> list[dict]:
    """W (E,n,d), b, v (E,n), X (E,M,d), y (E,M), mask (E,M), d, m, width (E,) int, rng (E,bytes) uint8:
    the upstream nets of ``cells`` in order (repeats: one net, several α); ``keys`` name each cell's
    upstream cell; ``train_bias`` (E,) bool: whose bias was trained (their contract; then the bias
    takes part in the measures and the step, :func:`with_bias_column`). Returns one dict per cell,
    with the unlearned net (:func:`stored_nets`) where the cell has one forget set and ``store_nets``.
    ``progress``: the optional ``progress(done, of, loss)`` of the retraining (retrain, ref_retrain);
    ``device``: where the retraining runs (None: the CPU, with everything else)."""
    c0 = cells[0]
    linear, tol, method = c0["model"] == "linear", c0["tie_tol"], c0["unlearn_method"]
    for f in ("model", "loss", "init_scale", "retrain_lr", "retrain_wd", "retrain_epochs", "unlearn_method", "tie_tol",
              "ref_retrain", "test_points"):  # inherited per upstream cell, or in the bundle key: one per bundle
        if len({c[f] for c in cells}) > 1:
            raise ValueError(f"{f}: the cells of one bundle have different values {sorted({c[f] for c in cells})} "
                             "(the nets' training, or the bundle's cut); give the unlearn stage one value per run")
    uniq = list(dict.fromkeys(keys))
    pick = torch.tensor([keys.index(k) for k in uniq])
    W, b, v, X, y, mask = (t[pick].double() if t.is_floating_point() else t[pick] for t in (W, b, v, X, y, mask))
    d, m, width, rng = d[pick], m[pick], width[pick], rng[pick]
    y = torch.where(mask, y, torch.zeros_like(y))
    _check_nets(v, width, linear)
    stats = bnd.data_stats(X, mask, 1)  # Assumption 2.3's ψ̂, φ̂ on the data as given (before a bias column)
    X_data = X
    tb = torch.zeros(len(uniq), dtype=torch.bool) if train_bias is None else train_bias[pick]
    biased = bool(tb.any()) or bool(b.abs().amax() > 0)
    if biased:
        if method == "retrain" or c0["ref_retrain"] or c0["test_points"] > 0:
            raise ValueError("retrain, ref_retrain and test_points redraw paper 001's bias-free init and D_MG data: "
                             "not for nets with a bias")
        W, X = with_bias_column(W, b, X, mask, tb)
    u = None if linear else v
    alphas = torch.tensor(sorted({float(c["alpha"]) for c in cells}), dtype=torch.float64)
    F, anchors, ok = forget_sets(c0, m, uniq)
    E, L, A = F.shape[0], F.shape[1], alphas.shape[0]
    # trained net on S (K1), its certificate λ at the raw scale
    r1 = kkt_measure(W, u, X, y, mask, "nnls", tol=tol)
    lam_raw = torch.where(r1.feasible.unsqueeze(-1), r1.lam / r1.c.unsqueeze(-1), torch.zeros_like(r1.lam))
    kw = {"tol": tol}
    if method == "retrain" or c0["ref_retrain"]:
        W0 = torch.zeros_like(W)
        for e in range(E):
            g = torch.Generator()
            g.set_state(rng[e, :RNG_BYTES].to(torch.uint8).clone())
            n_e = 1 if linear else int(width[e])
            W0[e, :n_e, : int(d[e])] = init_weights(n_e, int(d[e]), g, c0["init_scale"])
        rt = dict(W0=W0, lr=c0["retrain_lr"], wd=c0["retrain_wd"], epochs=c0["retrain_epochs"], loss=c0["loss"],
                  valid=mask)
        W_rt = METHODS["retrain"](W, u, X, y, lam_raw, F, alphas[:1], **rt, progress=progress,
                                  device=device)  # (E,L,1,n,d), back on the CPU
        kw.update(rt)
    ub = None if linear else u[:, None, None]
    Xb, yb = X[:, None, None], y[:, None, None]
    retain = (mask[:, None] & ~F)  # (E,L,M)
    rv = retain[:, :, None]
    n_true = torch.ones(E, dtype=torch.float64) if linear else width.double()
    eps_d = 4 * m.double() * stats["phi"] * (1 if linear else n_true)
    q0 = y * outputs(W, u, X)
    cnt = lambda ok_, w: (ok_.double() * w).sum(-1) / w.sum(-1).clamp_min(1)  # noqa: E731
    acc_before = cnt(q0[:, None] > 0, retain.double())  # (E,L)
    per_net = [cells[keys.index(k)] for k in uniq]
    w_star = ref.svm_retain(X[:, None], y[:, None], retain)[0] if linear else None
    lam_S = None if linear else ref.forgotten_pattern(W, X, F * r1.lam[:, None], tol)  # (E,L,n), rescaled

    def chunk(al: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every α-dependent number for the α values ``al``, (E,L,a) each."""
        a = al.shape[0]
        W_hat = W_rt.expand(E, L, a, *W.shape[1:]) if method == "retrain" else METHODS[method](
            W, u, X, y, lam_raw, F, al, **kw)
        after = kkt_measure(W_hat, ub, Xb, yb, rv, "nnls", tol=tol)
        inher = kkt_measure(W_hat, ub, Xb, yb, rv, "inherited", lam_inherit=r1.lam[:, None, None],
                            c_inherit=r1.c[:, None, None], tol=tol)
        dyn = kkt_measure(W_hat, ub, Xb, yb, rv, "dynamics", loss=c0["loss"], tol=tol)
        nan = torch.full((E, L, a), math.nan, dtype=torch.float64)
        out = {"eps": after.eps, "delta": after.delta, "eps_rel": after.eps_rel, "feasible": after.feasible,
               "n_support": after.n_support.double(), "eps_inherited": inher.eps, "delta_inherited": inher.delta,
               "eps_dynamics": dyn.eps, **{k: nan for k in ("tau_fixed", "eps_fixed", "delta_fixed", "tau_rt",
                                                             "eps_rt", "delta_rt", "cos_svm", "tau_svm")}}
        if not linear:  # the proof's fixed net (K3), built on θ̂ at the trained net's certificate scale c1
            # (App. C.2: θ̂ = θ − λ_l y_l ∇N at the scale where λ certifies θ, so θ̂ and lam_S share c1, not
            # the unlearned net's own min-margin scale)
            Wf = ref.fixed_net(W_hat * r1.c[:, None, None, None, None], u[:, None, None], Xb, W[:, None, None],
                               lam_S[:, :, None], rv, eps_d[:, None, None], m[:, None, None].double(),
                               n_true[:, None, None])
            rf = kkt_measure(Wf, ub, Xb, yb, rv, "nnls", tol=tol)
            out.update(tau_fixed=ref.tau(W_hat, Wf), eps_fixed=rf.eps, delta_fixed=rf.delta)
        if method == "retrain" or c0["ref_retrain"]:
            rr = kkt_measure(W_rt, ub, Xb, yb, rv, "nnls", tol=tol)
            out.update(tau_rt=ref.tau(W_hat, W_rt), eps_rt=rr.eps.expand(E, L, a), delta_rt=rr.delta.expand(E, L, a))
        if linear:
            out["cos_svm"] = ref.cossim(W_hat, w_star[:, :, None])
            out["tau_svm"] = 1 - out["cos_svm"]
        q1 = yb * outputs(W_hat, ub, Xb)  # (E,L,a,M)
        out["acc_after"], out["forgot_after"] = cnt(q1 > 0, rv.double()), cnt(q1 > 0, F[:, :, None].double())
        if c0["test_points"] > 0:
            out["acc0"], out["acc1"], out["sig0"], out["sig1"] = _test_acc(W, v, W_hat, rng, d, per_net, linear)
        if keep_nets:
            out["W_hat"] = W_hat
        return out

    keep_nets = L == 1 and any(c.get("store_nets", True) for c in cells)
    size = E * L * (W.shape[1] + X.shape[1]) * W.shape[2]  # elements of one α's nets (and gradients)
    step = max(1, int(ALPHA_CHUNK // max(1, size)))
    parts = [chunk(alphas[i:i + step]) for i in range(0, A, step)]  # chunks of α (memory), not of nets
    T = {k: torch.cat([p[k] for p in parts], 2) if parts[0][k].dim() in (3, 5) else parts[0][k] for k in parts[0]}
    nets = stored_nets(T["W_hat"], v, X_data, y, d, m, width, rng, F, ok, biased) if keep_nets else None
    test = (T["acc0"], T["acc1"], T["sig0"], T["sig1"]) if c0["test_points"] > 0 else None
    logb = log_beta(lam_raw.clamp_min(1e-300), q0, c0["loss"])  # (E,M)
    out = []
    for i, c in enumerate(cells):
        e, a = uniq.index(keys[i]), int((alphas == float(c["alpha"])).nonzero()[0, 0])
        okL = ok[e]
        mx = lambda t: float(t[e, okL, a].max()) if t.dim() == 3 else float(t[e, okL].max())  # noqa: E731
        mean = lambda t: float(t[e, okL, a].mean()) if t.dim() == 3 else float(t[e, okL].mean())  # noqa: E731
        me, ne, k = int(m[e]), int(n_true[e]), forgotten_count(c)
        eps1, delta1 = float(r1.eps[e]), float(r1.delta[e])
        b = bnd.bounds("linear" if linear else "two_layer", me, ne, k, eps1, delta1, float(eps_d[e]),
                       float(stats["psi"][e]), float(stats["phi"][e]))
        lam_e = r1.lam[e, :me]
        act_mass = (lam_e * r1.active_frac[e, :me]) if not linear else lam_e
        lem = bnd.multiplier_lemmas("linear" if linear else "two_layer", lam_e, act_mass,
                                    X[e, :me].pow(2).sum(-1), ne, eps1, delta1, float(eps_d[e]))
        anc = anchors[e, okL]
        eps_l = torch.full((me,), math.nan, dtype=torch.float64)  # the net's own m, whatever its bundle's
        eps_l[anc] = T["eps"][e, okL, a]
        res = {
            "m_used": me, "width_used": ne, "n_forget_sets": int(okL.sum()),
            "feasible": int(bool(T["feasible"][e, okL, a].all())),
            "eps": mx(T["eps"]), "delta": mx(T["delta"]), "eps_rel": mx(T["eps_rel"]),
            "eps_mean": mean(T["eps"]), "delta_mean": mean(T["delta"]), "eps_rel_mean": mean(T["eps_rel"]),
            "eps_app_e": float(eps_l[app_e_anchor(c, keys[i], me)]) if c["forget"] in (-1, -2) and not
            c.get("forget_set") else math.nan,
            "eps_inherited": mx(T["eps_inherited"]), "delta_inherited": mx(T["delta_inherited"]),
            "eps_dynamics": mx(T["eps_dynamics"]),
            "eps1": eps1, "delta1": delta1, "eps1_rel": float(r1.eps_rel[e]), "feasible1": int(r1.feasible[e]),
            "q_min1": float(r1.q_min[e]),
            "lam_l": float(lam_e[anc].mean()) if me else math.nan,
            "q_l": float(q0[e, anc].mean()), "log_beta_l": float(logb[e, anc].mean()),
            "lam_min": float(lam_e.min()), "lam_max": float(lam_e.max()),
            "n_support": int(r1.n_support[e]), "n_support_after": mean(T["n_support"]),
            "act_mass_min": float(act_mass.min()), "act_mass_max": float(act_mass.max()),
            "tau_fixed": mx(T["tau_fixed"]), "eps_fixed": mx(T["eps_fixed"]), "delta_fixed": mx(T["delta_fixed"]),
            "tau_retrain": mx(T["tau_rt"]), "eps_retrain": mx(T["eps_rt"]), "delta_retrain": mx(T["delta_rt"]),
            "cos_svm": float(T["cos_svm"][e, okL, a].min()), "tau_svm": mx(T["tau_svm"]),
            "train_acc_before": mean(acc_before), "train_acc_after": mean(T["acc_after"]),
            "forget_acc_after": mean(T["forgot_after"]),
            "test_acc_before": float(test[0][e]) if test else math.nan,
            "test_acc_after": mean(test[1]) if test else math.nan,
            "sign_id_before": float(test[2][e]) if test else math.nan,
            "sign_id_after": mean(test[3]) if test else math.nan,
            "psi": float(stats["psi"][e]), "phi": float(stats["phi"][e]), "eps_d": float(eps_d[e]),
            "bound_eps": b.eps, "bound_eps_stated": b.eps_stated, "bound_delta_stated": b.delta_stated,
            "bound_delta_proof": b.delta_proof, "bound_tau_stated": b.tau_stated, "bound_tau_proof": b.tau_proof,
            "preconditions_met": int(b.preconditions_met),
            "violated": sum(1 << bnd.PRECONDITIONS.index(x) for x in b.violated),
            "lemma_upper": int(next(iter(lem.values()))), "lemma_lower": int(list(lem.values())[-1]),
            "eps_l": eps_l.numpy(),
        }
        res.update(nets[e][a] if nets and c.get("store_nets", True) else dict(NO_NET, d_used=int(d[e])))
        out.append(res)
    return out
