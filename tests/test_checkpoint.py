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
