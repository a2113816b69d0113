"""The numerical check of benchmarks/wide_step_variants.py (issue 46): each variant's parameter
update after CHECK_STEPS steps against kktlab's own step (a) from the same init, at an LR picked per
shape so that (a) is stable and really moves the parameters (GPU session 4 checked at a fixed LR at
which (a) diverged: every ratio was degenerate); the step's floor; the run's closing table.

    from benchmarks.wide_step_check import CHECK_STEPS, floor, pick_check_lr, print_summary, rel_diff
"""

from __future__ import annotations

import math

import torch

from tasks.train import gd

CHECK_STEPS = 16  # steps of the numerical check (four Gram blocks of 4, one of 16, two CUDA graphs of 8)
# The check's LR: the largest of this ladder at which kktlab's own step (a) stays finite and lowers the loss
# over the check's steps (pick_check_lr). One fixed LR does not fit every shape: the 'sphere' data have
# ||x|| = sqrt(d) (28 at d = 784), so the step's curvature grows with d and k, and at B = 64, d = 784 the
# former fixed 1e-2 made (a) diverge within 6 steps at k = 1e4 and 1e5 (GPU session 4: NaN parameters on
# every side, so every ratio was degenerate: max_diff_over_update 0, max_param_rel_diff inf).
CHECK_LRS = (1e-2, 3e-3, 1e-3, 3e-4, 1e-4, 3e-5, 1e-5, 3e-6, 1e-6)
CHECK_LR = CHECK_LRS[0]  # the default before pick_check_lr has run
CHECK_TOL = 1e-3  # the check passes when the variant's update differs from (a)'s by at most this (relative, Frobenius)
MIN_UPDATE_REL = 1e-6  # ... and (a)'s own update is at least this fraction of the parameters (not a no-op)


def _finite_or_inf(x: float) -> float:
    return x if math.isfinite(x) else math.inf


def rel_diff(params, ref, start=None) -> dict:
    """The variant's parameters ``params`` against (a)'s ``ref`` after the check's steps from ``start``
    (dict W, b, v): the largest |p - p_ref| / max|p_ref| over W, b, v; with ``start``, the same over
    (a)'s largest change max|p_ref - p_start|, the Frobenius norm of the difference of the two updates
    over that of (a)'s update (``update_rel_diff_vs_a``: the check's number), how far (a) moved
    (``ref_update_rel`` = ||p_ref - p_start|| / ||p_start||), and ``check_ok``. Every ratio is +inf
    where the variant's parameters are not finite, and the check is marked invalid (``check_ok`` False,
    ``check_invalid`` says why) where (a) itself is not finite or did not move."""
    out = {"max_param_rel_diff_vs_a": 0.0}
    if start is not None:
        out.update(max_diff_over_update_vs_a=0.0, update_rel_diff_vs_a=0.0, ref_update_rel=0.0)
        num2 = den2 = start2 = 0.0
    finite_p, finite_r = True, True
    for name, p, r in zip("Wbv", params, ref):
        p, r = p.double().cpu(), r.double().cpu()
        finite_p &= bool(torch.isfinite(p).all())
        finite_r &= bool(torch.isfinite(r).all())
        d = _finite_or_inf(float((p - r).abs().max()))
        out["max_param_rel_diff_vs_a"] = max(out["max_param_rel_diff_vs_a"], d / max(float(r.abs().max()), 1e-300))
        if start is not None:
            s0 = start[name].double().cpu()
            upd = float((r - s0).abs().max())
            out["max_diff_over_update_vs_a"] = max(out["max_diff_over_update_vs_a"], d / max(upd, 1e-300))
            num2 += float(((p - s0) - (r - s0)).pow(2).sum())
            den2 += float((r - s0).pow(2).sum())
            start2 += float(s0.pow(2).sum())
    if not finite_p:
        out["max_param_rel_diff_vs_a"] = math.inf
    if start is None:
        return out
    if not finite_p:
        out["max_diff_over_update_vs_a"] = math.inf
    out["update_rel_diff_vs_a"] = _finite_or_inf(math.sqrt(num2 / den2)) if den2 > 0 else math.inf
    out["ref_update_rel"] = math.sqrt(den2 / start2) if start2 > 0 and math.isfinite(den2) else math.nan
    why = ("(a) not finite after the check's steps" if not finite_r else
           f"(a) moved by {out['ref_update_rel']:.1e} < {MIN_UPDATE_REL:g} of its parameters"
           if not out["ref_update_rel"] >= MIN_UPDATE_REL else None)
    out["check_ok"] = why is None and finite_p and out["update_rel_diff_vs_a"] <= CHECK_TOL
    if why:
        out["check_invalid"] = why
    return out


