"""The same kernels on CUDA (skipped with a reason when no GPU is visible)."""

import pytest
import torch

from flows import experiments
from tasks import attacks, data, kkt, nets, train

pytestmark = pytest.mark.requires_gpu


def stack(E=8, d=16, m=20, k=32, device="cpu"):
    return data.synthetic_stack(range(E), d, m, k, device=device)


def test_cuda_training_float64_matches_cpu():
    sched = train.Schedule(lr0=1e-2, period=10, target_loss=1e-8, max_iters=3000)
    cpu = train.train(*stack(), sched)
    gpu = train.train(*stack(device="cuda"), sched)
    assert torch.equal(cpu.iters, gpu.iters.cpu())
    torch.testing.assert_close(gpu.net.W.cpu(), cpu.net.W, rtol=0, atol=1e-10)


def test_cuda_c_star_and_kkt_match_cpu():
    sched = train.Schedule(lr0=1e-2, period=10, target_loss=1e-8, max_iters=3000)
    net, X, y = stack()
    st = train.train(net, X, y, sched)
    valid = torch.ones_like(y, dtype=torch.bool)
    out = {}
    for dev in ("cpu", "cuda"):
        n = nets.TwoLayer(st.net.W.to(dev), st.net.b.to(dev), st.net.v.to(dev))
        Xd, yd, vd = X.to(dev), y.to(dev), valid.to(dev)
        I = kkt.margin_set(yd * n(Xd), vd)
        z = attacks.margin_direction(n, Xd, yd, I)
        out[dev] = (attacks.c_star_exact(n, Xd, yd, I, z).c_star.cpu(), kkt.kkt_fit(n, Xd, yd, vd).eps.cpu())
    torch.testing.assert_close(out["cuda"][0], out["cpu"][0], rtol=0, atol=1e-8)
    torch.testing.assert_close(out["cuda"][1], out["cpu"][1], rtol=0, atol=1e-6)


def test_run_bundle_on_cuda_float32_agrees_with_cpu_float64():
    exp = experiments.get("nonrobust")
    base = {n: p.default for n, p in exp.params.items()}
    cells = [dict(base, d=32, alpha=1.0, width=64, seed=s, lr_period_fast=10) for s in range(4)]
    ref = exp.run_bundle([dict(c, dtype="float64") for c in cells], "cpu")
    got = exp.run_bundle([dict(c, dtype="float32") for c in cells], "cuda")
    for a, b in zip(ref, got):
        assert b["status"] == 1 and abs(a["c_star"] - b["c_star"]) / a["c_star"] < 0.02
