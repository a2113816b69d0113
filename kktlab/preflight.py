"""Checks of the paths and groups a command will write, before any store, server or cluster exists:
each failure is one :class:`UserError` naming the option or field and the path."""

from __future__ import annotations

import json
import os
import pathlib
import tempfile

from core.errors import UserError


def _nearest_existing(path: pathlib.Path) -> pathlib.Path:
    for p in (path, *path.parents):
        if p.exists():
            return p
    return pathlib.Path(".")


def _writable(folder: pathlib.Path) -> bool:
    """A real write probe (``os.access`` says yes to root on read-only mounts and to anyone on
    some network file systems)."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            return True
    except OSError:
        return False


def folder_for_writing(path: str | pathlib.Path, what: str) -> None:
    """``path`` is, or can be made as, a writable folder (a store, ``report --out``)."""
    path = pathlib.Path(path)
    if not str(path).strip():
        raise UserError(f"{what} is empty: give a path")
    short_names(path, what)
    base = _nearest_existing(path)
    if not base.is_dir():
        where = "is a file" if base == path else f"lies under {base}, which is a file"
        raise UserError(f"{what} {path} {where}, not a folder")
    if not _writable(base):
        where = "is read-only" if base == path else f"cannot be made: folder {base} is read-only"
        raise UserError(f"{what} {path} {where}")
    if base == path and path.parent.exists() and not _writable(path.parent):  # store locks live beside it
        raise UserError(f"{what} {path}: its folder {path.parent} is read-only (cannot write the lock file)")


STORE_SUFFIX = ".checkpoints"  # the longest of the folders and files made beside a store (.cache, .lock, .partial)


def _name_max(path: pathlib.Path) -> int:
    """The longest file name (bytes) the file system under ``path`` takes (255 where it won't say)."""
    base = next((p for p in (path, *path.parents) if os.path.exists(p)), pathlib.Path("."))
    try:
        return os.pathconf(base, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def short_names(path: str | pathlib.Path, what: str, suffix: str = "") -> None:
    """Every component of ``path`` (its last one with ``suffix``) fits the file system's limit on a
    file name (else the store would fail with "File name too long" after work began)."""
    path = pathlib.Path(path)
    limit = _name_max(path)
    for i, part in enumerate(path.parts):
        size = len(part.encode("utf-8", "surrogateescape")) + (len(suffix) if i == len(path.parts) - 1 else 0)
        if size > limit:
            extra = f" with '{suffix}' (the folders made beside it)" if i == len(path.parts) - 1 and suffix else ""
            raise UserError(f"{what} {str(path)[:60]}...: the name {part[:20]}... is {size} bytes{extra}; "
                            f"a file name is at most {limit} bytes here")


def store(path: str, what: str = "store") -> None:
    """A results store can be created or written at ``path``; the group folders of an existing
    store are probed too (a store made read-only)."""
    if str(path).strip():
        short_names(path, what, STORE_SUFFIX)
    folder_for_writing(path, what)
    p = pathlib.Path(path)
    for group in sorted(q for q in p.iterdir() if q.is_dir()) if p.is_dir() else ():
        if not _writable(group):
            raise UserError(f"{what} {path} is read-only (cannot write group {group.name})")


def file_for_writing(path: str, what: str) -> None:
    """``path`` can be written as a file: its folder exists and is writable, it is not a folder."""
    p = pathlib.Path(path)
    if not str(path).strip():
        raise UserError(f"{what} is empty: give a file path")
    short_names(p, what)
    if p.is_dir():
        raise UserError(f"{what} {path} is a folder; give a file path")
    folder = p.parent
    if not folder.exists():
        raise UserError(f"{what} {path}: folder {folder} does not exist")
    if not folder.is_dir():
        raise UserError(f"{what} {path}: {folder} is a file, not a folder")
    if not _writable(folder):
        raise UserError(f"{what} {path}: folder {folder} is read-only")


def group(stage, store: str, planned: dict, field: str = "") -> None:
    """Refuse, without making anything, a stage whose group exists in ``store`` with another
    experiment, source, grid or params (what :meth:`Store.open_or_create` would refuse), or that
    an earlier config of this run writes with another identity (``planned``); ``field``: the
    stage's prefix in a chain (``stages[1].``), put before the config field a refusal names."""
    from core.errors import StoreError
    from storage.store import Store

    exp = stage.exp
    stored = Store(store, stage.name)
    ident = stored.identity(exp, stage.store_grid, stage.params, stage.cases, stage.source)
    key = (os.path.realpath(store), stage.name)
    text = json.dumps(ident, sort_keys=True, default=str)
    if planned.setdefault(key, text) != text:
        raise UserError(f"two of the configs write group '{stage.name}' of store {store} with other experiments, "
                        "grids or params; give one of them another name or store")
    if os.path.exists(os.path.join(store, stage.name, "zarr.json")):
        try:
            stored.check_identity(ident, {k: p.default for k, p in exp.params.items()}, set(exp.inherits))
        except StoreError as err:
            raise StoreError(str(err).replace("config field '", f"config field '{field}", 1)) from None
