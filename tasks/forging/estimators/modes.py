"""Every mode of a forging set (issue 41): symmetry images and a mode census for ``subset_importance``.

Why: the linear-regression forging set has two mirror-image caps (z and −z give the same gradient
direction up to sign). ``subset_importance`` at d = 10, p ≈ 1e-45 once fitted its proposal to pilot
samples from one cap only: −50 % with a stated SE of 0.34 % (z = −205), one mixture component, Pareto
k̂ −0.19 and ``reliable: True``. Importance weights cannot show a region the proposal never visits
(the defensive part reaches it with probability ~p), so two safeguards work on the pilot instead:

* **Symmetry images.** A :class:`LatentSymmetry` is a signed permutation of the Gaussian latents
  (it preserves their law N(0, I)). Candidates: the problem's declared ones
  (``ForgingProblem.symmetries``, e.g. the slab's mirror z ↦ −z with its label, a batch's swap of two
  replacement points) and the antipodal flip of each sphere block. A candidate is kept if it maps
  the pilot's samples to points with the same mismatch g and scale (up to rounding, on up to 64 of
  them: its images cost one evaluation each); the kept ones generate a group (up to 64 elements), and
  the proposal is fitted to the samples and all their images. The images only shape the proposal:
  the estimate stays the importance-weighted mean of fresh draws (unbiased whatever the proposal).
* **Mode census from dispersed starts.** Each of the ``n_repeats`` subset-simulation runs starts from
  its own draws of the nominal law over the whole domain and descends to the set on its own, so its
  final samples say which modes a start reaches. Modes: those samples (up to 64 a run, and their
  symmetry images) are cut into clusters no wider than 75° in any sphere block's direction (the
  k-means of the proposal fit; the whole latent vector's direction when there are no blocks), and
  clusters that single linkage joins (two points within ``LINK_DEG`` in every block) are one mode:
  two caps 90° or more apart stay two, a broad set sampled sparsely (d = 50) is not cut into
  hundreds of singleton "modes" (a census by linkage alone gave 200-390 at d = 50, p = 1e-10).
  The census is *inconclusive* when fewer than 3 runs reach the set, or when a mode was reached by
  one run only (a Good-Turing
  singleton: the chance that a further start finds a mode no run found is then of order 1/runs, so
  others may be missing). A census mode *lacks* in the proposal when, at the median of its samples,
  the fitted mixture's density is below the defensive part's (only the nominal law would ever draw
  there). Either makes ``subset_importance``'s result unreliable.
"""

from __future__ import annotations

import math

import torch

from tasks.forging.problems import ForgingProblem
from tasks.forging.symmetry import LatentSymmetry, flip

__all__ = ["verified_symmetries", "orbit", "with_images", "mode_census", "lacking_modes", "directions", "member_groups",
           "tight_kmeans", "LINK_DEG", "MAX_GROUP"]

LINK_DEG = 30.0  # samples closer than this (every block direction) are linked into one mode
MAX_GROUP = 64  # largest symmetry group enumerated (a batch of m points has m! orderings)
PROBE = 64  # samples on which a candidate symmetry is checked (one evaluation each)


def _candidates(problem: ForgingProblem) -> list[LatentSymmetry]:
    k = problem.latent_dim
    out = list(problem.symmetries)
    out += [flip(k, range(a, b), f"antipodal[{a}:{b}]") for a, b in problem.sphere_blocks]
    seen, unique = set(), []
    for s in out:
        if s.key not in seen and s.key != (tuple(range(k)), (1.0,) * k):
            seen.add(s.key)
            unique.append(s)
    return unique


