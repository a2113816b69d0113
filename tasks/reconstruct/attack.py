"""The KKT reconstruction attack (Haim et al. 2022 as practised; paper 004 Sec 4, spec §2.4) as ONE
stacked problem: B = nets × hyper-parameter settings × restarts, each row its own net, candidates
x' (B,l,d) and multipliers λ (B,l), optimised together by SGD with momentum (PyTorch's rule:
buf ← μ buf + g, p ← p − lr buf) with per-row learning rates. Rows never mix: the objective is
a sum of per-row terms and every kernel is batched over B, so a row's trajectory is the same
whether it runs alone or stacked (tests/test_reconstruct_attack.py).

Inits (spec §2.4, X004-4): ``sphere`` x'_i = r g_i/‖g_i‖ (paper 004's "no prior" attacker: uniform
on the sphere of radius r), ``gauss`` x'_i = (r/√d) N(0, I) (Haim's s = r/√d). λ_i ~ U[0, 1].
Both are drawn per row from its own generator at the row's true d (padding never changes a draw).
"""

from __future__ import annotations

import dataclasses
import math

import torch

from tasks.reconstruct.objective import objective

RUNNING, DONE, DIVERGED = 0, 1, 2
# The divergence rule: a row is DIVERGED, and frozen at the first step where it is, when its objective
# or a gradient is non-finite, or its objective exceeds BLOWUP² times its value at the init, or (the
# cell gives a scale: max(init radius, largest training-point norm)) a candidate's norm exceeds BLOWUP
# times that scale. Converging runs lower the objective and leave candidates at a few times the data
# norm (frozen-output nets: 3.6-6.7 at ‖x_i‖ = 1, issue 39); diverged ones reached 1e62-1e102.
BLOWUP = 1e3


def sphere(l: int, d: int, r: float, g: torch.Generator) -> torch.Tensor:
    """l points uniform on the sphere of radius r in R^d (paper 004 Sec 4), float64 CPU."""
    z = torch.randn(l, d, generator=g, dtype=torch.float64)
    return r * z / z.norm(dim=1, keepdim=True)


def gauss(l: int, d: int, r: float, g: torch.Generator) -> torch.Tensor:
    """Haim et al.'s x' = s N(0, I) with s = r/√d (radius ≈ r), float64 CPU (spec X004-4)."""
    return torch.randn(l, d, generator=g, dtype=torch.float64) * (r / math.sqrt(d))


INITS = {"sphere": sphere, "gauss": gauss}


