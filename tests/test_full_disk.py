"""A full disk under a run (issue 29 item 10): the run ends in one line naming the store and what to
do, with no traceback and no cell marked done that was not stored; after space is freed the same
command resumes and finishes. The store sits on a 2 MB tmpfs mounted for the test (skipped where
mounting is not allowed)."""

from __future__ import annotations

import os
import subprocess

import pytest

from storage.query import status

CFG = {"experiment": "train", "name": "full", "grid": {"seed": {"range": [0, 12]}},
       "params": {"d": 400, "m": 10, "width": 128, "target_loss": 1.0e-3, "max_iters": 100},
       "runner": {"workers": 1, "bundle_size": 4}}  # ~400 kB of nets a cell, trained or not: the disk fills after a few


@pytest.fixture
def tiny_disk(tmp_path):
    where = tmp_path / "tiny"
    where.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where)], capture_output=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.decode().strip()[:200]}")
    yield where
    subprocess.run(["umount", "-l", str(where)], capture_output=True)


@pytest.mark.requires_services
def test_a_full_disk_ends_the_run_in_one_line_and_the_rerun_resumes(cli, prefect_server, write_config, tiny_disk,
                                                                    tmp_path):
    path, store = write_config(CFG), tiny_disk / "s.zarr"
    env = {"PREFECT_HOME": str(tmp_path / "home")}  # a process of its own: its exit status, every line it prints
    res = cli.run("run", path, "--store", store, env=env, timeout=600)
    assert res.returncode == 2, res.stderr[-3000:]
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("kktlab: error:")]
    assert len(errors) == 1 and str(store) in errors[0] and "no space left on device" in errors[0], res.stderr[-3000:]
    assert "rerun the same command" in errors[0] and "Traceback" not in res.stderr
    done = status(store)[0]["done"]
    assert 0 < done < 12 and f"full: {done}/12" in errors[0]
    verify = cli.run("verify", store, timeout=300)
    assert verify.returncode == 0, verify.stdout + verify.stderr  # nothing marked done that is not stored
    subprocess.run(["mount", "-o", "remount,size=64m", str(tiny_disk)], check=True)  # space freed
    again = cli.run("run", path, "--store", store, timeout=600)  # in this process, on the session's services
    assert again.returncode == 0, again.stderr[-3000:]
    assert status(store)[0]["done"] == 12 and os.path.isdir(store)
