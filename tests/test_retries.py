"""Bundles lost to crashes are retried; bundles failing on bad input are not, and the user
sees the message. Runs the real sweep flow on the session's Prefect server (threads runner)."""

import pytest

from flows import experiments
from flows.experiments import Experiment, Param, Var
from flows.sweep import retry_unless_user_error, run
from flows import config
from core.errors import UserError

CALLS = {"n": 0}


def flaky(cells, device):
    CALLS["n"] += 1
    mode = cells[0]["mode"]
    if mode == "crash" and CALLS["n"] < 3:
        raise RuntimeError("worker lost (simulated)")
    if mode == "bad":
        raise ValueError("x must be positive, got -1")
    return [{"value": float(c["seed"])} for c in cells]


@pytest.fixture(scope="module", autouse=True)
def flaky_experiment():
    experiments.EXPERIMENTS["flaky"] = Experiment(
        name="flaky", paper="test", description="fails on purpose",
        params={"seed": Param(int, 0), "mode": Param(str, "ok", choices=("ok", "crash", "bad"))},
        variables={"value": Var("1", "the seed")}, run_bundle=flaky)
    yield
    experiments.EXPERIMENTS.pop("flaky")


def cfg(mode):
    return config.parse({"experiment": "flaky", "name": mode, "grid": {"seed": [0, 1]}, "params": {"mode": mode},
                         "runner": {"cluster": "inline", "workers": 1, "bundle_size": 2, "retries": 3}})


def test_crash_is_retried_until_it_succeeds(prefect_server, tmp_path):
    CALLS["n"] = 0
    stats = run(cfg("crash"), str(tmp_path / "s.zarr"))
    assert CALLS["n"] == 3 and stats["written"] == 2


def test_bad_input_is_not_retried_and_names_the_problem(prefect_server, tmp_path):
    CALLS["n"] = 0
    with pytest.raises(UserError, match="x must be positive"):
        run(cfg("bad"), str(tmp_path / "s.zarr"))
    assert CALLS["n"] == 1


def test_retry_condition():
    class State:
        def __init__(self, exc):
            self.exc = exc

        def result(self):
            raise self.exc

    assert retry_unless_user_error(None, None, State(RuntimeError("comm closed")))
    assert not retry_unless_user_error(None, None, State(ValueError("bad")))
