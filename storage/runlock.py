"""One run at a time per group of a store (issue 29 item 11, issue 30 item 5).

Two runs of one config on one store would keep the data right (no cell is written twice) but
compute every pending cell twice. So a run holds, for as long as it computes, a lock on every
group it writes: ``<store>.runlocks/<group>.lock`` beside the store (never inside it: the store
holds kktlab's Zarr groups only, storage/foreign.py). The lock is ``fcntl.flock``: the kernel
drops it when its holder dies, so a ``kill -9``'d run never blocks the next one (its record in
the file is overwritten). The file records who holds it (pid, host, start time, command and,
inside Prefect, the flow run and its UI page); a second run is refused in one line that names
them, or with ``wait`` waits for the holder to finish and then finds its cells done. A live holder
whose flow run the server calls Crashed (its heartbeats lost in a server outage: flows/liveness.py)
is said to be alive in that line; ``kktlab submit --watch`` watches such a run on (:func:`live_holder`).

The groups of a chain are taken in one fixed order (sorted by name), so two waiting runs that
share groups never hold one each and wait for the other. Readers (status, show, verify, report)
never take the lock. The creation lock ``<store>.lock`` (storage/store.py) is another one: it
serialises making groups, for a moment; this one spans the whole computation of a group.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import os
import pathlib
import shlex
import socket
import sys
import time
from collections.abc import Callable, Iterable, Iterator

from core.errors import StoreError

SUFFIX = ".runlocks"  # the folder beside the store (shorter than '.checkpoints': kktlab/preflight.py)
POLL_S = 0.5  # how often a waiting run tries again
SAY_EVERY_S = 30.0  # how often a waiting run says it still waits
SETTLE_S = 2.0  # how long a refusal waits for a holder that has just taken the lock to record itself
_HELD: dict[pathlib.Path, tuple[int, dict]] = {}  # the locks this process holds: lock file -> (fd, record)


def lock_path(store: str | os.PathLike, group: str) -> pathlib.Path:
    """The lock file of ``group`` of the store at ``store`` (absolute: a lock this process holds is
    found whether the store is named relative to the working folder or not)."""
    return pathlib.Path(os.path.abspath(str(store) + SUFFIX)) / f"{group}.lock"


def holder(store: str | os.PathLike, group: str) -> dict:
    """What the lock file of ``group`` records of its last holder ({} when nothing); it says who
    holds the lock only while the lock is held (a reader never takes it)."""
    try:
        text = lock_path(store, group).read_text()
        info = json.loads(text) if text.strip() else {}
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def describe(info: dict) -> str:
    """``pid 123@host since 2025-06-01 12:00:03 UTC, flow run URL`` (what is known of it)."""
    who = f"pid {info.get('pid', '?')}@{info.get('host', '?')}"
    if info.get("started"):
        who += f" since {str(info['started']).replace('T', ' ').removesuffix('Z')} UTC"
    run = info.get("flow_run_url") or info.get("flow_run_id")
    return who + (f", flow run {run}" if run else "")


def refusal(store: str | os.PathLike, group: str, info: dict, state: str | None = None) -> str:
    """The one line a run that finds ``group`` locked stops with; ``state``: what the Prefect server
    calls the holder's flow run (:func:`server_state`): a live holder it calls Crashed is said to be alive."""
    who = describe(info) if info else "a run that has not recorded itself"
    alive = (f"; it is alive although the Prefect server shows it {state} (its heartbeats were lost, e.g. while the "
             "server could not be reached; it sets itself Running again)") if state == "Crashed" else ""
    return (f"group '{group}' of store {store} is being computed by another run ({who}){alive}; "
            "rerun with --wait to wait for it")


def server_state(info: dict, timeout_s: float = 3.0) -> str | None:
    """The name of the state (``Crashed``, ``Running``, ...) the Prefect server the record names gives
    the holder's flow run now, asked once within about ``timeout_s``; None when not recorded or no answer."""
    url, run_id = str(info.get("flow_run_url") or ""), info.get("flow_run_id")
    if not run_id or "/runs/flow-run/" not in url:
        return None
    try:
        from prefect.client.orchestration import get_client
        from prefect.settings import (PREFECT_API_REQUEST_TIMEOUT, PREFECT_API_URL, PREFECT_CLIENT_MAX_RETRIES,
                                      temporary_settings)

        api = url.split("/runs/flow-run/")[0] + "/api"
        with temporary_settings(updates={PREFECT_API_URL: api, PREFECT_API_REQUEST_TIMEOUT: timeout_s,
                                         PREFECT_CLIENT_MAX_RETRIES: 0}), get_client(sync_client=True) as client:
            state = client.read_flow_run(run_id).state
    except Exception:  # noqa: BLE001 - a refusal names the holder anyway
        return None
    return state.name if state is not None else None


def live_holder(store: str | os.PathLike, groups: Iterable[str], flow_run_id) -> dict | None:
    """The record of the process of flow run ``flow_run_id`` that holds the lock of one of ``groups``
    now and is alive (as :func:`_alive` can tell: a process on another host is taken to be); None
    when none does (``kktlab submit --watch`` then takes a Crashed state as final)."""
    for group in sorted(set(groups)):
        info = held_by(store, group)
        if info and str(info.get("flow_run_id")) == str(flow_run_id) and _alive(info):
            return info
    return None


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _alive(info: dict) -> bool:
    """The recorded holder may hold the lock: it is on another host, or a live process here."""
    if not info.get("pid"):
        return False
    if info.get("host") != socket.gethostname():
        return True
    try:
        os.kill(int(info["pid"]), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError, OverflowError):
        return True
    return True


