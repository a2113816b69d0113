"""How ``kktlab run`` stops on SIGTERM/SIGINT (issue 12 item 8): the signal unwinds like Ctrl-C,
so the Prefect server and Dask cluster this process started are stopped by their context
managers, the services' complaints about peers going away are muted, and the process exits
with 128 + the signal number after one line saying so."""

from __future__ import annotations

import logging
import signal
import sys

SIGNALLED: list[int] = []  # the signal that stopped this process, if one did


def install(prefect: bool = True) -> None:
    """Our handler for SIGTERM and SIGINT, and a note-taking wrapper around the handler Prefect
    installs for SIGTERM while a flow runs. Prefect's handler raises ``TerminationSignal`` and only
    hands the signal on to ours if that exception reaches its own ``except``; a signal landing
    inside pydantic's serializer is re-wrapped on the way and never does (CI stop 34), so the
    wrapper records and mutes first. Prefect looks its handler up by this module-level name
    (prefect 3.8–3.9, pinned in pyproject.toml). ``prefect=False`` (a command that runs no flow):
    our handler only, without importing Prefect (~3 s of start-up)."""
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, _terminate)
    if not prefect:
        return
    from prefect.utilities import engine

    prefect_handler = getattr(engine, "_prefect_sigterm_handler", None)
    if prefect_handler is None or getattr(prefect_handler, "kktlab_notes", False):
        return

    def noted(signum, frame):
        _note(signum)
        prefect_handler(signum, frame)

    noted.kktlab_notes = True
    engine._prefect_sigterm_handler = noted


def signalled(err: BaseException) -> bool:
    """Whether ``err`` is how a SIGTERM/SIGINT unwound this process: :data:`SIGNALLED`, or a
    ``TerminationSignal`` anywhere in the exception chain (named only in the message when pydantic
    wrapped it)."""
    from prefect.exceptions import TerminationSignal

    seen = set()
    while err is not None and id(err) not in seen and not SIGNALLED:
        seen.add(id(err))
        if isinstance(err, TerminationSignal) or "TerminationSignal" in f"{type(err).__name__}: {err}":
            SIGNALLED.append(getattr(err, "signal", signal.SIGTERM))
        err = err.__cause__ or err.__context__
    return bool(SIGNALLED)


def stopped() -> int:
    """Say which signal stopped the run; the exit status, 128 + its number."""
    print(f"kktlab: stopped by {signal.Signals(SIGNALLED[0]).name}; the Prefect server and Dask cluster it "
          "started are shut down", file=sys.stderr)
    return 128 + SIGNALLED[0]


def _note(signum: int) -> None:
    """Record the signal and mute the services' own complaints while they shut down (Dask
    heartbeats, Prefect's log shipping, a flow run's failure traceback)."""
    if not SIGNALLED:
        SIGNALLED.append(signum)
    logging.raiseExceptions = False
    for name in ("distributed", "prefect", "tornado", "asyncio"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def _terminate(signum, frame):
    """SIGTERM and SIGINT unwind like Ctrl-C."""
    _note(signum)
    raise KeyboardInterrupt(f"signal {signum}")
