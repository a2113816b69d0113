"""The break-even rule of ``compile_step: auto`` (issue 33): decisions given numbers, no timing."""

from __future__ import annotations

import math

import pytest

from core.errors import ConfigError
from tasks.train import compile_policy as cp


def test_break_even_steps_is_compile_cost_over_the_saving():
    assert cp.break_even_steps(eager_step_s=1e-3, compiled_step_s=0.6e-3, compile_s=25.0) == pytest.approx(62_500)
    assert cp.break_even_steps(1e-3, 1e-3, 25.0) == math.inf  # no saving: never pays
    assert cp.break_even_steps(1e-3, 2e-3, 25.0) == math.inf  # compiled slower


@pytest.mark.parametrize("steps, expect", [(62_499, False), (62_501, True), (10**6, True), (0, False)])
def test_should_compile_only_past_break_even(steps, expect):
    assert cp.should_compile(steps, 1e-3, 0.6e-3, 25.0) is expect


def test_expected_steps_is_ski_rental_capped_by_what_is_left():
    assert cp.expected_steps(done=1000, left=10**6) == 1000
    assert cp.expected_steps(done=10**5, left=500) == 500
    assert cp.expected_steps(done=0, left=10**6) == 0


def _policy(setting, shape=("cpu", "f64", (16, 50, 50), 100), **kw):
    cp._compiled_here.discard(shape)
    return cp.CompilePolicy(setting, shape, compile_s=25.0, compiled_fraction=0.5, **kw)


def test_true_and_false_are_honoured_whatever_the_numbers():
    for setting in (True, False):
        pol = _policy(setting)
        assert pol.choose(0, 10**9) is setting
        pol.record(100.0, 1000, setting)
        assert pol.choose(10**6, 10**9) is setting


def test_auto_runs_eager_until_the_eager_steps_would_have_paid_then_stays_compiled():
    pol = _policy("auto")
    assert pol.choose(0, 150_000) is False  # nothing measured yet: eager
    pol.record(1.0, 1000, False)  # 1 ms a step eager -> 0.5 ms saved a step, break-even 50,000 steps
    assert pol.choose(1000, 149_000) is False  # 1,000 more expected: 0.5 s < 25 s
    for done in range(2000, 50_001, 1000):
        pol.record(1.0, 1000, False)
        assert pol.choose(done, 150_000 - done) is (done > 50_000)
    pol.record(1.0, 1000, False)
    assert pol.choose(51_000, 99_000) is True
    pol.record(10.0, 1000, True)
    assert pol.choose(52_000, 98_000) is True  # sunk cost: stays compiled


def test_auto_never_compiles_when_max_iters_leaves_too_few_steps():
    pol = _policy("auto")
    pol.record(1.0, 1000, False)
    assert pol.choose(10**6, 40_000) is False  # 40,000 left < 50,000 break-even


def test_auto_compiles_at_once_for_a_big_stack_and_for_a_shape_compiled_in_this_process():
    pol = _policy("auto")
    pol.record(100.0, 1000, False)  # 0.1 s a step: break-even 500 steps
    assert pol.choose(1000, 10**5) is True
    pol.record(5.0, 1000, True)
    again = cp.CompilePolicy("auto", pol.shape, compile_s=25.0)  # the next bundle of this worker
    assert again.choose(0, 10**5) is True


def test_settings_and_config_values():
    with pytest.raises(ValueError):
        cp.CompilePolicy("yes", "s")
    with pytest.raises(ValueError):
        cp.CompilePolicy(1, "s")
    from flows import config

    base = {"experiment": "train", "grid": {"seed": [0]}, "params": {"d": 6, "m": 8, "width": 10}}
    for val in (True, False, "auto"):
        cfg = config.parse({**base, "params": {**base["params"], "compile_step": val}})
        assert cfg.cells()[0]["compile_step"] == val and type(cfg.cells()[0]["compile_step"]) is type(val)
    for bad in ("yes", 1, 0, "true"):
        with pytest.raises(ConfigError):
            config.parse({**base, "params": {**base["params"], "compile_step": bad}})
