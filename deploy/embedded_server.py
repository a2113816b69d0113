"""The embedded (temporary) Prefect server of a run: Prefect's own ``SubprocessASGIServer`` command
and environment (prefect/server/api/server.py: uvicorn serving ``create_app`` as an ephemeral server,
no UI, on 127.0.0.1), started without importing Prefect's server package here.

Why: ``from prefect.server.api.server import SubprocessASGIServer`` imports the whole server (FastAPI
routes, ORM models, migrations): 4.5 s of a 26 s one-cell ``kktlab run`` on 2 cores (py-spy), spent
before the server process, which imports the same again, was even started. Here the process starts at
once and this process only polls its health (issue 44).
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import pathlib
import subprocess
import sys
import time

from deploy import launch

PORT_IN_USE = 3  # uvicorn's exit status when its port was taken meanwhile


WATCHDOG = """
import os, signal, sys, time
parent, server = int(sys.argv[1]), int(sys.argv[2])
while True:
    time.sleep(1)
    try:
        os.kill(server, 0)
    except OSError:
        break  # the server stopped: nothing to watch
    if os.getppid() != parent:  # the run died without stopping its server (kill -9): stop it
        os.kill(server, signal.SIGTERM)
        time.sleep(5)
        try:
            os.kill(server, signal.SIGKILL)
        except OSError:
            pass
        break
"""


def watch_parent(server_pid: int) -> None:
    """A watchdog process that stops the embedded server ``server_pid`` when this process dies
    without stopping it (kill -9 of the run alone: issue 29 item 9); it exits with the server."""
    subprocess.Popen([sys.executable, "-c", WATCHDOG, str(os.getpid()), str(server_pid)],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


class EmbeddedServer:
    """One temporary Prefect API server process; :meth:`wait` until it answers, :meth:`stop` it."""

    def __init__(self):
        self.port = launch.free_port()
        self.process = self._start()
        atexit.register(self.stop)  # a way out that never reached prefect_api's own stop

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def _start(self) -> subprocess.Popen:
        site = pathlib.Path(importlib.util.find_spec("prefect").origin).parent.parent
        env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}
        env.pop("PREFECT_API_URL", None)
        process = subprocess.Popen([sys.executable, "-m", "uvicorn", "--app-dir", str(site), "--factory",
                                    "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port",
                                    str(self.port), "--log-level", "error", "--lifespan", "on"], env=env)
        watch_parent(process.pid)
        return process

    def wait(self, limit: float) -> str:
        """The API URL once ``/health`` answers 200, within ``limit`` seconds; RuntimeError (with the
        process's exit status where it ended) if not."""
        until = time.monotonic() + limit
        while time.monotonic() < until:
            status = self.process.poll()
            if status == PORT_IN_USE:  # another process took the port meanwhile: another one, as Prefect does
                self.port = launch.free_port()
                self.process = self._start()
            elif status is not None:
                raise RuntimeError(f"the server process exited with status {status}.")
            if launch.answers(f"{self.api_url}/health"):
                return self.api_url
            time.sleep(0.1)
        raise RuntimeError("Timed out while attempting to connect to ephemeral Prefect API server.")

    def stop(self) -> None:
        """Terminate the process (killed if it has not ended 5 s later)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