def candidate_labels(l: int) -> torch.Tensor:
    """Fixed candidate labels y' (spec §2.4, Haim): first half −1, second half +1, (l,)."""
    y = torch.ones(l, dtype=torch.float64)
    y[: l // 2] = -1
    return y


def init_candidates(kind: str, l: int, d_true: list[int], d_pad: int, radius: list[float],
                    gens: list[torch.Generator]) -> tuple[torch.Tensor, torch.Tensor]:
    """x' (B,l,d_pad) zero past each row's d, λ (B,l) ~ U[0,1]; one generator per row."""
    if kind not in INITS:
        raise ValueError(f"unknown init {kind!r}; allowed: {sorted(INITS)}")
    B = len(gens)
    X = torch.zeros(B, l, d_pad, dtype=torch.float64)
    lam = torch.zeros(B, l, dtype=torch.float64)
    for e in range(B):  # the draws only: the optimisation below is one stacked problem
        X[e, :, : d_true[e]] = INITS[kind](l, d_true[e], radius[e], gens[e])
        lam[e] = torch.rand(l, generator=gens[e], dtype=torch.float64)
    return X, lam


@dataclasses.dataclass
class AttackResult:
    x: torch.Tensor  # (B,l,d) final candidates
    lam: torch.Tensor  # (B,l) final multipliers
    objective: torch.Tensor  # (B,) objective at the final candidates
    trace: torch.Tensor  # (B,T) objective at T evenly spaced steps (first: the init)
    status: torch.Tensor  # (B,) int8: DONE, DIVERGED (the rule of BLOWUP above; frozen there)


def optimise(W, b, v, x0, lam0, yc, *, lr_x, lr_lam, alpha, lam_min, steps: int, objective_name: str = "haim",
           box: bool = False, momentum: float = 0.9, feature_mask=None, n_trace: int = 11, blocks=None,
           x_scale=None, norm_prior=None, progress=None) -> AttackResult:
    """Run ``steps`` SGD-momentum steps on every row. W (B,k,d), b, v (B,k) the attacked nets (float64),
    x0 (B,l,d), lam0 (B,l) the inits, yc (B,l) the fixed labels; lr_x, lr_lam, lam_min (B,) tensors;
    alpha (B,) the surrogate slope (None: exact step derivative, X004-2); feature_mask (B,d) zero past
    a row's true d (the gradient there is masked so padding stays zero); blocks (B,3) bool the trained
    blocks W, b, v of each row's net (None: all); x_scale (B,) each row's data scale for the divergence
    rule (:data:`BLOWUP`; None: candidate norms unbounded, a non-finite or exploding objective still
    counts); norm_prior (B,) the attacker's prior on the data's norm: each candidate of a row with
    norm_prior > 0 is projected onto the sphere of that radius after every step (None or 0: free).
    ``progress`` (optional): called as ``progress(steps done, steps, loss)`` at every step (no
    device read); ``loss()`` gives the log of the worst finite row's objective (a device read: the
    caller calls it only when it wants it)."""
    x, lam = x0.clone(), lam0.clone()
    bx, bl = torch.zeros_like(x), torch.zeros_like(lam)
    fm = torch.ones(x.shape[0], x.shape[2], dtype=x.dtype, device=x.device) if feature_mask is None else feature_mask
    live = torch.ones(x.shape[0], dtype=torch.bool, device=x.device)
    T = max(2, n_trace)
    at = {round(t * steps / (T - 1)): t for t in range(T)}
    trace = torch.full((x.shape[0], T), math.nan, dtype=x.dtype, device=x.device)
    lr_x3, lr_l2 = lr_x.view(-1, 1, 1), lr_lam.view(-1, 1)
    x_max = None if x_scale is None else BLOWUP * x_scale.to(x.dtype)
    obj0 = None
    for step in range(steps + 1):
        x.requires_grad_(True)
        lam.requires_grad_(True)
        obj = objective(objective_name, W, b, v, x, yc, lam, alpha=alpha, lam_min=lam_min, box=box,
                        feature_mask=fm, blocks=blocks)
        with torch.no_grad():
            obj0 = obj.detach().abs().clamp_min(1e-300) if obj0 is None else obj0
            live = live & sane(obj.detach(), x.detach(), obj0, x_max)
        if step in at:
            trace[:, at[step]] = obj.detach()
        if progress is not None:
            progress(step, steps, lambda o=obj.detach(): _log_worst(o))
        if step == steps:
            break
        gx, gl = torch.autograd.grad(obj.sum(), (x, lam))
        with torch.no_grad():
            live = live & torch.isfinite(obj) & torch.isfinite(gx).flatten(1).all(1) & torch.isfinite(gl).all(1)
            keep = live.to(x.dtype)
            gx = torch.nan_to_num(gx) * fm.unsqueeze(1)
            gl = torch.nan_to_num(gl)
            bx = momentum * bx + gx
            bl = momentum * bl + gl
            x = x.detach() - keep.view(-1, 1, 1) * lr_x3 * bx
            lam = lam.detach() - keep.view(-1, 1) * lr_l2 * bl
            if norm_prior is not None:
                x = on_sphere(x, norm_prior)
    obj = obj.detach()
    status = torch.where(live, DONE, DIVERGED).to(torch.int8)
    return AttackResult(x.detach(), lam.detach(), obj, trace, status)


def on_sphere(x: torch.Tensor, radius: torch.Tensor) -> torch.Tensor:
    """x (B,l,d) with each candidate of a row whose ``radius`` (B,) is > 0 scaled to that norm (a zero
    candidate stays zero); the other rows unchanged."""
    r = radius.to(x.dtype).view(-1, 1, 1)
    norm = x.norm(dim=-1, keepdim=True)
    return torch.where(r > 0, x * (r / norm.clamp_min(1e-300)), x)


def sane(obj: torch.Tensor, x: torch.Tensor, obj0: torch.Tensor, x_max: torch.Tensor | None) -> torch.Tensor:
    """(B,) bool: the rows :data:`BLOWUP`'s rule leaves live: a finite objective at most BLOWUP² times
    its init value ``obj0``, and (``x_max`` (B,) given) finite candidates of norm at most ``x_max``."""
    ok = torch.isfinite(obj) & (obj <= BLOWUP**2 * obj0)
    if x_max is not None:
        ok = ok & torch.isfinite(x).flatten(1).all(1) & (x.norm(dim=-1).amax(-1) <= x_max)
    return ok


def _log_worst(obj: torch.Tensor) -> float:
    """log of the largest finite objective of the stack (NaN if none)."""
    fin = obj[torch.isfinite(obj)]
    top = float(fin.max()) if fin.numel() else 0.0
    return math.log(top) if top > 0 else math.nan
