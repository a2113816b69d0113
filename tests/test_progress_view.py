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
