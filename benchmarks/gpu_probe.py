"""What every JSON of a GPU session records beside its numbers (issue 46): the device, its clocks as
nvidia-smi reads them, the torch / CUDA versions and the peak device memory; plus a JSON writer
that never leaves a half-written file (the session's steps run under ``timeout``).

    from benchmarks.gpu_probe import env_info, nvidia_smi, write_json
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import platform
import subprocess

import torch

SMI_FIELDS = ("name", "driver_version", "pstate", "clocks.sm", "clocks.mem", "clocks.max.sm", "clocks.max.mem",
              "clocks.applications.graphics", "power.draw", "power.limit", "temperature.gpu", "utilization.gpu",
              "memory.used", "memory.total", "clocks_event_reasons.active")


def nvidia_smi(fields=SMI_FIELDS, timeout_s: float = 10.0) -> dict:
    """One reading of ``nvidia-smi --query-gpu`` (first GPU): field -> string, or {"error": ...}.
    A field this driver does not know is read alone and left out (one unknown field fails the
    whole query)."""
    def query(names):
        out = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(names)}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=timeout_s)
        if out.returncode != 0:
            raise RuntimeError((out.stderr or out.stdout).strip()[:200])
        return [v.strip() for v in out.stdout.splitlines()[0].split(",")]

    try:
        return dict(zip(fields, query(fields)))
    except FileNotFoundError:
        return {"error": "nvidia-smi not found"}
    except Exception:  # noqa: BLE001 - some field unknown: one by one
        res = {}
        for f in fields:
            try:
                res[f] = query([f])[0]
            except Exception as exc:  # noqa: BLE001
                res.setdefault("unknown_fields", []).append(f"{f}: {str(exc)[:80]}")
        return res


def env_info(device: str = "cuda") -> dict:
    """Device and versions: python, torch, CUDA, cuBLAS-relevant flags, the GPU's name and size."""
    info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "host": platform.node(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "device": device, "allow_tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
            "float32_matmul_precision": torch.get_float32_matmul_precision()}
    if device.startswith("cuda") and torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, gpu_total_gib=round(p.total_memory / 2**30, 2), sm_count=p.multi_processor_count,
                    capability=f"{p.major}.{p.minor}", cudnn=torch.backends.cudnn.version())
        try:
            info["l2_cache_mb"] = round(p.L2_cache_size / 2**20, 1)
        except AttributeError:
            pass
    return info


def peak_memory(device: str = "cuda") -> dict:
    if device.startswith("cuda") and torch.cuda.is_available():
        return {"peak_gpu_mb": torch.cuda.max_memory_allocated() / 2**20,
                "peak_gpu_reserved_mb": torch.cuda.max_memory_reserved() / 2**20}
    return {}


def write_json(path, name: str, payload: dict, device: str = "cuda", smi: bool = True) -> pathlib.Path:
    """``payload`` with the benchmark's name, the time, env_info, a fresh nvidia-smi reading
    (``smi_at_write``, where there is a GPU) and the peak memory, written atomically to ``path``."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"benchmark": name, "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "env": env_info(device), **peak_memory(device), **payload}
    if smi and device.startswith("cuda"):
        body["smi_at_write"] = nvidia_smi()
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(body, indent=2, default=str))
    os.replace(tmp, path)
    return path


def main(argv=None) -> None:
    """The session's info step: env_info, nvidia-smi, where kktlab's dependencies import from, and a
    first CUDA call (its latency), into one JSON."""
    import argparse
    import importlib
    import importlib.metadata as md
    import time

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--out", required=True, help="JSON path")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args(argv)
    pk = {}
    for name, dist in (("zarr", "zarr"), ("numcodecs", "numcodecs"), ("google_crc32c", "google-crc32c"),
                       ("xarray", "xarray"), ("numpy", "numpy"), ("scipy", "scipy"), ("pandas", "pandas"),
                       ("prefect", "prefect"), ("dask", "dask"), ("distributed", "distributed"),
                       ("dask_cuda", "dask-cuda"), ("triton", "triton"), ("torchmetrics", "torchmetrics"),
                       ("yaml", "pyyaml")):
        try:
            mod = importlib.import_module(name)
            try:
                ver = md.version(dist)
            except md.PackageNotFoundError:
                ver = getattr(mod, "__version__", "?")
            pk[name] = f"{ver} {getattr(mod, '__file__', '?')}"
        except Exception as exc:  # noqa: BLE001 - report and go on
            pk[name] = f"IMPORT FAILED: {type(exc).__name__}: {str(exc)[:120]}"
    payload = {"packages": pk, "smi": nvidia_smi() if a.device.startswith("cuda") else None}
    if a.device.startswith("cuda") and torch.cuda.is_available():
        t = time.perf_counter()
        x = torch.randn(1024, 1024, device="cuda")
        (x @ x).sum().item()
        payload["first_cuda_call_s"] = time.perf_counter() - t
    path = write_json(a.out, "gpu_info", payload, a.device)
    print(json.dumps({k: v for k, v in json.loads(path.read_text()).items() if k != "packages"}, indent=1))
    for k, v in pk.items():
        print(f"  {k:14s} {v}")


if __name__ == "__main__":
    main()
