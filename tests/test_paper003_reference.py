"""Paper 003 against independent references and real data: PGD-l2 vs adversarial-robustness-toolbox's
PyTorch PGD (``clip_values=None``, unit-norm inputs) on the same nets, inputs and budget; the
digits smoke test (spec 003 §5.3 #9); MNIST files checked by checksum with a clear error."""

from __future__ import annotations

import math
import shutil

import pytest
import torch

from flows.experiments import lazy_train as lazy_exp
from storage import datasets
from tasks.attacks import pgd_l2, single_step_exact
from tasks.cells import lazy_train as lazy_cell
from tasks.nets import TwoLayer

DIGITS = {"data": "digits", "variant": "unit", "resample": "bilinear", "d": 64, "n_train": 0, "n_test": 0,
          "split_seed": 0, "m": 256, "dtype": "float64", "bias": "auto", "lr": 0.5, "batch_size": 64,
          "reduction": "mean", "max_steps": 20000}


@pytest.fixture(scope="module")
def digits_nets():
    cells = [dict(DIGITS, seed=s, C0=10.0) for s in (0, 1)]
    X, y, Xt, yt, _ = lazy_exp.load_data(cells[0])
    out = lazy_cell.run(cells, X, y, Xt, yt, torch.device("cpu"))
    net = TwoLayer(*(torch.stack([torch.from_numpy(r[k]) for r in out]) for k in ("W", "b", "v")))
    return out, net, Xt, yt


def test_T9_digits_smoke_lazy_sgd_accurate_and_flips_finite(digits_nets):
    out, net, Xt, yt = digits_nets
    assert len(yt) == 90 and all(r["exited"] == 1 for r in out)
    assert min(r["test_acc"] for r in out) >= 0.95
    r = single_step_exact(net, Xt.unsqueeze(0).expand(2, -1, -1).contiguous())
    delta = r.t_star * r.gnorm
    assert torch.isfinite(delta).all() and (delta < Xt.norm(dim=1)).all()


class _Logits(torch.nn.Module):
    """One stacked net as a 2-class classifier for ART: logits (-f/2, f/2)."""

    def __init__(self, net: TwoLayer):
        super().__init__()
        self.net = net

    def forward(self, x):
        f = self.net(x.double().unsqueeze(0))[0]
        return torch.stack([-f / 2, f / 2], 1)


@pytest.mark.parametrize("R", [0.1, 0.3], ids=["R0.1", "R0.3"])
def test_pgd_agrees_with_art_reference(digits_nets, R):
    pytest.importorskip("art")
    from art.attacks.evasion import ProjectedGradientDescentPyTorch
    from art.estimators.classification import PyTorchClassifier

    _, net, Xt, yt = digits_nets
    one = TwoLayer(net.W[:1], net.b[:1], net.v[:1])
    steps = 50
    ours = pgd_l2(one, Xt, yt, torch.tensor([R], dtype=torch.float64), steps=steps)
    clf = PyTorchClassifier(model=_Logits(one), loss=torch.nn.CrossEntropyLoss(), input_shape=(Xt.shape[1],),
                            nb_classes=2, clip_values=None, device_type="cpu")
    atk = ProjectedGradientDescentPyTorch(clf, norm=2, eps=R, eps_step=2.5 * R / steps, max_iter=steps,
                                          num_random_init=0, batch_size=128, verbose=False)
    labels = ((yt + 1) / 2).long().numpy()
    x_art = torch.from_numpy(atk.generate(Xt.float().numpy(), y=labels)).double()
    rob_art = (yt * one(x_art.unsqueeze(0))[0] > 0).double().mean()
    rob_ours = ours.robust.double().mean()
    assert 0.0 < float(rob_ours) < 1.0  # a budget where the comparison is not trivial
    assert abs(float(rob_art - rob_ours)) <= 1 / len(yt) + 1e-12  # within one test point
    assert ((x_art - Xt).norm(dim=1) <= R * (1 + 1e-4)).all()
    assert ((ours.x_adv[0] - Xt).norm(dim=1) <= R * (1 + 1e-9)).all()


def test_mnist01_counts_and_checksum():
    x, y, sha = datasets.mnist01("test")
    assert x.shape == (2115, 28, 28) and int((y == 1).sum()) == 1135 and len(sha) == 64
    assert math.isclose(float(x.max()), 1.0)


@pytest.mark.parametrize("damage", ["missing", "corrupt"])
def test_missing_or_corrupt_mnist_file_is_named(tmp_path, damage):
    src = datasets.shared_data_dir() / "mnist"
    dst = tmp_path / "mnist"
    shutil.copytree(src, dst)
    victim = dst / "t10k-labels-idx1-ubyte.gz"
    if damage == "missing":
        victim.unlink()
    else:
        data = bytearray(victim.read_bytes())
        data[100] ^= 0xFF
        victim.write_bytes(bytes(data))
    with pytest.raises(datasets.DataError, match=f"t10k-labels-idx1-ubyte.gz is {damage}|t10k-labels-idx1-ubyte.gz.*{damage}"):
        datasets.mnist("test", root=tmp_path)
