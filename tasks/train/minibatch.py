"""The minibatch set-up that lazy SGD (``lazy_sgd``) and projected adversarial training
(``projected_adv``) of paper 003 share (spec 003 §2.6, §2.9, §6 #1/#2/#19/#24): the loss reduction,
the batch size against the n training points, and one fresh permutation per model and epoch drawn
from that model's own ``torch.Generator`` (so stacked models differ in their minibatch order)."""

from __future__ import annotations

import torch

REDUCTIONS = ("mean", "sum")


def batch_plan(n: int, batch_size: int, reduction: str) -> tuple[int, float]:
    """(minibatches per epoch floor(n/B), the gradient's scale: 1/B for ``mean``, 1 for ``sum``);
    ValueError naming the field for an unknown reduction or a batch larger than n."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction {reduction!r}: allowed {', '.join(REDUCTIONS)}")
    if batch_size > n:
        raise ValueError(f"batch_size {batch_size} is larger than the {n} training points")
    return n // batch_size, (1.0 / batch_size if reduction == "mean" else 1.0)


def epoch_order(generators: list[torch.Generator], n: int, device) -> torch.Tensor:
    """(E,n): a fresh permutation of the n samples per model, from its own generator (on the CPU)."""
    return torch.stack([torch.randperm(n, generator=g) for g in generators]).to(device)
