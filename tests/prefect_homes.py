"""Fresh Prefect homes with their database already migrated, for the servers a test session starts
(the session's embedded server in each pytest-xdist worker, a killed run's own embedded server, the
served tests' ``prefect server start``). Each needs a ``PREFECT_HOME`` of its own; on an empty one
Prefect first creates its SQLite database by running every Alembic migration. Measured here: a
server's start cost 10.8 CPU s (14.4 s wall) on an empty home and 4.8 CPU s (7.4 s) on a copy of a
migrated one. So the session builds one migrated home, the template, once (the first process to
need it, under a lock the xdist workers share), and every fresh home is a copy of it: the same
database a first start would have made, and a start that still checks it is at the latest
migration (``PREFECT_API_DATABASE_MIGRATE_ON_START`` is left on)."""

from __future__ import annotations

import os
import pathlib
import shutil
import sqlite3
import subprocess
import sys
import tempfile

import filelock

ROOT_VAR = "KKTLAB_TEST_PREFECT_TEMPLATE"  # the template's folder, set once by pytest's main process
FILES = ("prefect.db", "memo_store.toml")  # the migrated database; the block registration's memo
BUILD = ("from prefect.server.api.server import SubprocessASGIServer as S\n"
         "s = S()\ns.start(timeout=120)\ns.stop()\n")


def claim_root() -> None:
    """In pytest's main process: name the folder the template goes to (inherited by the xdist workers,
    which start after this), unless a caller already did."""
    if not os.environ.get(ROOT_VAR):
        os.environ[ROOT_VAR] = tempfile.mkdtemp(prefix="kktlab-prefect-template-")


def release_root() -> None:
    """In pytest's main process, at the end: remove the template."""
    if os.environ.get(ROOT_VAR):
        shutil.rmtree(os.environ[ROOT_VAR], ignore_errors=True)


def template() -> pathlib.Path:
    """The migrated home, built on first use: a server started and stopped once on an empty home, its
    write-ahead log then folded into the database file, so that copying two files copies it."""
    claim_root()
    root = pathlib.Path(os.environ[ROOT_VAR])
    home = root / "home"
    with filelock.FileLock(str(root / "build.lock")):
        if not (home / FILES[0]).exists():
            build = root / "building"
            shutil.rmtree(build, ignore_errors=True)
            build.mkdir(parents=True)
            env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
            subprocess.run([sys.executable, "-c", BUILD], env=dict(env, PREFECT_HOME=str(build)), check=True,
                           capture_output=True, timeout=300)
            db = sqlite3.connect(build / FILES[0])
            try:
                db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            finally:
                db.close()
            build.rename(home)
    return home


def fresh(home) -> pathlib.Path:
    """``home`` (made if missing) holding a copy of the template's migrated database; returns it."""
    home = pathlib.Path(home)
    home.mkdir(parents=True, exist_ok=True)
    source = template()
    for name in FILES:
        if (source / name).exists() and not (home / name).exists():
            shutil.copyfile(source / name, home / name)
    return home
