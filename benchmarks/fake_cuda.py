"""A stand-in for CUDA on a CPU-only machine, for one question asked before a GPU session: does a
code path mix devices? On a GPU a CPU tensor meeting a CUDA tensor raises ("Expected all tensors to
be on the same device"), and a CUDA tensor turned into numpy raises; on a CPU nothing does, so a
chain that passes every CPU test can still fail every cell of a one-shot GPU run (issue 46).

Under :class:`FakeCuda` (a ``TorchFunctionMode``, per thread) tensors still live on the CPU, but those
made "on cuda" (``device="cuda"`` or a CUDA tensor's ``.device``, ``.to("cuda")``, ``.cuda()``) carry a
mark, and the mark follows every op: ``t.device`` says ``cuda:0``, ``t.is_cuda`` True, ``.cpu()`` /
``.to("cpu")`` drop it, and an op whose tensors mix a marked one with an unmarked one of more than
zero dims raises as CUDA would (a 0-dim CPU tensor is a scalar there too), as do ``.numpy()`` and
``np.asarray`` of a marked tensor, indexing a CPU tensor with CUDA indices and a CPU generator drawing
on CUDA. ``torch.cuda.is_available()`` says True. It does not model CUDA's numerics (TF32, lstsq's
only driver ``gels``), streams or memory.

    python benchmarks/fake_cuda.py CONFIG --store /tmp/s.zarr [--json stats.json]

runs ``kktlab run CONFIG`` in this process with ``runner.cluster: inline`` and ``runner.device: cuda``,
every experiment's ``run_bundle`` under the stand-in, and lists every device mix it met (the flow
stores a failed cell; this prints where it came from). Exit status 0 only when none was met and no
cell failed.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile
import threading
import traceback

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch.overrides import TorchFunctionMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

MARK = "_fake_cuda"
MET: list[str] = []  # every device mix met, with where (first few project frames)
_LOCK = threading.Lock()
CROSS = {"copy_", "__setitem__", "to", "cpu", "cuda", "numpy", "__array__", "__getitem__", "tolist", "item",
         "__float__", "__int__", "__bool__", "__index__", "__len__", "__repr__", "__format__", "__reduce_ex__"}


def marked(t) -> bool:
    return isinstance(t, torch.Tensor) and bool(getattr(t, MARK, False))


def _mark(out, on: bool = True):
    for t in tree_flatten(out)[0]:
        if isinstance(t, torch.Tensor):
            try:
                setattr(t, MARK, on)
            except (AttributeError, RuntimeError):
                pass
    return out


def _is_cuda(dev) -> bool:
    if isinstance(dev, torch.device):
        return dev.type == "cuda"
    if isinstance(dev, str):
        return dev.startswith("cuda")
    return isinstance(dev, int) and not isinstance(dev, bool)


def _where() -> str:
    root = str(pathlib.Path(__file__).resolve().parents[1])
    frames = [f for f in traceback.extract_stack()[:-3] if f.filename.startswith(root) and "fake_cuda" not in f.filename]
    return " <- ".join(f"{pathlib.Path(f.filename).relative_to(root)}:{f.lineno} {f.line}" for f in frames[::-1][:4])


def _fail(msg: str):
    where = _where()
    with _LOCK:
        MET.append(f"{msg}\n    at {where}")
    raise RuntimeError(f"[fake cuda] {msg} (at {where})")


class FakeCuda(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", "")
        prop = getattr(func, "__self__", None)  # a property's getter: the descriptor's method-wrapper
        if prop is torch.Tensor.device:
            return torch.device("cuda", 0) if marked(args[0]) else func(*args, **kwargs)
        if prop is torch.Tensor.is_cuda:
            return marked(args[0])
        if name == "__get__":  # any other property (shape, grad, data, T, ...): the mark follows
            out = func(*args, **kwargs)
            return _mark(out) if marked(args[0]) and isinstance(out, torch.Tensor) else out
        if name in ("numpy", "__array__") and marked(args[0]):
            _fail(f"{name}() of a CUDA tensor (can't convert cuda:0 device type tensor to numpy)")
        if name == "cpu":
            out = func(*args, **kwargs)
            return _mark(out.clone() if out is args[0] and marked(out) else out, False)
        if name == "cuda":  # (the real one asserts on a CPU build)
            return _mark(args[0].clone())
        if name == "to":
            return self._to(func, args, kwargs)
        want = False
        if "device" in kwargs:
            want = _is_cuda(kwargs["device"])
            if want:
                kwargs["device"] = "cpu"
                g = kwargs.get("generator")
                if isinstance(g, torch.Generator) and g.device.type == "cpu":
                    _fail(f"{name}: a CPU generator drawing on cuda")
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        on = [marked(t) for t in tensors]
        if name == "__getitem__":
            if not marked(args[0]) and any(on[1:]):
                _fail("indexing a CPU tensor with CUDA indices")
        elif any(on) and name not in CROSS:
            cpu = [t for t, m in zip(tensors, on) if not m and t.dim() > 0]
            if cpu:
                _fail(f"{name}: a CPU tensor of shape {tuple(cpu[0].shape)} meets a CUDA tensor "
                      "(Expected all tensors to be on the same device)")
        out = func(*args, **kwargs)
        if want or (any(on) and name not in ("tolist", "item", "__float__", "__int__", "__bool__", "__index__")):
            # an op writing into a CPU 0-dim tensor (``out=``, in place) stays on the CPU
            if not (isinstance(out, torch.Tensor) and tensors and out is tensors[0] and not on[0]):
                _mark(out)
        return out

    def _to(self, func, args, kwargs):
        self_t, rest = args[0], list(args[1:])
        target = None
        for i, a in enumerate(rest):
            if isinstance(a, torch.Tensor):
                target = marked(a)
                rest[i] = a.dtype
            elif isinstance(a, (str, torch.device)) or (isinstance(a, int) and not isinstance(a, bool)):
                target = _is_cuda(a)
                rest[i] = "cpu"
        if "device" in kwargs:
            target = _is_cuda(kwargs["device"])
            kwargs["device"] = "cpu"
        out = func(self_t, *rest, **kwargs)
        if target is None:  # a dtype change: the mark follows
            return _mark(out) if marked(self_t) and out is not self_t else out
        if target != marked(self_t) and out is self_t:
            out = out.clone()
        return _mark(out, target)


_PATCHED = {"is_available": lambda: True, "device_count": lambda: 1, "synchronize": lambda *a, **k: None,
            "get_device_name": lambda *a, **k: "fake CUDA (benchmarks/fake_cuda.py)",
            "mem_get_info": lambda *a, **k: (64 << 30, 80 << 30), "max_memory_allocated": lambda *a, **k: 0,
            "max_memory_reserved": lambda *a, **k: 0, "memory_allocated": lambda *a, **k: 0,
            "reset_peak_memory_stats": lambda *a, **k: None, "empty_cache": lambda *a, **k: None,
            "current_device": lambda: 0}


def patch_torch_cuda() -> None:
    """torch.cuda says a device is there (in this process)."""
    for k, fn in _PATCHED.items():
        setattr(torch.cuda, k, fn)


def wrap_experiments() -> None:
    """Every registered experiment's run_bundle under :class:`FakeCuda` (in whatever thread runs it)."""
    import functools

    from flows import experiments

    for name in experiments.names():
        exp = experiments.get(name)
        inner = exp.run_bundle

        @functools.wraps(inner)
        def run(*a, _inner=inner, **k):
            with FakeCuda():
                return _inner(*a, **k)

        object.__setattr__(exp, "run_bundle", run)