def pick_check_lr(net, X, y, lrs=CHECK_LRS, steps: int | None = None) -> tuple[float, list[dict]]:
    """The check's LR for one shape: the first of ``lrs`` (largest first) at which kktlab's own step
    (:class:`KktlabStepper`, ``steps`` = CHECK_STEPS steps from ``net``) stays running and finite and
    ends below its first step's loss without a rise over a step of more than 1e-6 relative (a stable
    step, so rounding differences are not amplified), its W moving measurably; each trial recorded.
    Falls back to the smallest LR."""
    from benchmarks.wide_step_kernels import KktlabStepper, schedule  # (that module imports this one)

    steps = steps or CHECK_STEPS
    trials = []
    for lr in lrs:
        ks = KktlabStepper(net.clone(), X, y, schedule(lr))
        W0 = ks.params()[0].double().clone()
        losses = []
        for _ in range(steps):
            ks.step()
            losses.append(float(ks.st.log_loss[0]))
        W = ks.params()[0].double()
        running = int(ks.st.status[0]) == gd.RUNNING
        finite = bool(torch.isfinite(W).all()) and all(math.isfinite(v) for v in losses)
        rises = [b - a for a, b in zip(losses, losses[1:])]
        monotone = finite and all(r <= 1e-6 * max(abs(a), 1e-12) for r, a in zip(rises, losses))
        moved = float((W - W0).norm() / W0.norm().clamp_min(1e-300)) if finite else math.nan
        ok = running and finite and monotone and losses[-1] < losses[0] and moved >= MIN_UPDATE_REL
        trials.append({"lr": lr, "ok": ok, "running": running, "finite": finite, "monotone": monotone,
                       "log_loss_first": losses[0], "log_loss_last": losses[-1], "W_update_rel": moved})
        if ok:
            return lr, trials
    return lrs[-1], trials


def print_summary(shapes: dict) -> None:
    """The closing table: per shape the check's LR, per variant ms/step, TFLOP/s, % of the dense GEMM,
    speedup over (a), the largest parameter difference and the update's difference from (a)'s."""
    print("\nwide step variants (ms/step | TFLOP/s nominal | % of dense fp32 GEMM | speedup vs a | max rel diff vs a | "
          "update vs a's (check)):")
    for k, s in shapes.items():
        print(f"  k={k}: check {CHECK_STEPS} steps at lr {s.check_lr:g}")
        for name, r in s.res["variants"].items():
            ok = "" if "check_ok" not in r else " ok" if r["check_ok"] else " NOT ok " + r.get("check_invalid", "")
            print(f"  k={k:<7d} {name:26s} {r['ms_per_step']:9.4f} | {r['tflops_nominal']:7.2f} | "
                  f"{100 * r.get('fraction_of_gemm4096', float('nan')):5.0f}% | "
                  f"{r.get('speedup_vs_a', float('nan')):6.2f}x | {r.get('max_param_rel_diff_vs_a', float('nan')):.1e} | "
                  f"{r.get('update_rel_diff_vs_a', float('nan')):.1e}{ok}")


def floor(payload: dict, n: int, d: int, k: int) -> dict:
    """max(GEMM FLOP / measured GEMM rate, bytes / measured copy bandwidth) for one step (B = n)."""
    gemm, bw, flop = payload.get("gemm4096_tflops"), payload.get("copy_gbps"), 4.0 * n * d * k
    w_bytes = 4 * d * k * 3  # W read (forward), read + written (update)
    act_bytes = 4 * n * k * 3  # H written, read by the fused elementwise pass, G written (then read by the GEMM)
    fl = {"w_and_activation_bytes": w_bytes + act_bytes}
    if gemm:
        fl["compute_ms"] = flop / (gemm * 1e12) * 1e3
    if bw:
        fl["memory_ms"] = (w_bytes + act_bytes) / (bw * 1e9) * 1e3
    if gemm and bw:
        fl["floor_ms"] = max(fl["compute_ms"], fl["memory_ms"])
        fl["floor_fraction_of_gemm4096"] = (flop / (fl["floor_ms"] / 1e3) / 1e12) / gemm
    return fl
