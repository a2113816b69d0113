"""Served mode as its users see it, in a real browser (issue 17): a real ``prefect server start``
with its web UI, a process worker, the deployments, a sweep submitted with ``kktlab submit --watch``;
headless Chromium (the system's package) opens the flow run page that ``submit`` printed and the
progress artifact's page, and both show the progress text; the run's results artifact's page shows the
store path and the ``kktlab report`` command. Skipped with a reason where there is no
Chromium (CI images without it). The worker's log shows a quiet sweep: no local-cluster INFO lines,
the dashboard address once, and no forced kill of Dask workers at teardown.
docs/served-flow-run.png (README, docs/served.md) is a screenshot taken the same way."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from deploy import launch

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
requires_chromium = pytest.mark.skipif(CHROMIUM is None, reason="requires headless Chromium (apt install chromium); "
                                                                "none of chromium, chromium-browser, google-chrome is on PATH")
pytestmark = [pytest.mark.requires_services, pytest.mark.slow]

TINY = {"experiment": "nonrobust", "name": "uirun", "grid": {"d": [16], "seed": [0, 1]},
        "params": {"width": 16, "lr0": 0.01, "lr_period": 10, "target_loss": 1.0e-10},
        "runner": {"workers": 1, "bundle_size": 1}}


def _page_text(url: str, tmp_path, screenshot=None) -> str:
    """The text of ``url`` once the UI has loaded its data (Chromium's virtual time budget)."""
    args = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1400,1500",
            "--virtual-time-budget=20000", f"--user-data-dir={tmp_path / 'chromium'}"]
    if screenshot is not None:
        subprocess.run([*args, f"--screenshot={screenshot}", url], capture_output=True, timeout=120, check=True)
    dom = subprocess.run([*args, "--dump-dom", url], capture_output=True, text=True, timeout=120, check=True).stdout
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", dom))


@requires_chromium
def test_run_page_in_a_browser_shows_the_progress(cli, tmp_path, write_config):
    port = launch.free_port()
    server, env = launch.prefect_server(tmp_path / "prefect-home", port, tmp_path / "server.log", ui=True)
    worker = None
    try:
        dep = cli.run("deploy", "--pool", "kktlab-ui", env=env, timeout=180)
        assert dep.returncode == 0, dep.stderr[-2000:]
        # Dask's warnings let through, so a forced kill at teardown would show in the worker's log
        worker = launch.start([f"{launch.BIN}/prefect", "worker", "start", "--pool", "kktlab-ui", "--type", "process"],
                              tmp_path / "pworker.log", dict(env, DASK_LOGGING__DISTRIBUTED="warning"))
        res = cli.run("submit", write_config(TINY), "--store", tmp_path / "ui.zarr", "--watch", env=env, timeout=400)
        assert res.returncode == 0, res.stdout + res.stderr[-3000:]
        # --watch off a terminal: plain progress lines, then the summary table read from the store
        assert "[kktlab] uirun: cells 2/2 (100%)" in res.stdout and "\x1b[" not in res.stdout, res.stdout
        assert "== nonrobust / uirun" in res.stdout and "cells: 2/2 done" in res.stdout, res.stdout
        url = re.search(r"http://127\.0\.0\.1:\d+/runs/flow-run/[0-9a-f-]{36}", res.stdout).group(0)
        run_id = url.rsplit("/", 1)[1]

        text = _page_text(url, tmp_path, screenshot=tmp_path / "run.png")
        assert "Completed" in text and "uirun: cells 2/2 (100%)" in text, text[-3000:]  # its progress log lines
        assert (tmp_path / "run.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

        from prefect.client.orchestration import get_client
        from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings(updates={PREFECT_API_URL: env["PREFECT_API_URL"]}):
            with get_client(sync_client=True) as client:
                arts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["kktlab-ui-uirun"])))
        final = [a for a in arts if "cells 2/2 (100%)" in str(a.data) and str(a.flow_run_id) == run_id]
        assert final, [(a.key, a.data) for a in arts]
        art_text = _page_text(url.split("/runs/")[0] + f"/artifacts/artifact/{final[0].id}", tmp_path)
        assert "kktlab-ui-uirun" in art_text and "uirun: cells 2/2 (100%)" in art_text, art_text[-2000:]

        # from the run to the results: the results artifact's page names the store and the report command
        store = str(tmp_path / "ui.zarr")
        with temporary_settings(updates={PREFECT_API_URL: env["PREFECT_API_URL"]}):
            with get_client(sync_client=True) as client:
                results = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["kktlab-ui-results"])))
        results = [a for a in results if str(a.flow_run_id) == run_id]
        assert len(results) == 1, [(a.key, a.flow_run_id) for a in results]
        res_text = _page_text(url.split("/runs/")[0] + f"/artifacts/artifact/{results[0].id}", tmp_path,
                              screenshot=tmp_path / "results.png")
        assert f"Results: {store}" in res_text, res_text[-3000:]
        assert f"kktlab report {store} --out DIR" in res_text and f"kktlab status {store}" in res_text, res_text[-3000:]
    finally:
        if worker is not None:
            launch.stop(worker)
        launch.stop(server)
    log = (tmp_path / "pworker.log").read_text()
    assert "distributed.scheduler" not in log and "jupyter-server-proxy" not in log, log[-3000:]
    assert "still alive" not in log, log[-3000:]
    assert len(re.findall(r"\[kktlab\] Dask dashboard: http://127\.0\.0\.1:\d+/status", log)) == 1, log[-3000:]
    if os.environ.get("KKTLAB_UPDATE_SCREENSHOT"):  # refresh the README's picture: docs/served-flow-run.png
        shutil.copy(tmp_path / "run.png", launch.os.path.join(os.path.dirname(__file__), "..", "docs",
                                                              "served-flow-run.png"))
