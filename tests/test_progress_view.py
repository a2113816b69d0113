"""The terminal view of a sweep's progress (issue 17): live rich bars on a terminal, plain lines
elsewhere, fed with real progress events of flows.progress.Progress (as ``kktlab run`` does) and
with progress lines parsed back (as ``kktlab submit --watch`` does from the flow run's logs)."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from flows.progress import Event, Progress, parse_line, sink
from kktlab.progress_view import Bars, terminal_bars

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _sweep(progress: Progress) -> None:
    """What flows/chain.py's Writer does: 4 cells, 1 taken from the cache, 1 failed."""
    progress.advance(1, cached=1)
    progress.advance(2, failed=1)
    progress.advance(1)


@pytest.mark.parametrize("event", [
    Event("nets", 0, 40, 0.0),
    Event("nets", 12, 40, 12.0, 28.0, cached=4, failed=1),
    Event("robustness attack", 40, 40, 3725.0, 0.0, failed=3),
    Event("forging", 7, 144, 61.0, 3600.0 * 11 + 59, cached=7),
], ids=["start-no-eta", "cached-and-failed", "stage-with-space", "cached-only"])
def test_progress_line_parses_back(event):
    assert parse_line(event.line()) == event
    assert parse_line(event.line().removeprefix("[kktlab] ")) == event  # as the Prefect log line reads


@pytest.mark.parametrize("text", ["Beginning subflow run", "kktlab: 3 cells written to x group y",
                                  "nets: cells 3 of 4"])
def test_other_log_lines_are_not_progress(text):
    assert parse_line(text) is None


def test_live_bars_render_real_progress_events():
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=140, color_system="standard")
    with Bars(console) as bars, sink(bars.update):
        assert bars.live
        _sweep(Progress(4, 0, "nets", stream=io.StringIO(), store="/tmp/x.zarr"))
        _sweep(Progress(4, 0, "robustness", stream=io.StringIO(), store="/tmp/x.zarr"))
    text = ANSI.sub("", buf.getvalue())
    final = [ln for ln in text.replace("\r", "\n").splitlines() if "4/4" in ln]
    assert any("nets" in ln and "100%" in ln and "1 from cache, 1 failed" in ln for ln in final), text
    assert any("robustness" in ln and "━" in ln for ln in final), text
    assert "\x1b[" in buf.getvalue()  # a live display (cursor moves), not plain lines


def test_plain_lines_when_not_a_terminal():
    buf = io.StringIO()
    bars = Bars(Console(file=buf), plain_every_s=0.0, prefix="  ")
    assert not bars.live
    with bars, sink(bars.update):
        _sweep(Progress(4, 0, "nets", stream=io.StringIO()))
    lines = buf.getvalue().splitlines()
    assert "\x1b[" not in buf.getvalue()
    events = [parse_line(ln) for ln in lines]
    assert all(e is not None for e in events) and all(ln.startswith("  [kktlab] nets: cells ") for ln in lines)
    assert [(e.done, e.cached, e.failed) for e in events] == [(0, 0, 0), (1, 1, 0), (3, 1, 1), (4, 1, 1)]


def test_run_off_a_terminal_keeps_the_sweeps_own_lines():
    with terminal_bars(Console(file=io.StringIO())) as bars:
        assert bars is None
        out = io.StringIO()
        _sweep(Progress(4, 0, "nets", stream=out, every_s=0.0))
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("[kktlab] nets: cells 0/4 (0%)") and len(lines) == 4
    assert lines[-1].startswith("[kktlab] nets: cells 4/4 (100%)") and lines[-1].endswith("1 from cache, 1 failed")



def test_a_running_stage_refreshes_its_line_on_the_timer():
    """Issue 43: between two finished bundles the line (elapsed, ETA) is printed again every REFRESH_S
    on the flow's timer, never more often, and not before the stage runs or after it ends."""
    now = [0.0]
    out = io.StringIO()
    p = Progress(4, 0, "nets", stream=out, every_s=0.0, clock=lambda: now[0])
    p.tick()  # not running yet: nothing
    p.running()
    now[0] = 10.0
    p.advance(1)  # 1 cell in 10 s: ETA 30 s
    now[0] = 10.0 + Progress.REFRESH_S - 1
    p.tick()
    assert len(out.getvalue().splitlines()) == 2
    now[0] = 10.0 + Progress.REFRESH_S
    p.tick()
    last = parse_line(out.getvalue().splitlines()[-1])
    assert len(out.getvalue().splitlines()) == 3 and last.done == 1
    assert last.elapsed_s == 10.0 + Progress.REFRESH_S and last.eta_s == 3 * last.elapsed_s  # as of now
    p.advance(3)
    now[0] += 2 * Progress.REFRESH_S
    p.tick()  # done: nothing more
    assert len(out.getvalue().splitlines()) == 4

@pytest.mark.slow
@pytest.mark.requires_services
def test_run_is_quiet_prints_the_dashboard_once_and_tears_down_without_a_kill(cli, prefect_server, tmp_path,
                                                                             write_config):
    """``kktlab run`` on a local cluster of 2 worker processes: no cluster INFO lines, no
    jupyter-server-proxy hint, the dashboard address once, and the workers exit on their own (Dask's
    warnings are let through here so that "still alive after 4.0 seconds, killing" would show). It
    reports to the session's Prefect server (no embedded one of its own to start)."""
    cfg = write_config({"experiment": "nonrobust", "name": "quiet", "grid": {"d": [8], "seed": [0, 1]},
                        "params": {"width": 8, "lr0": 0.01, "lr_period": 10, "target_loss": 1.0e-4},
                        "runner": {"workers": 2, "bundle_size": 1}})
    res = cli.run("run", cfg, "--store", tmp_path / "q.zarr", env={"DASK_LOGGING__DISTRIBUTED": "warning"},
                  timeout=400)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    assert "still alive" not in out and "killing" not in out, out[-3000:]
    assert "jupyter-server-proxy" not in out and "distributed.scheduler" not in out, out[-3000:]
    dash = [ln for ln in out.splitlines() if "Dask dashboard" in ln]
    assert len(dash) == 1 and re.search(r"http://127\.0\.0\.1:\d+/status", dash[0]), dash
    assert "[kktlab] quiet: cells 2/2 (100%)" in res.stderr


@pytest.mark.requires_services
def test_watch_reads_every_new_log_line_past_the_apis_page(prefect_server):
    """A night's sweep logs more lines than one API page (200): --watch still gets each new one, once."""
    import datetime
    import uuid

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import LogCreate

    from kktlab.served import PAGE, _new_logs

    run_id, t0 = uuid.uuid4(), datetime.datetime.now(datetime.timezone.utc)
    lines = [Event("nets", i, 450, float(i)).line().removeprefix("[kktlab] ") for i in range(451)]

    def post(msgs, start):
        client.create_logs([LogCreate(name="prefect.kktlab.progress", level=20, message=m, flow_run_id=run_id,
                                      timestamp=t0 + datetime.timedelta(milliseconds=start + i))
                            for i, m in enumerate(msgs)])

    seen: dict = {}
    with get_client(sync_client=True) as client:
        post(lines[:450], 0)
        first = _new_logs(client, run_id, seen)
        post(lines[450:], 450)
        second = _new_logs(client, run_id, seen)
    assert len(first) == 450 > PAGE and [parse_line(log.message).done for log in first] == list(range(450))
    assert [parse_line(log.message).done for log in second] == [450]
