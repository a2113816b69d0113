"""Shared benchmark helpers: device description, versions, peak memory, JSON output."""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import platform
import resource
import time

import torch

RESULTS = pathlib.Path(__file__).resolve().parent / "results"


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo): timings of one suite differ ~2x between the AMD EPYC and
    the Intel Xeon machines this project has run on, so every timing names its CPU."""
    info = pathlib.Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.exists() else []
    names = [ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")]
    return names[0] if names else (platform.processor() or platform.machine())


def device_info(device: str = "cpu") -> dict:
    info = {"device": device, "host": platform.node(), "machine": platform.machine(),
            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "cpu": cpu_name()}
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    try:
        info["load_avg_1m"] = os.getloadavg()[0]
    except OSError:
        pass
    return info


def versions() -> dict:
    import numpy

    return {"python": platform.python_version(), "torch": torch.__version__, "numpy": numpy.__version__}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, device: str = "cpu") -> tuple[float, object]:
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - t0, out


def write(name: str, payload: dict, device: str = "cpu") -> pathlib.Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    body = {"benchmark": name, "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": device_info(device), "versions": versions(), "peak_rss_mb": peak_rss_mb(), **payload}
    if device.startswith("cuda") and torch.cuda.is_available():
        body["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
    suffix = "" if device == "cpu" else "_" + device.replace(":", "")
    path = RESULTS / f"{name}{suffix}.json"
    path.write_text(json.dumps(body, indent=2, default=str))
    return path
