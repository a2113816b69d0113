"""kktlab: Prefect + Dask + Zarr workflows for the implicit-bias papers (see README.md)."""

import os

# before anything imports torch (MKL reads it once, when it loads): cells bit-identical however
# they are bundled (deploy/runtime.py QUIET_ENV; the user's own setting wins)
os.environ.setdefault("MKL_CBWR", "AVX2,STRICT")

__version__ = "0.1.0"


def load_nets(path, group: str, **sel):
    """The stored nets of ``group`` for the cells matching ``sel`` (dim=value or dim=[values]) as
    :class:`storage.nets.Nets`, with what their producing experiment kept out of the store rebuilt
    (training rows from indices + checksum, W0 from the seed): :func:`storage.query.load_nets`
    with that experiment's ``rebuild``, and each net's contract (``nets.contracts``: trained blocks,
    output layer, forgotten points; flows/contracts.py)."""
    from flows import experiments
    from flows.contracts import contracts_at
    from storage.nets import producer, select_indices
    from storage.query import load_nets as load

    nets = load(path, group, rebuild=experiments.get(producer(path, group)).rebuild, **sel)
    nets.contracts = contracts_at(path, group, select_indices(path, group, sel))
    return nets


def table(path, group: str | None = None, **kw):
    """One table of ``group``'s usable cells as a pandas DataFrame (what ``kktlab table`` prints):
    ``vars``, ``by``, ``over``, ``stat``, ``where`` as in :func:`storage.table.table`."""
    from storage.table import table as make

    return make(path, group, **kw)
