"""When the training step should run under ``torch.compile``: a config's ``compile_step`` (issue 33).

``compile_step: true`` always compiles and ``false`` never does; ``auto`` compiles only where the
compile can pay for itself. Compiling costs a one-off ``compile_s`` per process and shape
(measured on the project's 2-core CPU with an empty inductor cache, a fresh machine or worker:
``COLD_COMPILE_S``; benchmarks/train_peer.py) and saves ``eager_step_s - compiled_step_s`` on
every later step of the stack, so it pays once

    expected_steps · (eager_step_s − compiled_step_s) > compile_s                    (break-even)

How many steps a bundle will take is not known in advance (nets stop at the target loss), so the
expected count is the rule of the ski-rental problem: the steps still to come are taken to be as
many as those already run, and never more than ``max_iters`` leaves. Run eagerly, timing the
pieces, until the eager steps taken would have paid for the compile; then compile, and stay
compiled. A bundle that stops early never compiles; one that runs long pays at most about
twice what the better of the two choices would have cost in hindsight. The compiled step's time is
estimated from the measured eager one (``COMPILED_FRACTION``, the largest compiled / eager ratio
measured); a shape this process has compiled already costs nothing more.

Eager and compiled steps agree to ~1e-16 relative, not bit for bit (tests/test_train.py), so
under ``auto`` a net's last bits can depend on where the switch fell; ``true`` / ``false`` are
bit-reproducible.
"""

from __future__ import annotations

import math

# One compiled shape, empty inductor cache, inductor's import included, on the project's 2-core
# CPU (benchmarks/README.md, issue 33): 37-85 s of wall time (42-45 s of CPU) with the machine
# shared (load 2.4-5), 23-25 s in the quieter measurement. With a populated cache it is
# 6-11 s, but a fresh worker on a fresh machine pays the cold figure, so the rule assumes it.
COLD_COMPILE_S = 40.0
# Compiled step time / eager step time of kktlab's training step: 0.42-0.55 measured in
# benchmarks/train_peer.py (issue 33), 0.17-0.61 over issue 19's grid; with a margin over the
# largest, so the saving is estimated at its smallest.
COMPILED_FRACTION = 0.65
SETTINGS = (False, True, "auto")

_compiled_here: set = set()  # shapes this process has compiled (a second compile is a cache hit)


def break_even_steps(eager_step_s: float, compiled_step_s: float, compile_s: float) -> float:
    """Steps after which compiling has paid: ``compile_s`` over the time saved per step (inf when
    the compiled step saves nothing)."""
    saved = eager_step_s - compiled_step_s
    return compile_s / saved if saved > 0 else math.inf


def should_compile(expected_steps: float, eager_step_s: float, compiled_step_s: float, compile_s: float) -> bool:
    """The break-even rule: compile iff the expected steps save more than the compile costs."""
    return expected_steps > break_even_steps(eager_step_s, compiled_step_s, compile_s)


def expected_steps(done: int, left: int) -> int:
    """Steps still expected: as many as were run so far (ski rental), at most ``left``."""
    return max(0, min(int(done), int(left)))


class CompilePolicy:
    """The choice for each ``train`` call (piece) of one bundle. ``setting`` is the config's
    ``compile_step``; ``shape`` any hashable key of what compiles (device, dtype, stack shape).

    Usage: ``comp = policy.choose(done, left)`` before a piece, ``policy.record(seconds, steps,
    comp)`` after it."""

    def __init__(self, setting, shape, compile_s: float = COLD_COMPILE_S,
                 compiled_fraction: float = COMPILED_FRACTION):
        if not any(type(setting) is type(s) and setting == s for s in SETTINGS):
            raise ValueError(f"compile_step must be one of {SETTINGS}, got {setting!r}")
        self.setting, self.shape = setting, shape
        self.compile_s, self.fraction = compile_s, compiled_fraction
        self.eager_s, self.eager_steps, self.compiled = 0.0, 0, False

    def compile_cost(self) -> float:
        return 0.0 if self.shape in _compiled_here else self.compile_s

    def choose(self, done: int, left: int) -> bool:
        if self.setting is not True and self.setting is not False:  # auto
            if not self.compiled and self.shape in _compiled_here:
                self.compiled = True  # compiled in this process already: nothing more to pay
            elif not self.compiled and self.eager_steps > 0:
                eager = self.eager_s / self.eager_steps
                self.compiled = should_compile(expected_steps(done, left), eager, eager * self.fraction,
                                               self.compile_cost())
            return self.compiled
        return self.setting

    def record(self, seconds: float, steps: int, compiled: bool) -> None:
        """A piece of ``steps`` steps took ``seconds`` (wall), compiled or not."""
        if compiled:
            _compiled_here.add(self.shape)
        elif steps > 0:
            self.eager_s, self.eager_steps = self.eager_s + seconds, self.eager_steps + steps