def verified_symmetries(problem: ForgingProblem, X: torch.Tensor, rtol: float = 1e-6
                        ) -> tuple[list[LatentSymmetry], list[str], int]:
    """The candidates (module docstring) under which g and scale of up to ``PROBE`` samples of X are
    unchanged within ``rtol``; returns (kept, names of the rejected ones, gradient evaluations spent)."""
    P = X[:PROBE]
    g0, s0 = problem.evaluate(P)
    kept, rejected, evals = [], [], P.shape[0]
    for sym in _candidates(problem):
        g1, s1 = problem.evaluate(sym(P))
        evals += P.shape[0]
        same_g = (g1 - g0).abs() <= rtol * g0.abs() + 1e-300
        same_s = ((s1 - s0).abs() <= rtol * s0.abs()) | (s1 == s0)
        (kept if bool((same_g & same_s).all()) else rejected).append(sym)
    return kept, [s.name for s in rejected], evals * problem.evals_per_point


def orbit(generators: list[LatentSymmetry], k: int, max_size: int = MAX_GROUP) -> list[LatentSymmetry]:
    """Elements of the group the generators generate (the identity first), breadth first, at most max_size."""
    ident = LatentSymmetry(tuple(range(k)), (1.0,) * k, "identity")
    group, seen, frontier = [ident], {ident.key}, [ident]
    while frontier and len(group) < max_size:
        nxt = []
        for el in frontier:
            for gen in generators:
                new = el.then(gen)
                if new.key not in seen and len(group) < max_size:
                    seen.add(new.key)
                    group.append(new)
                    nxt.append(new)
        frontier = nxt
    return group


