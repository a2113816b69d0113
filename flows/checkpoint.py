"""Checkpoints of a bundle's training state, so a bundle killed mid-training (a lost worker,
the end of a GPU lease) continues where it was rather than from scratch.

One file per bundle, beside the store (``<store>.checkpoints/<group>/<bundle key>.pt``),
written atomically (temp file + rename), read with ``torch.load(weights_only=True)``, removed
once the bundle's results are stored.
"""

from __future__ import annotations

import os
import pathlib
from typing import Callable

import torch

from flows import result_cache
from tasks import train


def path_for(store: str, group: str, key: str) -> str:
    return str(pathlib.Path(str(store) + ".checkpoints") / group / f"{key}.pt")


EXTRA = "extra_"  # prefix of the optional tensors saved beside a state (e.g. train's logged trajectory)


def save(path: str, st: train.TrainState, generators: list[torch.Generator],
         extra: dict[str, torch.Tensor] | None = None) -> None:
    payload = train.state_to_dict(st)
    payload["generators"] = [g.get_state() for g in generators]
    payload.update({EXTRA + k: t.detach().cpu() for k, t in (extra or {}).items()})
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    torch.save(payload, tmp)
    os.replace(tmp, path)
    from flows import bundle_progress

    bundle_progress.current().checkpointed()  # its time in the bundle's progress file (issue 30)


def load(path: str, device, dtype, generators: list[torch.Generator],
         check: Callable[[train.TrainState], None] | None = None,
         extra: dict | None = None) -> train.TrainState | None:
    """The saved state (generators restored in place), or None if there is no usable checkpoint;
    ``extra`` (a dict) receives the tensors saved with ``save(extra=...)``.

    A file that cannot be read with ``weights_only=True`` (garbage, a pickle with code, a state
    of other shapes) or whose state fails ``check`` (e.g. a net marked converged whose loss is
    above the target) is never retried: it is moved aside as ``<file>.bad-<time>`` with a
    warning that names it, and the bundle starts from scratch (issue 12 item 7)."""
    if not os.path.exists(path):
        return None
    saved = [g.get_state() for g in generators]
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(payload, dict):
            raise ValueError(f"holds a {type(payload).__name__}, not a training state")
        states = payload.pop("generators")
        saved_extra = {k[len(EXTRA):]: payload.pop(k) for k in list(payload) if k.startswith(EXTRA)}
        if len(states) != len(generators):
            raise ValueError(f"has {len(states)} generator states for a bundle of {len(generators)}")
        for g, s in zip(generators, states):
            g.set_state(s.clone().contiguous())
        st = train.state_from_dict(payload, device, dtype)
        if check is not None:
            check(st)
        if extra is not None:
            extra.update(saved_extra)
        return st
    except Exception as err:  # noqa: BLE001 - whatever is wrong with the file, it is not used
        for g, s in zip(generators, saved):
            g.set_state(s)
        quarantine(path, f"{type(err).__name__}: {str(err).splitlines()[0][:300] if str(err) else ''}")
        return None


def quarantine(path: str, why: str) -> str:
    bad = result_cache.set_aside(path)
    print(f"[kktlab] warning: checkpoint {path} is unusable ({why}); moved to {bad}, "
          "the bundle restarts from scratch", flush=True)
    return bad


def remove(path: str | None) -> None:
    if path and os.path.exists(path):
        os.remove(path)
