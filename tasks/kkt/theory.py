"""Theorem checks at a trained net (paper 002 Thm 4.1, App. C; spec 002 §2.3, §3)."""

from __future__ import annotations

import dataclasses
import math

import torch

from tasks.kkt.margins import margins
from tasks.nets import TwoLayer


def balance_error(net: TwoLayer) -> torch.Tensor:
    """Σ_j |v_j² - ||w_j||² - b_j²| / ||θ||², (E,): 0 at a KKT point (spec §2.3; gradient flow
    conserves each neuron's v_j² - ||w_j||² - b_j², §2.4)."""
    return (net.v.pow(2) - net.W.pow(2).sum(-1) - net.b.pow(2)).abs().sum(1) / net.sq_norm()


@dataclasses.dataclass
class TheoryCheck:
    """Theorem 4.1 / Appendix C constants and the two flip inequalities (spec §3)."""

    p: torch.Tensor
    c_bal: torch.Tensor
    c_prime: torch.Tensor
    eta1: torch.Tensor
    eta2: torch.Tensor
    z_norm: torch.Tensor
    max_pos: torch.Tensor  # max_{i∈I+} N̂(x_i - z), Theorem 4.1 says <= -1
    min_neg: torch.Tensor  # min_{i∈I-} N̂(x_i + z), Theorem 4.1 says >= 1


def theory_check(net: TwoLayer, X, y, I: torch.Tensor, d: torch.Tensor | None = None) -> TheoryCheck:
    """Evaluate Thm 4.1's explicit z = (η1+η2) Σ_{l∈I} y_l x_l on the normalised net θ̂.

    p = max_{i≠j∈I} |<x_i,x_j>|, c = min(|I+|,|I-|)/|I|, c' = |I|(p+1)/(d+1),
    η1 = (p+1)/(d-mp), η2 = 2(cc'+1)(d+1)/(mc(d-mp))   (App. C, Lemmas C.6-C.8, Cor 4.1 on I).

    ``d`` (E,) is each net's true input dimension; a zero-padded bundle must pass it (the padded
    width X.shape[2] would change c', η1, η2 and z). Defaults to X.shape[2] for unpadded stacks.
    """
    E, m, d_pad = X.shape
    d = torch.full((E,), float(d_pad), dtype=X.dtype, device=X.device) if d is None else d.to(X.device, X.dtype)
    Idt = I.to(X.dtype)
    G = torch.bmm(X, X.transpose(1, 2)).abs() * Idt.unsqueeze(1) * Idt.unsqueeze(2)
    G = G - torch.diag_embed(torch.diagonal(G, dim1=1, dim2=2))
    p = G.amax((1, 2))
    n = Idt.sum(1)
    c_bal = torch.minimum(((y > 0) & I).sum(1), ((y < 0) & I).sum(1)).to(X.dtype) / n
    c_prime = n * (p + 1) / (d + 1)
    gap = d - n * p
    eta1 = (p + 1) / gap
    eta2 = 2 * (c_bal * c_prime + 1) * (d + 1) / (n * c_bal * gap)
    s = torch.einsum("en,end->ed", y * Idt, X)
    used = (X != 0).any(1)  # zero-padded features: z is 0 there even when η is not finite (0·inf)
    z = torch.where(used, (eta1 + eta2).unsqueeze(-1) * s, torch.zeros_like(s))
    q = margins(net, X, y)
    q_min = q.masked_fill(~I, math.inf).min(1).values
    hat = net.scaled(1 / torch.sqrt(q_min))
    out_minus = hat(X - z.unsqueeze(1))
    out_plus = hat(X + z.unsqueeze(1))
    max_pos = out_minus.masked_fill(~(I & (y > 0)), -math.inf).amax(1)
    min_neg = out_plus.masked_fill(~(I & (y < 0)), math.inf).amin(1)
    return TheoryCheck(p, c_bal, c_prime, eta1, eta2, z.norm(dim=1), max_pos, min_neg)