def with_images(X: torch.Tensor, group: list[LatentSymmetry], generator: torch.Generator,
                weights: torch.Tensor | None = None,
                max_rows: int = 200_000) -> tuple[torch.Tensor, torch.Tensor | None]:
    """X (and its weights) with the images of X under every group element: at most ``max_rows`` rows, an
    equal random share of the rows for each element, so each image mode keeps its weight."""
    if len(group) <= 1:
        return X, weights
    idx = torch.randperm(X.shape[0], generator=generator)[:max(2, min(X.shape[0], max_rows // len(group)))]
    out = torch.cat([sym(X[idx]) for sym in group])
    return out, None if weights is None else weights[idx].repeat(len(group))


def directions(X: torch.Tensor, blocks) -> list[torch.Tensor]:
    """Unit direction of each sphere block of the latents X (N, k)."""
    return [X[:, a:b] / X[:, a:b].norm(dim=1, keepdim=True) for a, b in blocks]


def member_groups(labels: torch.Tensor) -> list[torch.Tensor]:
    """Member masks of the components with at least 2 samples."""
    return [labels == j for j in range(int(labels.max()) + 1) if int((labels == j).sum()) >= 2]


def _kmeans(F: torch.Tensor, K: int, generator: torch.Generator, iters: int = 50) -> torch.Tensor:
    """k-means++ start and Lloyd iterations; returns labels."""
    n = F.shape[0]
    centres = [F[int(torch.randint(n, (1,), generator=generator))]]
    for _ in range(1, K):
        d2 = torch.cdist(F, torch.stack(centres)).min(1).values ** 2
        if float(d2.sum()) <= 0:
            break
        centres.append(F[int(torch.multinomial(d2, 1, generator=generator))])
    C = torch.stack(centres)
    for _ in range(iters):
        lab = torch.cdist(F, C).argmin(1)
        new = torch.stack([F[lab == j].mean(0) if (lab == j).any() else C[j] for j in range(len(C))])
        if torch.allclose(new, C):
            break
        C = new
    return torch.cdist(F, C).argmin(1)


def tight_kmeans(F: torch.Tensor, U: list[torch.Tensor], generator: torch.Generator, min_cos: float,
                 max_components: int) -> torch.Tensor:
    """Labels of k-means on features F (k-means++ start), K doubled from 1 until every sample's direction
    U (per block) is within arccos(min_cos) of its component's mean direction (K <= max_components, n/4)."""
    n, K = F.shape[0], 1
    while True:
        labels = _kmeans(F, K, generator) if K > 1 else torch.zeros(n, dtype=torch.long)
        tight = all(bool(((Ub[g].mean(0) / Ub[g].mean(0).norm()) @ Ub[g].T > min_cos).all())
                    for g in member_groups(labels) for Ub in U)
        if tight or K >= max_components or K >= n // 4:
            return labels
        K *= 2


def _features(X: torch.Tensor, blocks) -> list[torch.Tensor]:
    """Unit direction per sphere block; the whole latent vector's direction when there are none."""
    if not blocks:
        return [X / X.norm(dim=1, keepdim=True).clamp_min(1e-300)]
    return [X[:, a:b] / X[:, a:b].norm(dim=1, keepdim=True).clamp_min(1e-300) for a, b in blocks]


def _components(F: list[torch.Tensor], clusters: torch.Tensor, link_deg: float) -> torch.Tensor:
    """Modes: the clusters, merged where a point of one lies within link_deg of a point of the other in
    every block (single linkage between clusters); returns each point's mode label 0..M-1."""
    c = math.cos(math.radians(link_deg))
    near = torch.ones(F[0].shape[0], F[0].shape[0], dtype=torch.bool)
    for U in F:
        near &= (U @ U.T) >= c
    onehot = torch.nn.functional.one_hot(clusters).to(torch.float64)  # (n, C)
    linked = (onehot.T @ near.to(torch.float64) @ onehot) > 0  # (C, C), the diagonal included
    label = torch.arange(linked.shape[0])
    while True:  # label propagation: each cluster takes the smallest label among those linked to it
        new = torch.where(linked, label[None, :], linked.shape[0]).min(1).values
        if torch.equal(new, label):
            break
        label = new
    return torch.unique(label, return_inverse=True)[1][clusters]


def mode_census(X: torch.Tensor, run: torch.Tensor, blocks, group: list[LatentSymmetry], per_run: int = 64,
                link_deg: float = LINK_DEG) -> dict:
    """The census of the module docstring from samples X (M, k) of runs ``run`` (M,) (and their images
    under ``group``): mode labels of the points used, which runs reached each mode, singletons.
    Returns a dict with ``points`` (the latents the census used), ``labels``, ``n_modes``,
    ``runs_per_mode``, ``n_runs``, ``singletons``, ``conclusive``."""
    keep = []
    runs = torch.unique(run)
    for r in runs:
        idx = (run == r).nonzero().squeeze(1)  # evenly strided: no draw from the estimator's stream
        keep.append(idx[::max(1, -(-idx.numel() // per_run))])
    idx = torch.cat(keep) if keep else torch.zeros(0, dtype=torch.long)
    P = torch.cat([sym(X[idx]) for sym in group]) if group else X[idx]
    R_of = run[idx].repeat(max(len(group), 1))
    if P.shape[0] == 0:
        return {"points": P, "labels": torch.zeros(0, dtype=torch.long), "n_modes": 0, "runs_per_mode": [],
                "n_runs": 0, "singletons": 0, "conclusive": False}
    F = _features(P, blocks)
    # clusters no wider than 75° (tight_kmeans, a fixed stream: the census draws nothing from the estimator's),
    # then merged where single linkage joins them: a broad set sampled sparsely (d = 50: nearest neighbours
    # 40°+ apart) is not cut into hundreds of singleton "modes", and two caps 90°+ apart stay two
    clusters = tight_kmeans(torch.cat(F, 1), F, torch.Generator().manual_seed(0), math.cos(math.radians(75)), 64)
    labels = _components(F, clusters, link_deg)
    n_modes = int(labels.max()) + 1
    runs_per_mode = [int(torch.unique(R_of[labels == m]).numel()) for m in range(n_modes)]
    singletons = sum(n == 1 for n in runs_per_mode)
    n_runs = int(runs.numel())
    return {"points": P, "labels": labels, "n_modes": n_modes, "runs_per_mode": runs_per_mode, "n_runs": n_runs,
            "singletons": singletons, "conclusive": n_runs >= 3 and singletons == 0}


def lacking_modes(census: dict, log_fitted_over_defensive) -> list[int]:
    """Census modes where the median of log(fitted mixture density / defensive density) over the mode's
    points is below 0: only the nominal part of the proposal covers them."""
    if census["n_modes"] == 0:
        return []
    ratio = log_fitted_over_defensive(census["points"])
    return [m for m in range(census["n_modes"]) if float(ratio[census["labels"] == m].median()) < 0]
