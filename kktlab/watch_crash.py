"""Is a Crashed run dead? What ``kktlab submit --watch`` asks before it exits 1 (issue 43).

The server marks a run Crashed when it has had no heartbeat from it for a few periods
(deploy/prefect_deploy.py); after a server outage that can be a live run (its heartbeats were
lost), which sets itself Running again (flows/liveness.py). The watcher asks the store: while the
process of that flow run still holds one of its groups' run locks and is alive (storage/runlock.py),
the run goes on and the watching too, said in one line; only once no process of it holds a lock,
for ``SETTLE_S`` (a run that ends releases its locks a moment before its final state reaches the
server), is Crashed final.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from storage import runlock

SETTLE_S = 10.0  # a Crashed run with no live lock holder for this long is dead


class CrashCheck:
    """One watcher's verdict on flow run ``run_id``'s Crashed states, from the run locks of ``groups``
    of ``store`` (no store: every Crashed is final)."""

    def __init__(self, run_id, store: str | None, groups: Iterable[str], say: Callable[[str], None],
                 settle_s: float | None = None, clock: Callable[[], float] = time.monotonic):
        self.run_id, self.store, self.groups, self.say, self.clock = run_id, store, list(groups), say, clock
        self.settle_s = SETTLE_S if settle_s is None else settle_s
        self.said, self.gone_since = False, None

    def goes_on(self, state, name: str = "") -> bool:
        """True while ``state`` (the run's, as the server has it) is Crashed but the run is not dead: its
        process holds its run lock and is alive (said once per Crashed spell), or it let go of the lock
        less than ``settle_s`` ago. False for any other state, and for a Crashed run that is dead."""
        if state is None or not state.is_crashed():
            self.said, self.gone_since = False, None
            return False
        held = runlock.live_holder(self.store, self.groups, self.run_id) if self.store and self.groups else None
        if held is not None:
            self.gone_since = None
            if not self.said:
                self.said = True
                why = (state.message or "").strip().splitlines()
                self.say(f"kktlab: the Prefect server marked flow run {name or self.run_id} Crashed"
                         f"{' (' + why[0][:200] + ')' if why else ''}, but it is alive: {runlock.describe(held)} "
                         f"still holds the run lock of {self.store}; watching on")
            return True
        now = self.clock()
        self.gone_since = now if self.gone_since is None else self.gone_since
        return now - self.gone_since < self.settle_s