def _try(fd: int, shared: bool = False) -> bool:
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        return True
    except OSError as err:
        if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise


def _acquire(fd: int, path: pathlib.Path, store, group: str, wait: bool, say: Callable[[str], None], poll_s: float,
             say_every_s: float, shared: bool = False) -> bool:
    """Lock ``fd`` (the lock file of ``group``), refusing in one line or, with ``wait``, waiting while
    another run holds it; False where the file system cannot lock (said once). ``shared``: a probe
    (:func:`check`), which conflicts with a holder but takes nothing from another probe."""
    t0 = time.monotonic()
    said = None
    while True:
        try:
            if _try(fd, shared):
                break
        except OSError as err:  # e.g. ENOLCK: a network file system without locks
            say(f"[kktlab] warning: cannot lock {path} ({err.strerror}): nothing stops another run "
                f"from computing the cells of group '{group}' at the same time")
            return False
        info = holder(store, group)
        if not wait:
            if not _alive(info) and time.monotonic() - t0 < SETTLE_S:  # the holder is writing its record
                time.sleep(0.05)
                continue
            alive = _alive(info)
            raise StoreError(refusal(store, group, info if alive else {}, server_state(info) if alive else None))
        now = time.monotonic()
        if said is None or now - said >= say_every_s:
            waited = f" ({now - t0:.0f} s so far)" if said is not None else ""
            say(f"[kktlab] waiting for the run computing group '{group}' of {store} "
                f"({describe(info) if _alive(info) else 'not recorded yet'}) to finish{waited}")
            said = now
        time.sleep(poll_s)
    if said is not None:
        say(f"[kktlab] group '{group}' of {store} is free after {time.monotonic() - t0:.0f} s; this run goes on")
    return True


def _take(store, group: str, wait: bool, about: dict, say: Callable[[str], None], poll_s: float,
          say_every_s: float) -> int | None:
    """Lock ``group``; the open lock file (None where the file system cannot lock, or where this
    process holds it already: the outer :func:`hold` releases it)."""
    path = lock_path(store, group)
    if path in _HELD:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by processes started later
    try:
        if not _acquire(fd, path, store, group, wait, say, poll_s, say_every_s):
            os.close(fd)
            return None
        record = {"pid": os.getpid(), "host": socket.gethostname(),
                  "started": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                  "command": shlex.join(sys.argv)[:1000], "store": str(store), "group": group,
                  **{k: v for k, v in about.items() if v}}
        _write(fd, record)
        _HELD[path] = (fd, record)
        return fd
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise


def check(store: str | os.PathLike, groups: Iterable[str], *, wait: bool = False, say: Callable[[str], None] = _say,
          poll_s: float = POLL_S, say_every_s: float = SAY_EVERY_S) -> None:
    """Refuse (:class:`StoreError`, the line :func:`hold` stops with) or, with ``wait``, wait while
    another run holds the lock of one of ``groups``; hold nothing after (``kktlab submit``: the run it
    queues takes the locks on its worker). Makes no lock file, writes no record; a group whose lock
    file does not exist has never been computed by a run."""
    for group in sorted(set(groups)):
        path = lock_path(store, group)
        if path in _HELD:
            continue
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            if _acquire(fd, path, store, group, wait, say, poll_s, say_every_s, shared=True):
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


def _write(fd: int, record: dict) -> None:
    """The record, in place (a new file renamed over it would be another lock)."""
    data = (json.dumps(record, indent=1) + "\n").encode()
    os.pwrite(fd, data, 0)
    os.ftruncate(fd, len(data))


def note(store: str | os.PathLike, groups: Iterable[str], about: dict) -> None:
    """Add ``about`` (e.g. the flow run, known once it started) to the records of the locks of
    ``groups`` this process holds; groups it does not hold are left alone."""
    for group in groups:
        path = lock_path(store, group)
        if path in _HELD and about:
            fd, record = _HELD[path]
            record.update((k, v) for k, v in about.items() if v)
            _write(fd, record)


@contextlib.contextmanager
def hold(store: str | os.PathLike, groups: Iterable[str], *, wait: bool = False, about: dict | None = None,
         say: Callable[[str], None] = _say, poll_s: float = POLL_S, say_every_s: float = SAY_EVERY_S) -> Iterator[None]:
    """Hold the run lock of every group of ``groups`` of ``store`` (taken in sorted order) for the
    body, released on every way out. A group another run holds: :class:`StoreError` in one line
    naming its holder, before anything is locked for long (the groups taken are released), or,
    with ``wait``, wait for it (a line every ``say_every_s``). ``about``: what else to record of
    this run (``flow_run_id``, ``flow_run_url``). Groups this process holds already (an outer
    ``hold``: ``kktlab run`` takes its locks before it starts a server) are left to that one."""
    fds: list[int] = []
    try:
        for group in sorted(set(groups)):
            fd = _take(store, group, wait, about or {}, say, poll_s, say_every_s)
            if fd is not None:
                fds.append(fd)
        yield
    finally:
        for fd in reversed(fds):
            for path in [p for p, (held, _) in _HELD.items() if held == fd]:
                del _HELD[path]
            with contextlib.suppress(OSError):
                os.close(fd)  # closing the file drops its flock


def held_by(store: str | os.PathLike, group: str) -> dict | None:
    """The record of the run holding ``group``'s lock now, or None when no run holds it (a try for a
    shared lock, let go at once: ``kktlab status`` and ``kktlab cancel``)."""
    try:
        fd = os.open(lock_path(store, group), os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        if _try_shared(fd):
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        return holder(store, group)
    finally:
        os.close(fd)


def _try_shared(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return True
    except OSError as err:
        if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise
