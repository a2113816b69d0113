"""What an experiment declares: its parameters, the variables it stores, how its cells bundle.

Imported by ``flows/`` (the registry, config parsing, the sweep) and by ``storage/`` (the schema
of a group), so it lives below both."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

REQUIRED = object()
# Limits on every number a config gives, beside a Param's own bounds: floats must be finite and
# at most FLOAT_LIMIT in size (squares and products stay finite in float64); ints at most
# INT_LIMIT (exact in float64 and JSON, fits int64 coordinates).
FLOAT_LIMIT = 1e100
INT_LIMIT = 2**53


@dataclasses.dataclass(frozen=True)
class Param:
    """One experiment parameter: type, default, allowed values, bounds, doc."""

    type: type
    default: Any = REQUIRED
    doc: str = ""
    choices: tuple | None = None
    min: float | None = None  # inclusive lower bound
    gt: float | None = None  # exclusive lower bound
    max: float | None = None  # inclusive upper bound

    def limit(self) -> float | None:
        """The largest allowed magnitude: ``max`` if declared, else the generic limit of the type."""
        if self.max is not None:
            return self.max
        return {float: FLOAT_LIMIT, int: INT_LIMIT}.get(self.type)

    def allowed(self) -> str:
        if self.choices is not None:
            return "one of " + ", ".join(map(repr, self.choices))
        num = lambda x: f"{x:g}" if isinstance(x, float) else str(x)  # noqa: E731
        parts = [self.type.__name__]
        if self.gt is not None:
            parts.append(f"> {num(self.gt)}")
        if self.min is not None:
            parts.append(f">= {num(self.min)}")
        if self.max is not None:
            parts.append(f"<= {num(self.max)}")
        return " ".join(parts)


@dataclasses.dataclass(frozen=True)
class Var:
    """One stored variable. ``dims`` are extra (non-grid) dims, e.g. ``("sample",)``."""

    units: str
    description: str
    dtype: str = "float64"
    dims: tuple[str, ...] = ()
    # For a status variable: the values that mark a usable cell (figures, summaries and acceptance
    # tables keep done cells whose status is one of these); stored as the array attribute ``ok_values``.
    ok: tuple[int, ...] = ()
    # True if every done cell's value is finite (ints: never the fill -1), e.g. a wall time or a status;
    # `kktlab verify` flags a done cell where it is not. Leave False where NaN / inf can be a result.
    finite: bool = False
    # What is stored past a cell's true size along the extra dims (e.g. 0.0: zero-padded nets);
    # None: the fill value (NaN, -1). An empty value (size 0) is "not stored": all fill.
    pad: float | None = None
    # For a status variable: a name per value (e.g. ((1, "done"), (2, "diverged"))), for the counts of
    # cells left out by status that `kktlab status` and the run summary print.
    labels: tuple[tuple[int, str], ...] = ()
    # The values the quantity can take, (min, max), None where unbounded (e.g. (0.0, None) for a norm or
    # an ε): stored as the CF attributes valid_min / valid_max; an interval is clipped to it, nothing else
    # is (storage/stats.py).
    domain: tuple[float | None, float | None] | None = None


NONNEG = (0.0, None)  # a norm, a distance, an ε, an objective, a count, a time
FRACTION = (0.0, 1.0)  # a proportion of points or nets, an accuracy, a 0/1 flag
COSINE = (-1.0, 1.0)  # a cosine, a correlation, an SSIM


def with_domain(V: dict[str, Var], domain: tuple[float | None, float | None], *names: str) -> None:
    """Declare ``domain`` (:attr:`Var.domain`) for the variables ``names`` of ``V``, in place (issue 40:
    an interval of a quantity that cannot be negative stops at 0). A name ``V`` lacks is a KeyError."""
    for name in names:
        V[name] = dataclasses.replace(V[name], domain=domain)


Cell = dict[str, Any]
Result = dict[str, Any]  # variable name -> scalar or numpy array of the var's extra dims

# --- the nets contract: what a producer's cells hand a reading stage (ARCHITECTURE "Stages") ------
BLOCKS = ("W", "b", "v")  # f(x) = sum_j v_j relu(w_j . x + b_j): the parameter blocks a net may train
NET_ARRAYS = ("W", "b", "v", "X", "y")  # every stored net carries these (b, v zero / fixed where untrained)


@dataclasses.dataclass(frozen=True)
class NetsContract:
    """What one producer cell's stored net is: the arrays beside W, b, v, X, y (``W0``/``b0`` the
    init, ``X_test``/``y_test`` a test set, ``forgotten`` the training points an unlearn stage
    removed), which blocks were trained (paper 001: W; paper 003: W, and b when the variant has a
    bias; paper 004 / 002: W, b, v), the output layer (``trained``, or ``frozen``: fixed ±1/√width,
    paper 001's u and paper 003's a/√m), the experiment that trained it and its data distribution."""

    arrays: frozenset = frozenset()
    trained: frozenset = frozenset(BLOCKS)
    output: str = "trained"  # "trained" | "frozen"
    trainer: str = ""
    data: str = ""
    single: bool = True  # False: the cell measured many nets and stores none (unlearn's forget = -2)
    fixed: frozenset = frozenset()  # blocks held at a non-zero value without training (adv_train's bias)

    def describe(self) -> str:
        arrays = ", ".join(sorted(self.arrays)) or "no test set, init or forgotten indices"
        fixed = "".join(f", {b} fixed non-zero" for b in BLOCKS if b in self.fixed)
        return (f"nets of '{self.trainer}' (trained {'+'.join(b for b in BLOCKS if b in self.trained)}{fixed}, "
                f"output {self.output}; {arrays})")


@dataclasses.dataclass(frozen=True)
class NetsNeeds:
    """What a reading cell needs of the nets it reads; :meth:`refusal` says why a contract fails it."""

    arrays: frozenset = frozenset()  # beyond W, b, v, X, y
    trained: tuple[frozenset, ...] = ()  # the trained-block sets it can handle (empty: any)
    output: str = ""  # "frozen" / "trained"; empty: either
    trainers: frozenset = frozenset()  # only nets of these experiments (empty: any)
    data: frozenset = frozenset()  # only nets trained on these data sets (empty: any)
    without: frozenset = frozenset()  # arrays the nets must not carry (e.g. unlearn: nothing forgotten yet)
    unfixed: frozenset = frozenset()  # blocks that must be trained or zero, never fixed non-zero (unlearn: b)
    why: str = ""  # what the reader does that needs it, for the message

    def refusal(self, c: NetsContract) -> str:
        """'' if a net of contract ``c`` serves, else one line saying what is missing."""
        why = f" ({self.why})" if self.why else ""
        if not c.single:
            return "its cells store no single net (unlearn's forget: -2 measures every l; use forget >= -1)"
        missing = sorted(self.arrays - c.arrays)
        if missing:
            return f"needs {', '.join(missing)}{why}, which {c.describe()} do not store"
        present = sorted(self.without & c.arrays)
        if present:
            return f"needs nets without {', '.join(present)}{why}; {c.describe()}"
        if self.trained and c.trained not in self.trained:
            want = " or ".join("+".join(b for b in BLOCKS if b in t) for t in self.trained)
            return f"needs nets that trained {want}{why}; {c.describe()}"
        held = sorted(self.unfixed & c.fixed)
        if held:
            return f"needs {', '.join(held)} trained or absent, not held fixed at a non-zero value{why}; {c.describe()}"
        if self.output and c.output != self.output:
            return f"needs a {self.output} output layer{why}; {c.describe()}"
        if self.trainers and c.trainer not in self.trainers:
            return f"needs nets of {' or '.join(sorted(self.trainers))}{why}; {c.describe()}"
        if self.data and c.data not in self.data:
            return f"needs nets trained on data {' or '.join(sorted(self.data))}{why}; {c.describe()} used {c.data!r}"
        return ""


@dataclasses.dataclass(frozen=True)
class Experiment:
    """What a config may run. See flows/experiments/nonrobust.py for a full example."""

    name: str
    paper: str
    description: str
    params: dict[str, Param]
    variables: dict[str, Var]
    run_bundle: Callable[[list[Cell], str], list[Result]]
    # Cells with equal keys run as one stacked tensor problem (one Prefect task).
    bundle_key: Callable[[Cell], tuple] = lambda cell: tuple(
        sorted((k, v) for k, v in cell.items() if k != "seed")
    )
    # Relative cost of a cell (for bundle sizing and ordering); FLOP-ish.
    cost: Callable[[Cell], float] = lambda cell: 1.0
    # Peak bytes of one cell's tensors in a bundle (for sizing bundles to free memory); 0 = unknown.
    memory: Callable[[Cell], float] = lambda cell: 0.0
    # The parameters that drive ``memory`` (named when a cell cannot fit).
    memory_fields: tuple[str, ...] = ()
    # Cross-field checks on one cell; raise ConfigError naming the field.
    check: Callable[[Cell], None] = lambda cell: None
    # Sizes of the extra dims given all cells of the grid (e.g. {"sample": max m}).
    extra_dims: Callable[[list[Cell]], dict[str, int]] = lambda cells: {}
    # Spec IDs this experiment reproduces, for `kktlab experiments`.
    spec_ids: tuple[str, ...] = ()
    # True if run_bundle takes ``checkpoint=PATH`` (a file to resume a killed bundle from).
    checkpoints: bool = False
    # False: ``run_bundle`` runs its cells one after another (each cell is its own batched problem,
    # e.g. forging's estimators): nothing is padded, so a bundle may mix shapes and costs, and bundles
    # are cut by summed cost, a few per worker (flows/bundles.py), not by the padding rule.
    stacked: bool = True
    # Descriptions that depend on the fixed parameters and the grid (params, grid) -> {variable: text},
    # stored in place of the declared one (e.g. pgd's rta: training or test accuracy, by ``points``).
    describe: Callable[[dict, dict], dict[str, str]] = lambda params, grid: {}
    # Variables of the terminal summary table (default: every scalar variable).
    summary: tuple[str, ...] = ()
    # Stages (flows/stages.py): what this experiment's cells leave in the store for a later stage
    # to read (e.g. train: ("nets",)), and what it reads from the stage named in its ``from``
    # (e.g. universal_attack: "nets"). A reading experiment's ``run_bundle`` takes ``inputs=``:
    # what the sweep loaded from the upstream cells (storage.query.load_nets for "nets").
    produces: tuple[str, ...] = ()
    reads: str | None = None
    # A reader of "nets" that also needs the nets its upstream stage read (the pair before / after an
    # unlearn stage's deletion: reconstruct_diff): the sweep loads them as ``inputs.before``, one per
    # cell; a stage reading a first stage (whose nets were read from nothing) is refused at config time.
    reads_before: bool = False
    # Parameters a reading experiment takes from the upstream cell it reads (own name -> the
    # upstream experiment's name, e.g. unlearn's retrain_lr <- train_kkt's lr): where the upstream
    # experiment has that parameter it is set there only (flows/stages.py refuses it in the reading
    # stage, naming the field) and applied per cell on the worker (flows/sweep.py::compute_reading).
    inherits: dict[str, str] = dataclasses.field(default_factory=dict)
    # A producer that leaves arrays out of the store and rebuilds them when they are read
    # (storage.nets.load_nets_at): ``rebuild(cell, read)`` gets the upstream cell as it was run and
    # ``read(name)`` -> that cell's stored array, and returns name -> array (unpadded), e.g. the
    # training rows from stored indices + checksum (MNIST, CIFAR) or W0 from the seed.
    rebuild: Callable[[Cell, Callable[[str], "np.ndarray"]], dict] | None = None  # noqa: F821
    # A producer of "nets": the contract of one of its cells (the cell as run, and the contract of the
    # upstream cell it read, None for a first stage). A reader: what one of its cells needs.
    # What ``kktlab report`` draws and judges for a group of this experiment: modules of analysis/ with
    # ``figures(ds, out_dir, prefix)`` (optionally ``notes``, ``sample_figures``) and ``acceptance(ds)``.
    figures: str = ""
    acceptance: str = ""
    nets: Callable[[Cell, "NetsContract | None"], NetsContract] | None = None
    # A producer of "nets": the arrays beyond W, b, v, X, y it stores (or rebuilds) for readers,
    # name -> their own dims after the grid's (e.g. lazy_train: W0 ("hidden", "feature")). Written
    # into the group (``kktlab_nets_arrays``), so storage.nets loads them without a list of its own.
    nets_arrays: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    needs: Callable[[Cell], NetsNeeds] = lambda cell: NetsNeeds()
    # A producer of "nets": how many training points the net of one of its cells is trained on, from
    # the cell's parameters (None: not known before it runs). A reader that indexes the upstream's
    # training set: ``check_points(cell, m)`` -> (parameter, what is wrong, with ``{upstream}`` where
    # the upstream is to be named) when the cell's indices cannot fit an upstream net of m training
    # points, else None. flows/stages.py checks every reading stage against its upstream's smallest m
    # at config time, naming the field.
    points: Callable[[Cell], int | None] | None = None
    check_points: Callable[[Cell, int], tuple[str, str] | None] | None = None

    def with_inherited(self, cell: Cell, upstream: Cell) -> Cell:
        """``cell`` with the parameters it takes from the upstream cell it reads (:attr:`inherits`)."""
        return dict(cell, **{mine: upstream[theirs] for mine, theirs in self.inherits.items() if theirs in upstream})
