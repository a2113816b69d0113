"""Symmetries of a forging problem's latent space (issue 41, "every mode"): signed permutations of the
standard Gaussian latents, which keep their law N(0, I). A problem declares the ones it expects
(``ForgingProblem.symmetries``); ``tasks/forging/estimators/modes.py`` keeps those that leave its
mismatch unchanged and fits the importance proposal to every image of the pilot's samples."""

from __future__ import annotations

import dataclasses

import torch

__all__ = ["LatentSymmetry", "flip", "swap"]


@dataclasses.dataclass(frozen=True)
class LatentSymmetry:
    """ξ ↦ (sign_j · ξ[perm_j])_j: a signed permutation of the latents, N(0, I)-preserving."""

    perm: tuple[int, ...]
    sign: tuple[float, ...]
    name: str = ""

    def __call__(self, xi: torch.Tensor) -> torch.Tensor:
        return xi[..., list(self.perm)] * torch.tensor(self.sign, dtype=xi.dtype)

    def then(self, other: "LatentSymmetry") -> "LatentSymmetry":
        """other ∘ self (apply self first)."""
        perm = tuple(self.perm[p] for p in other.perm)
        sign = tuple(s_o * self.sign[p] for s_o, p in zip(other.sign, other.perm))
        return LatentSymmetry(perm, sign, f"{self.name}·{other.name}")

    @property
    def key(self) -> tuple:
        return self.perm, self.sign


def flip(k: int, indices, name: str = "") -> LatentSymmetry:
    """Negate the latents ``indices`` of k."""
    idx = set(indices)
    return LatentSymmetry(tuple(range(k)), tuple(-1.0 if j in idx else 1.0 for j in range(k)),
                          name or f"flip{sorted(idx)}")


def swap(k: int, first: tuple[int, int], second: tuple[int, int], name: str = "") -> LatentSymmetry:
    """Exchange the latent ranges [a, b) and [c, d) (same length)."""
    (a, b), (c, d) = first, second
    if b - a != d - c:
        raise ValueError(f"swap needs ranges of one length, got {first} and {second}")
    perm = list(range(k))
    perm[a:b], perm[c:d] = list(range(c, d)), list(range(a, b))
    return LatentSymmetry(tuple(perm), (1.0,) * k, name or f"swap{first}{second}")
