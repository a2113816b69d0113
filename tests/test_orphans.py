"""kill -9 of the `kktlab run` process alone never leaves its embedded Prefect server listening
(issue 29 item 9): a watchdog started with the server stops it when the run dies. The run is killed
once its server answers (it starts the server before it reads its config: issue 44)."""

from __future__ import annotations

import subprocess
import time

import psutil
import pytest

pytestmark = [pytest.mark.requires_services, pytest.mark.slow]


def _command(proc: psutil.Process) -> str:
    """``proc``'s command line; "" for a child that ended meanwhile (gone, or a zombie not yet reaped:
    psutil cannot read its command line, and it is neither the server nor its watchdog)."""
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return ""


def _answers(server: psutil.Process | None) -> bool:
    """Whether the embedded server process ``server`` answers on its port (``--port N``)."""
    from deploy import launch

    cmd = _command(server) if server is not None else ""
    return "--port " in cmd and launch.answers(f"http://127.0.0.1:{cmd.split('--port ')[1].split()[0]}/api/health")


def test_embedded_server_dies_with_a_killed_run(cli, tmp_path, monkeypatch, prefect_home):
    import os

    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}  # an embedded server of its own
    env["PREFECT_HOME"] = prefect_home("home")
    proc = subprocess.Popen([*cli.argv, "run", str(cli.root / "configs" / "pipeline-small.yaml"), "--store",
                             str(tmp_path / "s.zarr")], cwd=cli.root, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    server = watchdog = None
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not _answers(server) and proc.poll() is None:
            kids = psutil.Process(proc.pid).children(recursive=True)
            server = next((k for k in kids if "uvicorn" in _command(k)), None)
            watchdog = next((k for k in kids if "getppid" in _command(k)), None)  # started with the server
            time.sleep(0.2)
        assert server is not None and watchdog is not None, "no embedded server (and watchdog) started"
        assert _answers(server), "the embedded server never answered"  # killed while it serves the run
    finally:
        proc.kill()  # kill -9 of the run alone, not its process group
        proc.wait()
    gone, _ = psutil.wait_procs([server], timeout=20)
    assert gone, f"the embedded server (pid {server.pid}) outlived its run"