def self_test() -> None:
    """The stand-in raises where CUDA would and passes what CUDA allows."""
    with FakeCuda():
        a = torch.ones(3, device="cuda")
        assert a.device.type == "cuda" and a.is_cuda and not torch.ones(3).is_cuda
        b = (a * 2 + torch.tensor(1.0)).sum()  # a 0-dim CPU tensor is a scalar
        assert b.is_cuda and not a.cpu().is_cuda and not a.to("cpu").is_cuda and a.to(torch.float64).is_cuda
        assert torch.zeros(2, device=a.device).is_cuda and a[torch.tensor([0, 1])].is_cuda
        for bad in (lambda: a + torch.ones(3), lambda: a.numpy(), lambda: torch.ones(3)[torch.tensor([0]).cuda()],
                    lambda: torch.stack([a, torch.ones(3)])):
            try:
                bad()
            except RuntimeError:
                continue
            raise AssertionError("the stand-in let a device mix pass")
    MET.clear()


def main(argv=None) -> int:
    import yaml

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--store", required=True)
    ap.add_argument("--json", help="the run's statistics (kktlab run --json)")
    a = ap.parse_args(argv)
    self_test()
    patch_torch_cuda()
    wrap_experiments()
    raw = yaml.safe_load(pathlib.Path(a.config).read_text())
    raw.setdefault("runner", {}).update(cluster="inline", device="cuda")
    cfg = pathlib.Path(tempfile.mkdtemp(prefix="fake_cuda_")) / pathlib.Path(a.config).name
    cfg.write_text(yaml.safe_dump(raw, sort_keys=False))
    stats = a.json or str(cfg.with_suffix(".json"))
    from kktlab import cli

    rc = cli.main(["run", str(cfg), "--store", a.store, "--json", stats])
    failed = sum(g.get("failed", 0) for g in json.loads(pathlib.Path(stats).read_text()))
    print(f"\n[fake cuda] kktlab run rc={rc}, failed cells {failed}, device mixes met {len(MET)}")
    for m in dict.fromkeys(MET):  # each distinct place once
        print("  " + m)
    return 0 if rc == 0 and not failed and not MET else 1


if __name__ == "__main__":
    sys.exit(main())
