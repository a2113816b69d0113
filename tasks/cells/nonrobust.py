"""The cell of experiment ``nonrobust`` (paper 002, Vardi, Yehudai & Shamir): cells that share
shapes in, stacked nets trained and measured, one dict of numbers per cell out.

A bundle is padded to common (m, d, k): features and samples with zeros (masked), width with
all-zero neurons, which are exact fixed points of GD (spec 002 §7.2). Every measure below is
computed per cell at its true (m, d): no number depends on the cells it was bundled with.
"""

from __future__ import annotations

import math

import torch

from tasks import attacks, data, kkt, nets, train

KKT_ITERS = 3000  # FISTA iterations of the KKT fit (``kkt.kkt_fit``'s)
ANALYSIS_STEPS = KKT_ITERS + 3  # :func:`analyse`'s progress: c*, the KKT fit's iterations, Thm 4.1, the robust net


def n_samples(cell: dict) -> int:
    """m = round(d^α) when the cell's m is 0 (paper 002 Fig. 1a; spec 002 §2.7)."""
    return cell["m"] or int(math.floor(cell["d"] ** cell["alpha"] + 0.5))


def build(cells: list[dict], datasets: list | None = None):
    """Data and initial nets of a bundle, zero-padded to common (m, d, k), float64 on CPU.
    ``datasets``: per cell None (synthetic, from its seed) or the (X (m,d), y (m,)) read from a file
    (e.g. CIFAR-10 for paper 004 F004-2); the init still comes from the cell's seed.

    Returns (net, X (E,m,d), y (E,m), mask (E,m), batch generators)."""
    d_pad = max(c["d"] for c in cells)
    m_pad = max(n_samples(c) for c in cells)
    k_pad = max(c["width"] for c in cells)
    E = len(cells)
    X = torch.zeros(E, m_pad, d_pad, dtype=torch.float64)
    y = torch.ones(E, m_pad, dtype=torch.float64)
    mask = torch.zeros(E, m_pad, dtype=torch.bool)
    stack, gens = [], []
    for e, c in enumerate(cells):
        m, d = n_samples(c), c["d"]
        g = data.seed_streams(c["seed"], salt=(d, m))
        if datasets is not None and datasets[e] is not None:
            Xe, ye = datasets[e]
        else:
            Xe, ye = data.synthetic(c["data"], m, d, g, balanced=c["labels"] == "balanced",
                                    sign_x1=c["labels"] == "sign_x1")
        X[e, :m, :d], y[e, :m], mask[e, :m] = Xe, ye, True
        stack.append(nets.init_two_layer(d, c["width"], g["init"], init_scale=c["init_scale"],
                                         d_pad=d_pad, k_pad=k_pad))
        gens.append(g["batches"])
    return nets.stack(stack), X, y, mask, gens


def schedule(c: dict) -> train.Schedule:
    """Paper 002 Sec. 6 schedule from a cell's parameters (spec 002 §2.6, E14)."""
    return train.Schedule(loss=c["loss"], lr0=c["lr0"], factor=c["lr_factor"], period=c["lr_period"],
                          period_fast=c["lr_period_fast"] or None, target_loss=c["target_loss"],
                          max_iters=c["max_iters"], batch_size=c["batch_size"])


