"""The test suite's time, test by test, from pytest's JUnit XML (``make test-durations``).

Writes ``benchmarks/results/test_durations.json``: every test's seconds (setup + call + teardown,
as the JUnit report sums them) and, with ``--cpu``, its CPU seconds (tests/cpu_clock.py: the test process,
the services it started and every process it ran), the suite's wall time if given, the machine's load before and after,
and prints the 30 slowest.

    python benchmarks/test_durations.py .test-durations.xml [--cpu .test-cpu] [--wall SECONDS] [--top 30]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import sys
import xml.etree.ElementTree as ET

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
README = pathlib.Path(__file__).resolve().parents[1] / "tests" / "README.md"
MARK = "<!-- test durations: written by benchmarks/test_durations.py -->"


def read(xml: str) -> list[dict]:
    """One row per test case: its id (``file::name``), seconds and outcome."""
    rows = []
    for case in ET.parse(xml).getroot().iter("testcase"):
        outcome = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
        path = case.get("classname", "").replace(".", "/") + ".py"
        rows.append({"test": f"{path}::{case.get('name')}", "seconds": float(case.get("time", 0.0)),
                     "outcome": outcome})
    return sorted(rows, key=lambda r: -r["seconds"])


def read_cpu(folder: str) -> dict[str, float]:
    """``{file::name: CPU seconds}`` from the per-process JSON lines of tests/cpu_clock.py."""
    out = {}
    for f in pathlib.Path(folder).glob("*.jsonl"):
        for line in f.read_text().splitlines():
            row = json.loads(line)
            out[row["test"]] = row["cpu_s"]
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("xml")
    ap.add_argument("--wall", type=float, help="the suite's wall time in seconds, as measured by the caller")
    ap.add_argument("--cpu", help="the folder of tests/cpu_clock.py's CPU seconds per test")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--out", default=str(RESULTS / "test_durations.json"))
    ap.add_argument("--readme", default=str(README), help="rewrite the table after this file's marker ('' : none)")
    a = ap.parse_args(argv)
    rows = read(a.xml)
    cpu = read_cpu(a.cpu) if a.cpu else {}
    by_file: dict[str, float] = {}
    cpu_by_file: dict[str, float] = {}
    for r in rows:
        f = r["test"].split("::")[0]
        by_file[f] = by_file.get(f, 0.0) + r["seconds"]
        if r["test"] in cpu:
            r["cpu_s"] = cpu[r["test"]]
            cpu_by_file[f] = cpu_by_file.get(f, 0.0) + r["cpu_s"]
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    from benchmarks.common import cpu_name

    out = {"machine": {"host": platform.node(), "cpu": cpu_name(), "cpu_count": os.cpu_count(),
                       "load_avg_1m_after": os.getloadavg()[0]},
           "wall_s": a.wall, "tests": len(rows), "test_seconds_sum": sum(r["seconds"] for r in rows),
           "outcomes": {o: sum(r["outcome"] == o for r in rows) for o in ("passed", "failure", "error", "skipped")},
           "test_cpu_seconds_sum": sum(cpu_by_file.values()) if cpu else None,
           "by_file": dict(sorted(by_file.items(), key=lambda kv: -kv[1])),
           "cpu_by_file": dict(sorted(cpu_by_file.items(), key=lambda kv: -kv[1])), "rows": rows}
    pathlib.Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"{len(rows)} tests, {out['test_seconds_sum']:.0f} s of test time"
          + (f", {out['test_cpu_seconds_sum']:.0f} CPU s" if cpu else "")
          + (f", {a.wall:.0f} s wall" if a.wall else "") + f"; the {a.top} slowest:")
    for r in rows[:a.top]:
        print(f"  {r['seconds']:7.1f} s  {r.get('cpu_s', float('nan')):7.1f} CPU s  {r['test']}")
    print("wrote", a.out)
    if a.readme:
        write_readme(pathlib.Path(a.readme), out, rows[:a.top])


def write_readme(path: pathlib.Path, out: dict, top: list[dict]) -> None:
    """Replace what follows :data:`MARK` in ``path`` with the run's line and its slowest tests."""
    text = path.read_text()
    head = text.split(MARK)[0].rstrip() + "\n\n" + MARK + "\n\n"
    o = out["outcomes"]
    lines = [f"{out['tests']} tests ({o['passed']} passed, {o['failure'] + o['error']} failed, {o['skipped']} skipped), "
             f"{out['test_seconds_sum']:.0f} s of test time" + (f", {out['wall_s']:.0f} s wall" if out["wall_s"] else "")
             + (f", {out['test_cpu_seconds_sum']:.0f} CPU s" if out["test_cpu_seconds_sum"] else "")
             + f"; load {out['machine']['load_avg_1m_after']:.1f} after the run, {out['machine']['cpu_count']} cores "
             f"({out['machine']['cpu']}).",
             "", "| seconds | CPU s | test |", "|---:|---:|---|"]
    lines += [f"| {r['seconds']:.1f} | {r.get('cpu_s', float('nan')):.1f} | `{r['test']}` |" for r in top]
    path.write_text(head + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
