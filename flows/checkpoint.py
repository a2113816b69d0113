"""Checkpoints of a bundle's training state, so a bundle killed mid-training (a lost worker,
the end of a GPU lease) continues where it was rather than from scratch.

One file per bundle, beside the store (``<store>.checkpoints/<group>/<bundle key>.pt``),
written atomically (temp file + rename), read with ``torch.load(weights_only=True)``, removed
once the bundle's results are stored.
"""

from __future__ import annotations

import os
import pathlib

import torch

from tasks import train


def path_for(store: str, group: str, key: str) -> str:
    return str(pathlib.Path(str(store) + ".checkpoints") / group / f"{key}.pt")


def save(path: str, st: train.TrainState, generators: list[torch.Generator]) -> None:
    payload = train.state_to_dict(st)
    payload["generators"] = [g.get_state() for g in generators]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    torch.save(payload, tmp)
    os.replace(tmp, path)


def load(path: str, device, dtype, generators: list[torch.Generator]) -> train.TrainState | None:
    """The saved state (generators restored in place), or None if there is no checkpoint."""
    if not os.path.exists(path):
        return None
    payload = torch.load(path, map_location="cpu", weights_only=True)
    for g, s in zip(generators, payload.pop("generators")):
        g.set_state(s.clone().contiguous())
    return train.state_from_dict(payload, device, dtype)


def remove(path: str | None) -> None:
    if path and os.path.exists(path):
        os.remove(path)
