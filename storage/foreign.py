"""A store path kktlab may write to: absent, empty, or a store kktlab made (never another program's
Zarr store: issue 29 item 7)."""

from __future__ import annotations

import pathlib

from core.errors import StoreError


def check_kktlab_store(path: str | pathlib.Path) -> None:
    """``path`` is absent, an empty folder, or a kktlab store: a Zarr v3 group whose attributes and
    sub-nodes are kktlab's (each sub-group carries ``kktlab_identity``). Anything else (a file, a
    folder of other files, a Zarr v2 store, a Zarr array, another program's Zarr groups or arrays)
    raises :class:`StoreError` in one line: kktlab never adds its groups to a store it did not make."""
    path = pathlib.Path(path)
    if not path.exists():
        return
    if not path.is_dir():
        raise StoreError(f"store path {path} exists and is not a directory")
    meta = path / "zarr.json"
    if not meta.is_file():
        if (path / ".zgroup").exists() or (path / ".zarray").exists():
            raise StoreError(f"store path {path} is a Zarr v2 store, not a kktlab store; use another --store")
        if any(path.iterdir()):
            raise StoreError(f"store path {path} is a non-empty directory that is not a Zarr store")
        return
    foreign = f"store path {path} is a Zarr store that kktlab did not write"
    doc = _json_doc(meta, path)
    if doc.get("node_type") != "group" or doc.get("zarr_format") != 3:
        raise StoreError(f"{foreign} (its root is a Zarr {doc.get('node_type', '?')}, not a v3 group); "
                         "use another --store")
    theirs = [str(k) for k in doc.get("attributes") or {} if not str(k).startswith("kktlab")]
    if theirs:
        raise StoreError(f"{foreign} (its root has attributes {', '.join(theirs)[:100]}); use another --store")
    for sub in sorted(q for q in path.iterdir() if q.is_dir() and not q.name.startswith(".")):
        if not (sub / "zarr.json").is_file():
            continue  # a group folder without metadata: judged where groups are found (storage/verify.py)
        node = _json_doc(sub / "zarr.json", path)
        if node.get("node_type") != "group" or "kktlab_identity" not in (node.get("attributes") or {}):
            raise StoreError(f"{foreign} ('{sub.name}' is a Zarr {node.get('node_type', '?')} without kktlab's "
                             "identity); use another --store")


def _json_doc(meta: pathlib.Path, store: pathlib.Path) -> dict:
    """The JSON object in ``meta``; one line naming the store when it is unreadable."""
    from storage.verify import _read_json

    return _read_json(meta, f"store {store} (use another --store)")
