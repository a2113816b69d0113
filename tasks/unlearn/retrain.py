"""Retraining on the retained set (spec 001 K3 third bullet, F001-5; Thm 2.2: retraining is
(ε_t, δ_t, 0)-successful): the reference an unlearning method wants to match. Trains from the
same init W0 with the same schedule on S∖S_f, one net per (net, forget set), batched."""

from __future__ import annotations

import torch

from tasks.train.fixed_output import train_fixed_output


def retrain(W, u, X, y, lam, forget: torch.Tensor, alphas: torch.Tensor, *, W0: torch.Tensor, lr: float,
            wd: float, epochs: int, loss: str = "logistic", valid: torch.Tensor | None = None, progress=None,
            device: torch.device | str | None = None, **kw) -> torch.Tensor:
    """kw: W0 (E,n,d) the trained nets' init, lr, wd, epochs, loss (the train stage's schedule),
    valid (E,m) real samples; ``progress`` the optional ``progress(done, of, loss)`` of
    ``train_fixed_output``; ``device``: where the retraining runs (None: W's; the result comes back
    to W's device). The result does not depend on α (repeated along A)."""
    E, L, m = forget.shape
    valid = torch.ones(E, m, dtype=torch.bool, device=forget.device) if valid is None else valid
    keep = (valid[:, None] & ~forget).reshape(E * L, m)
    dev = W.device if device is None else torch.device(device)
    rep = lambda t: t[:, None].expand(E, L, *t.shape[1:]).reshape(E * L, *t.shape[1:]).to(dev)  # noqa: E731
    run = train_fixed_output(rep(W0), None if u is None else rep(u), rep(X), rep(y), keep.to(dev), lr=lr, wd=wd,
                             epochs=epochs, loss=loss, progress=progress)
    out = run.W.to(W.device).reshape(E, L, 1, *W.shape[1:])
    return out.expand(E, L, alphas.shape[0], *W.shape[1:]).clone()
