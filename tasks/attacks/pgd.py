"""PGD-l2 on stacked nets (paper 003 §5.2 / App. A; spec 003 §2.8): ascent on ``ℓ(y f(x'))``
with normalised l2 steps (Madry / torchattacks ``PGDL2`` convention), projection onto
``B_2(x, R)`` after every step, iterating on the running point (spec 003 §6 #14, #15).

The ascent direction is ``-y ∇_x f(x')`` exactly (``∇_x ℓ = ℓ'(yf) y ∇_x f`` with ``ℓ' < 0``), so a
saturated logistic loss never zeroes the step. ``step="raw"`` is Alg. 1 line 4 as printed (spec 003
§6 #15, X5): ``x' <- x' + α ∇_x ℓ(y f(x'))``, unnormalised, which stalls where the loss saturates.
No random start and no clamping to [0,1] unless asked (spec 003 §6 #20: unit-norm inputs are not images).
"""

from __future__ import annotations

import dataclasses

import torch

from tasks.nets.lazy import input_grad, logistic_dloss, project_rows
from tasks.nets.two_layer import TwoLayer


PGD_STEPS = ("normalised", "raw")


@dataclasses.dataclass
class PGDResult:
    """``x_adv`` (E,n,d) the final iterates; ``robust`` (E,n) ``y f(x_adv) > 0`` (the paper's RTA
    counts these); ``robust_strict`` (E,n) correct at x and at every iterate (spec 003 §2.10)."""

    x_adv: torch.Tensor
    robust: torch.Tensor
    robust_strict: torch.Tensor


def random_in_ball(shape: tuple[int, int, int], R: torch.Tensor, generators: list[torch.Generator],
                   dtype=torch.float64) -> torch.Tensor:
    """Points uniform in ``B_2(0, R[e])`` of R^d, (E,n,d), model e drawn from ``generators[e]`` on the CPU."""
    _, n, d = shape
    out = []
    for e, g in enumerate(generators):  # one draw per model's own stream (RNG only; the maths is stacked)
        z = torch.randn(n, d, generator=g, dtype=torch.float64)
        r = torch.rand(n, 1, generator=g, dtype=torch.float64) ** (1.0 / d)
        out.append(z / z.norm(dim=1, keepdim=True) * r * float(R[e]))
    return torch.stack(out).to(dtype)


def pgd_l2(net: TwoLayer, X: torch.Tensor, y: torch.Tensor, R: torch.Tensor, *, steps: int = 100,
           alpha: torch.Tensor | None = None, random_start: bool = False,
           generators: list[torch.Generator] | None = None, clip: tuple[float, float] | None = None,
           chunk: int = 4096, step: str = "normalised", progress=None) -> PGDResult:
    """PGD-l2 against E stacked nets. X (E,n,d) or (n,d) (shared), y (E,n) or (n,) in {-1,+1},
    R (E,) budgets (>= 0), ``alpha`` (E,) step lengths (default ``2.5 R/steps``, spec 003 §2.8);
    ``clip`` an optional box (e.g. (0,1)) applied after each projection. Chunked over examples
    (``chunk`` rows at a time) so the (E, chunk, m) pre-activation block bounds memory. ``step``:
    ``normalised`` (default, ``α v/||v||``) or ``raw`` (``α ∇_x ℓ``, spec 003 X5). ``progress``
    (optional): called as ``progress(done, of)`` before each step of each chunk and at a chunk's end
    (``of`` = steps × chunks; no device read)."""
    if step not in PGD_STEPS:
        raise ValueError(f"PGD step {step!r}: allowed {', '.join(PGD_STEPS)}")
    E = net.E
    if X.dim() == 2:
        X = X.unsqueeze(0).expand(E, -1, -1)
    if y.dim() == 1:
        y = y.unsqueeze(0).expand(E, -1)
    R = R.to(X.dtype).to(X.device)
    if bool((R < 0).any()):
        raise ValueError("PGD budget R must be >= 0")
    alpha = 2.5 * R / steps if alpha is None else alpha.to(X.dtype).to(X.device)
    outs, rob, strict = [], [], []
    if random_start:  # every start drawn before chunking: the chunk size never changes a net's stream
        if generators is None:
            raise ValueError("random_start needs one generator per model")
        starts = random_in_ball(tuple(X.shape), R, generators, X.dtype).to(X.device)
    n_chunks = -(-X.shape[1] // chunk)
    for lo in range(0, X.shape[1], chunk):
        x0, yc = X[:, lo:lo + chunk], y[:, lo:lo + chunk]
        xa = x0 + starts[:, lo:lo + chunk] if random_start else x0.clone()
        ok = yc * net(xa) > 0
        for s in range(steps):
            if progress is not None:
                progress(lo // chunk * steps + s, n_chunks * steps)
            f, g = input_grad(net, xa)
            ok &= yc * f > 0
            if step == "raw":  # ∇_x ℓ(y f) = ℓ'(y f) y ∇_x f
                xa = xa + alpha[:, None, None] * (logistic_dloss(yc * f) * yc).unsqueeze(-1) * g
            else:
                v = -yc.unsqueeze(-1) * g
                vn = v.norm(dim=-1, keepdim=True)
                xa = xa + alpha[:, None, None] * v / vn.clamp_min(torch.finfo(X.dtype).tiny)
            xa = project_rows(xa, x0, R)
            if clip is not None:
                xa = xa.clamp(*clip)
        if progress is not None:
            progress((lo // chunk + 1) * steps, n_chunks * steps)
        f = net(xa)
        r = yc * f > 0
        outs.append(xa)
        rob.append(r)
        strict.append(ok & r & (yc * net(x0) > 0))
    return PGDResult(torch.cat(outs, 1), torch.cat(rob, 1), torch.cat(strict, 1))