def chunk_steps(cells: list[dict], sched: train.Schedule) -> int:
    """Steps per train() call between checkpoints: ~1000, a multiple of the sync period and of
    the batches per epoch, so a chunked run takes exactly the steps of an unchunked one."""
    m = n_samples(cells[0])
    per_epoch = math.ceil(m / sched.batch_size) if m > sched.batch_size else 1
    unit = math.lcm(sched.sync_every, per_epoch)
    return unit * max(1, 1000 // unit)


def robust(X: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, d: torch.Tensor,
           z_hat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Theorem 3.1 nets on every cell's data, one stacked problem: certified radius (1-ρ)√d/2 and
    their c* along the same ẑ (spec 002 §2.10, E8), (E,) each; NaN where ρ >= 1 (the theorem does
    not apply, e.g. clustered data).

    Departure from spec 002 E8: only this comparison is computed. Not implemented: E8's
    trajectory run (GD started at the scaled Thm 3.1 net with the paper schedule, logging c*(t)
    and γ(t)), the robust net's γ and its per-sample minimal perturbations (E11); the stated
    radius (1-ρ)√d/4 is half the stored one. The experiment therefore does not list E8."""
    net, rho = nets.robust_net(X, y, mask, d)
    applies = (rho >= 0) & (rho < 1)
    c_star = attacks.c_star_exact(net, X, y, mask, z_hat).c_star
    nan = torch.full_like(rho, math.nan)
    return torch.where(applies, (1 - rho) * torch.sqrt(d) / 2, nan), torch.where(applies, c_star, nan)


def _kkt_per_cell(net, X, y, mask, cells, progress=None) -> list[kkt.KKTFit | None]:
    """The KKT fit (spec 002 §2.11) of every cell with m <= its ``kkt_max_m`` whose net separates its
    data (q_min > 0: θ̂ = θ/√q_min is defined; a diverged net has NaN weights, one stopped early may
    misclassify, and either made ``eigvalsh`` fail on an overflowing Gram matrix), on a sub-stack cut
    to those cells' largest m (so a small-m cell never depends on a large one); None elsewhere.
    ``progress``: the fit's (``kkt.nnls``'s; not called when no cell is fitted)."""
    q_min = kkt.margins(net, X, y).masked_fill(~mask, math.inf).min(1).values
    fits_ok = (net.finite() & (q_min > 0)).tolist()
    idx = [e for e, c in enumerate(cells) if n_samples(c) <= c["kkt_max_m"] and fits_ok[e]]
    out: list[kkt.KKTFit | None] = [None] * len(cells)
    if not idx:
        return out
    m_sub = max(n_samples(cells[e]) for e in idx)
    fit = kkt.kkt_fit(net.select(idx), X[idx, :m_sub], y[idx, :m_sub], mask[idx, :m_sub], iters=KKT_ITERS,
                      progress=progress)
    for j, e in enumerate(idx):
        out[e] = fit.select(j)
    return out


def _median(t: torch.Tensor) -> torch.Tensor:
    """The usual (midpoint) median of a non-empty 1-d tensor: the mean of the two middle values for an
    even count (numpy's; torch's ``median`` is the lower one)."""
    s = t.flatten().sort().values
    return 0.5 * (s[(s.numel() - 1) // 2] + s[s.numel() // 2])


def analyse(net: nets.TwoLayer, X, y, mask, cells: list[dict], gens, progress=None) -> list[dict]:
    """Every measure of paper 002 on a trained float64 stack: margins and margin sets (Sec. 6,
    A13/A14), the universal direction and exact c* (§2.9), KKT residuals (§2.11), Theorem 4.1's
    check (§3), the Theorem 3.1 robust net (E8). ``progress`` (optional): called as
    ``progress(done, ANALYSIS_STEPS)`` at the start, after c*, every 100 iterations of the KKT fit,
    after it, after Thm 4.1's check and at the end."""
    step = (lambda done: progress(done, ANALYSIS_STEPS)) if progress is not None else (lambda done: None)  # noqa: E731
    step(0)
    c0 = cells[0]
    d_true = torch.tensor([float(c["d"]) for c in cells], dtype=X.dtype)
    q = kkt.margins(net, X, y)
    I = kkt.margin_set(q, mask, c0["slack"])
    I_tight = kkt.margin_set(q, mask, 1.01)  # spec 002 A13: Cor 4.1 uses the exact margin set
    z_hat = attacks.DIRECTIONS[c0["attack"]](net, X, y, I, gens)
    flip = attacks.c_star_exact(net, X, y, I, z_hat, cap=20 * torch.sqrt(d_true))
    step(1)
    flipped = attacks.flipped_fraction(net, X, y, mask, z_hat, flip.c_star)
    gamma = kkt.normalized_margin(net, q, mask)
    balance = kkt.balance_error(net)
    fits = _kkt_per_cell(net, X, y, mask, cells, progress=lambda it, of: step(1 + it))
    step(1 + KKT_ITERS)
    th = kkt.theory_check(net, X, y, I_tight, d=d_true)  # Cor 4.1 on the exact margin set (A13)
    step(2 + KKT_ITERS)
    rob_radius, rob_c = robust(X, y, mask, d_true, z_hat)
    step(ANALYSIS_STEPS)
    qv = q.masked_fill(~mask, math.nan)
    out = []
    for e, c in enumerate(cells):
        m, d = n_samples(c), c["d"]
        r_i = flip.r[e, :m][I[e, :m]]
        norms = X[e, :m, :d].norm(dim=1)
        qe = q[e, :m]
        correct = qe > 0
        fit = fits[e]
        out.append({
            "m_used": m, "train_acc": float(correct.double().mean()),
            "q_min": float(qe.min()), "q_ratio": float(qe.max() / qe[correct].min()) if correct.any() else math.nan,
            "gamma": float(gamma[e]),
            "margin_frac": float(I[e].sum()) / m, "n_off_margin": int(m - I[e].sum()),
            "margin_frac_tight": float(I_tight[e].sum()) / m,
            "c_star": float(flip.c_star[e]), "c_star_rel": float(flip.c_star[e]) / math.sqrt(d),
            "c_star_rel_norm": float(flip.c_star[e] / _median(norms)),
            "simultaneous": int(flip.simultaneous_at_c0[e]), "frac_all_flipped": float(flipped[e]),
            "r_median": float(_median(r_i)) if len(r_i) else math.nan,
            "r_min": float(r_i.min()) if len(r_i) else math.nan,
            "kkt_eps": float(fit.eps) if fit else math.nan,
            "kkt_eps_proj": float(fit.eps_proj) if fit else math.nan,
            "kkt_delta": float(fit.delta) if fit else math.nan,
            "kkt_sum_lam_ratio": float(fit.sum_lam_ratio) if fit else math.nan,
            "kkt_support": int((fit.lam > 0).sum()) if fit else -1,
            "balance_err": float(balance[e]),
            "theory_p": float(th.p[e]), "theory_c_bal": float(th.c_bal[e]),
            "theory_c_prime": float(th.c_prime[e]), "theory_z_norm": float(th.z_norm[e]),
            "theory_max_pos": float(th.max_pos[e]), "theory_min_neg": float(th.min_neg[e]),
            "robust_radius": float(rob_radius[e]), "robust_c_star": float(rob_c[e]),
            "q_sample": qv[e, :m].numpy(), "r_sample": flip.r[e, :m].numpy(),
            "margin_tight_sample": I_tight[e, :m].numpy().astype("int8"),
            "lam_sample": fit.lam[:m].numpy() if fit else torch.full((m,), math.nan).numpy(),
        })
    return out
