"""Batched paper-003 attacks (spec 003 §7 "Attacks"): PGD-l2 and the exact single step over K
stacked nets x B inputs, against a per-net Python loop of the same kernels and against ART's
PyTorch PGD on one net at a time (the reference library a user would reach for). One run, the
same work on every side; each side timed ``--reps`` times and the fastest kept (the shared CPU
is noisy); ratios printed, JSON written, peak memory reported.

    python benchmarks/attack_batched.py [--K 8 --B 256 --d 784 --m 1000 --steps 20 --R 0.02] [--device cpu]
    python benchmarks/attack_batched.py --K 64 --d 49 --m 100 --tag _small   # many small nets
"""

from __future__ import annotations

import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks.common import peak_rss_mb, timed, write  # noqa: E402
from tasks.attacks import pgd_l2, single_step_exact  # noqa: E402
from tasks.nets import TwoLayer  # noqa: E402
from tasks.nets.lazy import init_lazy  # noqa: E402


def stack(K: int, d: int, m: int, dtype, device) -> TwoLayer:
    parts = [init_lazy(d, m, torch.Generator().manual_seed(k), bias=False, dtype=dtype, device=device) for k in range(K)]
    W0, v, b = (torch.stack(t) for t in zip(*parts))
    return TwoLayer(W0, b, v)


def art_pgd(net: TwoLayer, X: torch.Tensor, y: torch.Tensor, R: float, steps: int) -> torch.Tensor:
    from art.attacks.evasion import ProjectedGradientDescentPyTorch
    from art.estimators.classification import PyTorchClassifier

    class Logits(torch.nn.Module):
        def forward(self, x):
            f = net(x.to(net.W.dtype).unsqueeze(0))[0]
            return torch.stack([-f / 2, f / 2], 1)

    clf = PyTorchClassifier(model=Logits(), loss=torch.nn.CrossEntropyLoss(), input_shape=(X.shape[1],), nb_classes=2,
                            clip_values=None, device_type="gpu" if X.is_cuda else "cpu")
    atk = ProjectedGradientDescentPyTorch(clf, norm=2, eps=R, eps_step=2.5 * R / steps, max_iter=steps,
                                          num_random_init=0, batch_size=len(X), verbose=False)
    return torch.from_numpy(atk.generate(X.cpu().float().numpy(), y=((y + 1) / 2).long().cpu().numpy()))


def best(fn, device: str, reps: int):
    """(fastest time over ``reps`` runs, last output)."""
    times, out = [], None
    for _ in range(reps):
        t, out = timed(fn, device)
        times.append(t)
    return min(times), out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--K", type=int, default=8)
    ap.add_argument("--B", type=int, default=256)
    ap.add_argument("--d", type=int, default=784)
    ap.add_argument("--m", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--R", type=float, default=0.02)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tag", default="", help="suffix of the JSON name")
    ap.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--no-art", action="store_true")
    a = ap.parse_args()
    dtype = getattr(torch, a.dtype)
    net = stack(a.K, a.d, a.m, dtype, a.device)
    g = torch.Generator().manual_seed(0)
    X = torch.randn(a.B, a.d, generator=g, dtype=torch.float64)
    X = (X / X.norm(dim=1, keepdim=True)).to(a.device, dtype)
    y = torch.sign(net.select([0])(X.unsqueeze(0))[0])  # net 0's own labels: its clean accuracy is 1
    R = torch.full((a.K,), a.R, dtype=dtype, device=a.device)
    Xs = X.unsqueeze(0).expand(a.K, -1, -1).contiguous()
    res = {}
    t_pgd, out = best(lambda: pgd_l2(net, X, y, R, steps=a.steps), a.device, a.reps)
    t_pgd_loop, loop = best(lambda: [pgd_l2(net.select([k]), X, y, R[k:k + 1], steps=a.steps)
                                      for k in range(a.K)], a.device, a.reps)
    same = all(torch.equal(out.robust[k], loop[k].robust[0]) for k in range(a.K))
    single_step_exact(net.select([0]), Xs[:1, :8], chunk=64)  # warm-up (first sort / allocator)
    t_ss, _ = best(lambda: single_step_exact(net, Xs, chunk=64), a.device, a.reps)
    t_ss_loop, _ = best(lambda: [single_step_exact(net.select([k]), Xs[k:k + 1], chunk=64) for k in range(a.K)],
                         a.device, a.reps)
    res.update(pgd_stacked_s=t_pgd, pgd_loop_s=t_pgd_loop, pgd_loop_over_stacked=t_pgd_loop / t_pgd,
               pgd_same_robust_flags=same, single_step_stacked_s=t_ss, single_step_loop_s=t_ss_loop,
               single_step_loop_over_stacked=t_ss_loop / t_ss, rta_stacked=out.robust.double().mean(1).tolist())
    if not a.no_art:
        t_art, xs = best(lambda: [art_pgd(net.select([k]), X, y, a.R, a.steps) for k in range(a.K)], a.device, a.reps)
        rta_art = [float((y.cpu().double() * net.select([k])(xs[k].to(a.device, dtype).unsqueeze(0))[0].cpu().double()
                          > 0).double().mean()) for k in range(a.K)]
        res.update(art_loop_s=t_art, art_over_stacked=t_art / t_pgd, rta_art=rta_art)
    res["peak_rss_mb"] = peak_rss_mb()
    if a.device.startswith("cuda"):
        res["peak_cuda_mb"] = torch.cuda.max_memory_allocated() / 2**20
    for k, v in res.items():
        print(f"{k:32s} {v}")
    path = write("attack_batched" + a.tag, {"params": vars(a), "results": res}, a.device)
    print("wrote", path)


if __name__ == "__main__":
    main()
