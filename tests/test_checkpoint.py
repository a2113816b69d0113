"""A bundle killed mid-training resumes from its checkpoint and ends exactly where an
uninterrupted run ends (full batch and minibatch SGD)."""

import os

import numpy as np
import pytest
import torch

from flows import experiments
from flows.experiments import nonrobust

EXP = experiments.get("nonrobust")
BASE = {name: p.default for name, p in EXP.params.items()}


@pytest.mark.parametrize("batch_size", [5000, 16])
def test_resume_from_checkpoint_equals_uninterrupted(tmp_path, batch_size):
    cells = [dict(BASE, d=20, m=30, width=24, seed=s, lr0=0.01, lr_period=10, target_loss=1e-12,
                  batch_size=batch_size, dtype="float64") for s in (0, 1)]
    ref = EXP.run_bundle(cells, "cpu")
    path = str(tmp_path / "ck" / "bundle.pt")
    partial, _ = nonrobust.train_bundle(cells, "cpu", checkpoint=path, max_chunks=1)
    assert os.path.exists(path) and bool(partial.running.any())  # stopped midway, state on disk
    saved = torch.load(path, weights_only=True)
    assert int(saved["iters"].max()) == int(partial.iters.max()) > 0
    got = EXP.run_bundle(cells, "cpu", checkpoint=path)
    assert [(a["iters"], a["status"]) for a in ref] == [(b["iters"], b["status"]) for b in got]
    assert all(b["status"] == 1 for b in got)
    names = ("c_star", "gamma", "kkt_eps", "q_min")
    np.testing.assert_allclose([[b[n] for n in names] for b in got], [[a[n] for n in names] for a in ref], rtol=1e-9)


CELLS = [dict(BASE, d=20, m=30, width=24, seed=s, lr0=0.01, lr_period=10, target_loss=1e-12, dtype="float64")
         for s in (0, 1)]


class Plant:
    """A pickle payload that would create a file if it were ever unpickled."""

    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return (open, (self.target, "w"))


def _garbage(path, tmp_path):
    with open(path, "wb") as f:
        f.write(os.urandom(300))


def _pickled(path, tmp_path):
    torch.save({"W": Plant(str(tmp_path / "PWNED"))}, path)


def _false_converged(path, tmp_path):
    """A real mid-training state of this bundle whose first net says 'converged' at a loss above the target."""
    st, _ = nonrobust.train_bundle(CELLS, "cpu", checkpoint=path, max_chunks=1)
    payload = torch.load(path, weights_only=True)
    payload["status"][0] = 1
    torch.save(payload, path)


def _forged_converged(path, tmp_path):
    """Issue 29 item 6: a state that loads with weights_only and claims its first net converged at a
    loss far below the target, although its weights are mid-training ones."""
    st, _ = nonrobust.train_bundle(CELLS, "cpu", checkpoint=path, max_chunks=1)
    payload = torch.load(path, weights_only=True)
    payload["status"][0], payload["log_loss"][0] = 1, -100.0
    torch.save(payload, path)


def _other_shapes(path, tmp_path):
    """A valid checkpoint of another bundle (other width)."""
    nonrobust.train_bundle([dict(c, width=8) for c in CELLS], "cpu", checkpoint=path, max_chunks=1)


@pytest.fixture(scope="module")
def uninterrupted():
    """The bundle of CELLS trained from scratch without a checkpoint (what each recomputation must equal)."""
    return EXP.run_bundle(CELLS, "cpu")


@pytest.mark.parametrize("damage", [_garbage, _pickled, _false_converged, _forged_converged, _other_shapes])
def test_unusable_checkpoint_is_quarantined_and_the_bundle_recomputed(tmp_path, capfd, damage, uninterrupted):
    """Issue 12 item 7: garbage, a pickle with code, a 'converged' net above its target loss, a state
    of other shapes: never retried, never executed; the file is named in one warning and moved aside
    (``.bad-*``), and the bundle trains from scratch to exactly the uninterrupted result."""
    path = str(tmp_path / "ck" / "bundle.pt")
    os.makedirs(os.path.dirname(path))
    damage(path, tmp_path)
    got = EXP.run_bundle(CELLS, "cpu", checkpoint=path)
    warning = capfd.readouterr().out
    assert f"checkpoint {path} is unusable" in warning and "Traceback" not in warning
    assert not os.path.exists(path) and len([f for f in os.listdir(tmp_path / "ck") if ".bad-" in f]) == 1
    assert not (tmp_path / "PWNED").exists()
    assert len(got) == len(uninterrupted)
    for a, b in zip(uninterrupted, got):
        assert (a["iters"], a["status"], a["c_star"]) == (b["iters"], b["status"], b["c_star"])


def test_diverged_net_is_stored_with_its_status_not_a_linalg_error():
    """Issue 12 item 5's config (d = 10, width 8, lr_period 10, seed 0): the net diverges to NaN
    weights; the cell reports status 4 (diverged) with NaN KKT numbers instead of failing in
    ``eigvalsh``, and its bundle mate is unaffected."""
    cells = [dict(BASE, d=10, width=8, lr_period=10, seed=s) for s in (0, 1)]
    res = EXP.run_bundle(cells, "cpu")
    assert res[0]["status"] == 4 and np.isnan(res[0]["kkt_eps"]) and res[0]["kkt_support"] == -1
    assert res[1]["status"] == 1 and np.isfinite(res[1]["kkt_eps"])


def test_net_stopped_before_separating_has_no_kkt_fit_and_no_error():
    """``max_iters: 5`` (d = 10, width 8): the nets stop (status 2) while misclassifying, q_min <= 0, so
    θ/√q_min is undefined: no KKT fit (NaN, support -1) instead of an overflowing Gram matrix."""
    res = EXP.run_bundle([dict(BASE, d=10, width=8, max_iters=5, seed=s) for s in (0, 1, 2)], "cpu")
    assert [r["status"] for r in res] == [2, 2, 2]
    assert all(np.isnan(r["kkt_eps"]) and r["kkt_support"] == -1 for r in res if r["q_min"] <= 0)
    assert any(r["q_min"] <= 0 for r in res)
