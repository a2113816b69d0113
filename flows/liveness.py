"""A live run that the server has marked Crashed sets itself Running again (issue 43, the false crash).

The heartbeat automation (deploy/prefect_deploy.py ``ensure_crash_automation``) marks a flow run
Crashed when the server has seen no heartbeat from it for a few periods: its worker died, or the
server could not be reached and lost the heartbeats of a run that went on writing cells. The
server cannot tell the two apart; the run can: while the sweep flow's body runs, :func:`guard`
reads every ``CHECK_S`` what the server calls this flow run and its root (the run ``kktlab
submit`` printed), and sets one it calls Crashed Running again (forced: the server lets a run
leave Crashed only so), with one line on stderr and in the run's logs. Its proof of life is that
it runs in the run's process. A run's bundles are refused while its flow run is not Running
(Prefect's ``PreventRunningTasksFromStoppedFlows``), so the check is frequent and cheap (one read
per run). The guard stops, and is waited for, before the flow's body returns: it never overwrites
a final state. ``kktlab submit --watch`` and the run lock's refusal read the same lock record to
tell a live run from a dead one (kktlab/watch_crash.py, storage/runlock.py).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import socket
import threading
from collections.abc import Callable, Iterable, Iterator

CHECK_S = 10.0  # seconds between two reads of the run's state on the server


def restore(client, run_ids: Iterable[str], say: Callable[[str], None]) -> list[str]:
    """Set each flow run of ``run_ids`` that the server (``client``) calls Crashed Running again,
    saying so in one line each; the ids set."""
    from prefect.client.schemas.objects import StateType
    from prefect.states import Running

    restored = []
    for run_id in run_ids:
        run = client.read_flow_run(run_id)
        if run.state is None or run.state.type != StateType.CRASHED:
            continue
        why = (run.state.message or "").strip().splitlines()
        me = f"pid {os.getpid()}@{socket.gethostname()}"
        client.set_flow_run_state(run_id, Running(message=f"kktlab: alive ({me}) after the server marked it Crashed"),
                                  force=True)
        say(f"the Prefect server marked flow run {run.name} Crashed while it could not be reached"
            f"{' (' + why[0][:200] + ')' if why else ''}; it is still running ({me}): set Running again")
        restored.append(str(run_id))
    return restored


def _run_ids() -> list[str]:
    """This flow run and its root (one id when it is the root); [] outside a flow run."""
    try:
        from prefect.runtime import flow_run

        ids = [flow_run.id, flow_run.root_flow_run_id]
    except Exception:  # noqa: BLE001 - outside a flow run: nothing to guard
        return []
    return list(dict.fromkeys(str(i) for i in ids if i))


def _say(line: str) -> None:
    from flows.progress import announce

    announce(line)  # stderr (the worker's log) and the root flow run's logs


@contextlib.contextmanager
def guard(every_s: float | None = None, say: Callable[[str], None] = _say) -> Iterator[None]:
    """For the body: every ``every_s`` (default :data:`CHECK_S`) set this flow run and its root
    Running again if the server calls them Crashed (:func:`restore`); nothing outside a flow run."""
    run_ids = _run_ids()
    if not run_ids:
        yield
        return
    every_s = CHECK_S if every_s is None else every_s
    stop, busy = threading.Event(), threading.Lock()

    def loop() -> None:
        from prefect.client.orchestration import get_client

        while not stop.wait(every_s):
            with busy:  # the body's end waits for a check under way: no Running after the final state
                if stop.is_set():
                    return
                try:
                    with get_client(sync_client=True) as client:
                        restore(client, run_ids, say)
                except Exception:  # noqa: BLE001 - the server is away: try again at the next check
                    pass

    # the run's context (its API URL, its flow run for the log lines), as Prefect's heartbeat thread does
    thread = threading.Thread(target=contextvars.copy_context().run, args=(loop,), daemon=True,
                              name="kktlab-liveness")
    thread.start()
    try:
        yield
    finally:
        with busy:
            stop.set()
        thread.join(timeout=5)
