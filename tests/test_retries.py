"""Bundles lost to transient causes are retried; a cell whose computation raises is stored as
failed (not retried, the other cells finish); a config error stops the sweep. Runs the real sweep
flow on the session's Prefect server (threads runner, so the test's experiment is seen)."""

import numpy as np
import pytest

from core.errors import UserError
from flows import config, experiments
from flows.experiments import Experiment, Param, Var
from flows.sweep import retry_unless_user_error, run
from storage.query import open_results, status, summary_frame
from storage.verify import verify_group

CALLS = {"n": 0, "cells": []}


def flaky(cells, device):
    CALLS["n"] += 1
    CALLS["cells"].append([c["seed"] for c in cells])
    mode = cells[0]["mode"]
    if mode == "crash" and CALLS["n"] < 3:
        raise ConnectionResetError("worker lost (simulated)")
    if mode == "config":
        raise UserError("field 'mode' is not usable here")
    if mode == "numeric" and any(c["seed"] == 1 for c in cells):
        import torch

        raise torch.linalg.LinAlgError("linalg.eigh: the algorithm failed to converge (simulated)")
    return [{"value": float(c["seed"])} for c in cells]


@pytest.fixture(scope="module", autouse=True)
def flaky_experiment():
    experiments.EXPERIMENTS["flaky"] = Experiment(
        name="flaky", paper="test", description="fails on purpose",
        params={"seed": Param(int, 0), "mode": Param(str, "ok", choices=("ok", "crash", "config", "numeric"))},
        variables={"value": Var("1", "the seed")}, run_bundle=flaky)
    yield
    experiments.EXPERIMENTS.pop("flaky")


def cfg(mode, seeds=(0, 1)):
    return config.parse({"experiment": "flaky", "name": mode, "grid": {"seed": list(seeds)}, "params": {"mode": mode},
                         "runner": {"cluster": "inline", "workers": 1, "bundle_size": len(seeds), "retries": 3}})


@pytest.fixture(autouse=True)
def reset_calls():
    CALLS.update(n=0, cells=[])


@pytest.mark.requires_services
def test_transient_crash_is_retried_until_it_succeeds(prefect_server, tmp_path):
    stats = run(cfg("crash"), str(tmp_path / "s.zarr"))
    assert CALLS["n"] == 3 and stats["written"] == 2 and stats["failed"] == 0


@pytest.mark.requires_services
def test_config_error_is_not_retried_and_names_the_problem(prefect_server, tmp_path):
    with pytest.raises(UserError, match="field 'mode' is not usable"):
        run(cfg("config"), str(tmp_path / "s.zarr"))
    assert CALLS["n"] == 1


@pytest.mark.requires_services
def test_numerical_failure_is_stored_per_cell_and_the_rest_finish(prefect_server, tmp_path):
    """Issue 12 item 5: seed 1 raises LinAlgError. The bundle (seeds 0-3) is split, the other cells
    are stored, seed 1 is stored as failed with its error, nothing is retried; a rerun leaves it
    alone, ``retry_failed`` computes it again (and stores the failure again)."""
    store = str(tmp_path / "s.zarr")
    stats = run(cfg("numeric", seeds=(0, 1, 2, 3)), store)
    assert CALLS["cells"] == [[0, 1, 2, 3], [0], [1], [2], [3]]  # once as a bundle, then one by one, no retry
    assert (stats["written"], stats["failed"]) == (3, 1)
    assert "seed=1: " in stats["failures"][0] and "LinAlgError" in stats["failures"][0]
    ds = open_results(store, "numeric")
    assert ds.done.values.all() and ds.failed.values.tolist() == [False, True, False, False]
    np.testing.assert_array_equal(ds.value.values, [0.0, np.nan, 2.0, 3.0])
    assert summary_frame(ds, over="none")["n_used"].tolist() == [1, 0, 1, 1]  # never averaged in
    report = verify_group(store, "numeric", None)
    assert report.ok and report.sound == 4  # a failed cell is done and sound: not "damaged", not recomputed
    row = status(store)[0]
    assert row["failed"] == 1 and "LinAlgError" in row["failures"]["seed=1"]
    CALLS.update(n=0, cells=[])
    again = run(cfg("numeric", seeds=(0, 1, 2, 3)), store)
    assert CALLS["n"] == 0 and again["done_before"] == 4
    retried = run(cfg("numeric", seeds=(0, 1, 2, 3)), store, retry_failed=True)
    assert CALLS["cells"] == [[1]] and retried["failed"] == 1


@pytest.mark.requires_services
def test_retried_failure_that_now_works_is_cleared(prefect_server, tmp_path):
    store = str(tmp_path / "s.zarr")
    run(cfg("numeric", seeds=(0, 1)), store)
    fixed = config.parse({"experiment": "flaky", "name": "numeric", "grid": {"seed": [0, 1]},
                          "params": {"mode": "numeric"}, "runner": {"cluster": "inline", "workers": 1}})
    experiments.EXPERIMENTS["flaky"] = Experiment(
        name="flaky", paper="test", description="fixed", params=experiments.get("flaky").params,
        variables={"value": Var("1", "the seed")}, run_bundle=lambda cells, device: [{"value": 7.0} for _ in cells])
    try:
        stats = run(fixed, store, retry_failed=True)
    finally:
        experiments.EXPERIMENTS["flaky"] = Experiment(
            name="flaky", paper="test", description="fails on purpose", params=fixed.exp.params,
            variables={"value": Var("1", "the seed")}, run_bundle=flaky)
    ds = open_results(store, "numeric")
    assert stats["written"] == 1 and not ds.failed.values.any() and ds.value.values.tolist() == [0.0, 7.0]
    assert status(store)[0]["failures"] == {}


@pytest.mark.parametrize("exc,retried", [(ConnectionResetError("comm closed"), True), (MemoryError(), True),
                                         (RuntimeError("killed worker"), True), (ValueError("bad"), False),
                                         (UserError("bad field"), False)])
def test_retry_condition(exc, retried):
    class State:
        def result(self):
            raise exc

    assert retry_unless_user_error(None, None, State()) is retried
