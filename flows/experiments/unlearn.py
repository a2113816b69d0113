"""Experiment ``unlearn``: paper 001 (Provable unlearning with gradient ascent on two-layer ReLU
nets) on nets a ``train_kkt`` stage stored (reads "nets"): one gradient-ascent step sized by the
forgotten point's KKT multiplier (fraction α swept), k-GA, sequential GA, retraining, identity;
judged by the paper's own criterion, Def 2.2: is the result an (ε, δ)-approximate KKT point of the
retained data (K1), how far in cosine from the references (K3), and what the theorems bound (§4),
with their preconditions. Declaration and wiring only; the maths is ``tasks/cells/unlearn.py``.

Axes: unlearn_method, alpha, forget (index l, -1 one random l per net, -2 every l: the max over l that
Def 2.2 asks for), k. Its group's dims are the train stage's dims followed by its own.

A producer too (the ``nets`` contract, core.declare.NetsContract): each cell with one forget set
stores its unlearned net θ̂ (``ga``, ``k_ga``, ``sequential_ga``; the retrained net for ``retrain``,
θ itself for ``identity``: the references) as ``train`` stores a trained one, with the training set
and ``forgotten``, the points removed, so attack, reconstruct and forging stages read it as they
read a trained net and report forgotten and retained points apart. Nets with a trained bias
(paper 003's raw variant) are measured and stepped with their bias (the bias a first-layer weight
on a constant feature); their output layer must be frozen (paper 001's u, paper 003's a/√m).
The retrain reference and D_MG test points redraw what training drew: ``init_scale``, ``retrain_*``,
``mu_*``, ``loss`` and ``model`` are taken from the train stage's cell (``INHERITS``: its fixed
parameters and coordinates, which ``storage.nets.load_nets_at`` gives with the nets); a config sets
them in the train stage only (the unlearn stage's values apply when the upstream has no such
parameter, e.g. a paper-002 ``train`` stage has no mu_a).
"""

from __future__ import annotations


from core.declare import COSINE, FRACTION, NONNEG, NetsContract, NetsNeeds, with_domain
from core.errors import ConfigError
from flows import bundle_progress
from flows.experiments import Experiment, Param, Var, register, by_shape, timed
from flows.experiments import nonrobust
from flows.experiments import train as train_exp
from tasks.cells import unlearn as cell_fn
from tasks.cells.unlearn_full import unlearn_full
from tasks.data.mixture import SCALINGS
from tasks.unlearn import METHODS
from tasks.unlearn.bounds import PRECONDITIONS

P = {
    "unlearn_method": Param(str, "ga", "unlearning method (tasks/unlearn registry)", choices=tuple(METHODS)),
    "alpha": Param(float, 1.0, "step as a fraction of the KKT multiplier λ_l (App. E sweeps [0, 1.5])", min=0, max=100),
    "forget": Param(int, -1, "forgotten index l; -1 one random l per net (App. E); -2 every l (Def 2.2's max)",
                    min=-2, max=10**5),
    "k": Param(int, 1, "points forgotten at once: {l, …, l+k-1} mod m (§5)", min=1, max=10**5),
    "forget_set": Param(str, "", "indices forgotten together, comma-separated (e.g. '3, 17, 42'; one index: that "
                        "point); set, it replaces forget and k; '': forget / k decide"),
    "forget_seed": Param(int, 0, "seed of the random l (forget = -1), with the upstream cell's coordinates",
                         min=0, max=2**32 - 1),
    "model": Param(str, "two_layer", "the train stage's model (checked against the stored output layer)",
                   choices=("two_layer", "linear")),
    "loss": Param(str, "logistic", "the train stage's loss (dynamics multipliers, log β, retrain)",
                  choices=("logistic", "exp")),
    "tie_tol": Param(float, 1e-9, "σ'(z) = 1[z > tol·‖x_i‖·max_k‖w_k‖] (spec N1)", min=0, max=1),
    "ref_retrain": Param(bool, False, "also retrain on the retained set as a τ reference (F001-5; costly)"),
    "init_scale": Param(float, 1e-5, "the train stage's init_scale (retrain from the same init)", gt=0, max=1e6),
    "retrain_lr": Param(float, 1.0, "the train stage's lr", gt=0, max=1e6),
    "retrain_wd": Param(float, 1e-5, "the train stage's wd", min=0, max=1e3),
    "retrain_epochs": Param(int, 100_000, "the train stage's epochs", min=1, max=10**8),
    "test_points": Param(int, 0, "fresh D_MG test points (Thm 6.1; 0: none; the train stage must use data d_mg)",
                         min=0, max=10**6),
    "mu_a": Param(float, 0.1, "the train stage's mu_a", min=0, max=1),
    "mu_scaling": Param(str, "sec6", "the train stage's mu_scaling", choices=SCALINGS),
    "store_nets": Param(bool, True, "store each unlearned net (forget >= -1) for later stages (false: numbers only)"),
}

F = lambda units, doc: Var(units, doc)  # noqa: E731
V = {
    "m_used": Var("1", "training points m of the net", "int64", finite=True),
    "width_used": Var("1", "width n of the net (1: linear)", "int64", finite=True),
    "n_forget_sets": Var("1", "forget sets measured (1, or m for forget = -2)", "int64", finite=True),
    "feasible": Var("1", "1 if every unlearned net classifies its retained points (min margin > 0)", "int8", finite=True),
    "eps": F("l2 norm", "KKT stationarity ε of the unlearned net on the retained set, min margin 1, nnls λ (K1; max over l)"),
    "delta": F("1", "complementary slackness δ = max λ_i (q_i - 1) on the retained set (max over l)"),
    "eps_rel": F("1", "ε / ‖θ̂‖ (scale free; max over l)"),
    "eps_mean": F("l2 norm", "ε, mean over forget sets"), "delta_mean": F("1", "δ, mean over forget sets"),
    "eps_app_e": F("l2 norm", "ε at the one forgotten l App. E's protocol draws for this net (forget = -1's rule, "
                   "read back from every l with forget = -2; NaN for a given l)"),
    "eps_rel_mean": F("1", "ε_rel, mean over forget sets"),
    "eps_inherited": F("l2 norm", "ε with the trained net's λ rescaled (the proofs' certificate; max over l)"),
    "delta_inherited": F("1", "δ with the inherited λ (max over l)"),
    "eps_dynamics": F("l2 norm", "ε with λ ∝ -ℓ'(q) (Lyu-Li; max over l)"),
    "eps1": F("l2 norm", "ε_1 of the trained net on S (K1, nnls)"), "delta1": F("1", "δ_1 of the trained net on S"),
    "eps1_rel": F("1", "ε_1 / ‖θ‖"), "feasible1": Var("1", "1 if the trained net interpolates S", "int8", finite=True),
    "q_min1": F("1", "raw minimum margin of the trained net"),
    "lam_l": F("1", "multiplier λ_l of the forgotten anchor point (mean over l)"),
    "q_l": F("1", "raw margin of the forgotten anchor point"),
    "log_beta_l": F("log", "log β_l = log λ_l - log|ℓ'(q_l)| (Eq. 3's step along ∇ℓ, raw scale)"),
    "lam_min": F("1", "smallest multiplier of the trained net"), "lam_max": F("1", "largest multiplier"),
    "n_support": Var("1", "support points of the trained net's λ", "int64"),
    "n_support_after": F("1", "support points of the unlearned net's λ (mean over l)"),
    "act_mass_min": F("1", "min_i Σ_j u_j² λ_i σ'_ij (Lemma C.4: >= 0.9 - ...)"),
    "act_mass_max": F("1", "max_i Σ_j u_j² λ_i σ'_ij (Lemma C.3: <= 20.4)"),
    "tau_fixed": F("1", "1 - cossim to the proof's fixed net (K3, two-layer; max over l)"),
    "eps_fixed": F("l2 norm", "ε of the fixed net"), "delta_fixed": F("1", "δ of the fixed net"),
    "tau_retrain": F("1", "1 - cossim to the net retrained on the retained set (ref_retrain; max over l)"),
    "eps_retrain": F("l2 norm", "ε of the retrained net"), "delta_retrain": F("1", "δ of the retrained net"),
    "cos_svm": F("1", "cossim to the retained set's hard-margin SVM (linear; min over l)"),
    "tau_svm": F("1", "1 - cos_svm (linear; max over l)"),
    "train_acc_before": F("1", "accuracy of θ on the retained points"),
    "train_acc_after": F("1", "accuracy of θ̂ on the retained points"),
    "forget_acc_after": F("1", "fraction of forgotten points θ̂ still classifies correctly"),
    "test_acc_before": F("1", "accuracy of θ on fresh D_MG points (Thm 6.1; NaN without test_points)"),
    "test_acc_after": F("1", "accuracy of θ̂ on fresh D_MG points (mean over l)"),
    "sign_id_before": F("1", "fraction of (neuron, test point) with sign(w_j·x) = y sign(u_j) (Lemma D.7), θ"),
    "sign_id_after": F("1", "the same for θ̂"),
    "psi": F("1", "ψ̂ = max |‖x_i‖² - 1| (Assumption 2.3)"), "phi": F("1", "φ̂ = max_{i≠j} |⟨x_i, x_j⟩|"),
    "eps_d": F("1", "smallest admissible ε_d: 4mφ̂ (linear), 4mnφ̂ (two-layer)"),
    "bound_eps": F("l2 norm", "Thm 3.1/B.1/4.1/C.1 ε bound (proof form)"),
    "bound_eps_stated": F("l2 norm", "the ε bound as stated"),
    "bound_delta_stated": F("1", "the δ bound as stated"), "bound_delta_proof": F("1", "the δ the proof supports"),
    "bound_tau_stated": F("1", "the τ bound as stated (NaN: linear, unspecified C)"),
    "bound_tau_proof": F("1", "the τ the proof supports"),
    "preconditions_met": Var("1", "1 if the theorem's preconditions hold (else the bounds are not predictions)",
                             "int8", finite=True),
    "violated": Var("1", "bitmask of violated preconditions: " + ", ".join(f"{1 << i} {p}" for i, p in
                                                                        enumerate(PRECONDITIONS)), "int64", finite=True),
    "lemma_upper": Var("1", "Lemma B.1 (linear) / C.3 (two-layer) holds on the trained certificate", "int8"),
    "lemma_lower": Var("1", "Lemma B.2 (linear) / C.4 (two-layer) holds", "int8"),
    "wall_s": Var("s", "bundle wall time divided by its cells", finite=True),
    "eps_l": Var("l2 norm", "ε per forgotten anchor l (NaN where l was not forgotten)", dims=("sample",)),
    # the unlearned net (the nets contract; empty where forget = -2 or store_nets: false)
    "d_used": train_exp.V["d_used"],
    "nets_stored": Var("1", "1 if W, b, v, X, y hold this cell's unlearned net (one forget set, store_nets)", "int8",
                       finite=True),
    "W": Var("1", "unlearned first-layer weights ŵ_j (zero past width_used, d_used)", dims=("hidden", "feature"), pad=0.0),
    "b": Var("1", "unlearned biases (trained bias only; else the upstream's zeros)", dims=("hidden",), pad=0.0),
    "v": Var("1", "output layer (frozen: the upstream's)", dims=("hidden",), pad=0.0),
    "X": Var("1", "the upstream's training points, forgotten ones included (zero past m_used, d_used)",
             dims=("sample", "feature"), pad=0.0),
    "y": Var("1", "training labels (zero past m_used)", dims=("sample",), pad=0.0),
    "forgotten": Var("1", "1 at the training points this cell forgot (indices into the upstream's training set)",
                     "int8", dims=("sample",)),
    "batch_rng_state": Var("byte", "the upstream net's generator state, handed on", "uint8", dims=("rng_byte",)),
}
with_domain(V, NONNEG, "eps", "eps_rel", "eps_mean", "eps_app_e", "eps_rel_mean", "eps_inherited", "eps_dynamics",
            "eps1", "eps1_rel", "lam_l", "lam_min", "lam_max", "n_support", "n_support_after", "eps_fixed",
            "eps_retrain", "bound_eps", "bound_eps_stated", "wall_s", "eps_l")
with_domain(V, FRACTION, "feasible", "feasible1", "train_acc_before", "train_acc_after", "forget_acc_after",
            "test_acc_before", "test_acc_after", "preconditions_met", "lemma_upper", "lemma_lower")
with_domain(V, COSINE, "cos_svm")


# Taken from the train stage's cell it reads (a fixed parameter or a grid coordinate, e.g. F001-6
# sweeps mu_a in the train stage): the retrain reference and D_MG points redraw what training drew.
INHERITS = {"mu_a": "mu_a", "mu_scaling": "mu_scaling", "init_scale": "init_scale", "retrain_lr": "lr",
            "retrain_wd": "wd", "retrain_epochs": "epochs", "loss": "loss", "model": "model"}


def bundle_key(cell: dict) -> tuple:
    """Everything but α: one bundle measures the whole α sweep of its nets in one call."""
    return tuple(sorted((k, v) for k, v in cell.items() if k != "alpha"))


@timed
@by_shape
def run_bundle(cells: list[dict], device: str = "auto", inputs=None) -> list[dict]:
    """``inputs``: the upstream nets of ``cells``, in order (storage.nets.Nets), float64 on the CPU. The
    measures run on the CPU; the retraining (retrain, ref_retrain) on ``device`` (auto: CUDA when visible,
    as train_kkt trains)."""
    import torch

    n = inputs
    keys = [repr(sorted(c.items())) for c in n.cells]
    dev = nonrobust.resolve_device(device)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    trained = n.trained()
    if n.contracts and bool(trained[:, 2].any()):  # v trained (paper 002 / 004's nets): over the blocks they trained
        if not bool(trained[:, 2].all()):
            raise ValueError("unlearn: a bundle mixes nets with v trained and nets with a frozen output layer")
        blocks = tuple(name for name, on in zip(("W", "b", "v"), trained[0].tolist()) if on)
        return unlearn_full(n.W, n.b, n.v, n.X, n.y, n.mask, n.d, n.m, n.width, n.rng_state, keys, cells, blocks,
                            retrain=lambda rows, drop: _retrain(n, rows, drop, dev))
    return cell_fn.unlearn(n.W, n.b, n.v, n.X, n.y, n.mask, n.d, n.m, n.width, n.rng_state, keys, cells,
                           train_bias=n.trained()[:, 1] if n.contracts else n.b.abs().amax(-1) > 0,
                           progress=bundle_progress.for_kernel(bundle_progress.current()),  # retraining epochs
                           device=dev)


def _retrain(n, rows: list[int], drop, dev) -> tuple:
    """``retrain`` of nets with v trained: their producer's training again without ``drop`` (``train``'s)."""
    trainers = {n.contracts[r].trainer for r in rows}
    if trainers != {"train"}:
        raise ValueError(f"unlearn_method: 'retrain' of nets with v trained retrains train's nets, not {sorted(trainers)}")
    from flows.experiments import train

    return train.retrain([n.cells[r] for r in rows], drop, n.W, str(dev))


def contract(cell: dict, upstream: NetsContract | None) -> NetsContract:
    """The upstream's nets, unlearned: same trained blocks and output layer, plus ``forgotten``; the
    upstream's init and test set are not handed on. One net per cell unless forget = -2."""
    up = upstream or NetsContract()
    return NetsContract(arrays=frozenset({"forgotten"}), trained=up.trained, output=up.output, trainer=up.trainer,
                        data=up.data, single=cell["forget"] != -2 or bool(cell.get("forget_set")), fixed=up.fixed)


def needs(cell: dict) -> NetsNeeds:
    """Paper 001's setting: a frozen output layer, W trained (and a bias, measured with it; a bias held
    fixed at a non-zero value is not a parameter of the GA step nor absent: tasks/cells/unlearn.py
    refuses it); or every block trained (paper 002 / 004's nets: the step over W, b, v,
    tasks/cells/unlearn_full.py; identity, ga, k_ga, and retrain by ``train``'s own training); never
    nets something was already forgotten from; the ref_retrain reference and D_MG test points redraw
    what ``train_kkt`` drew."""
    redraw = cell["ref_retrain"] or cell["test_points"] > 0
    if cell["unlearn_method"] == "retrain" and not redraw and cell["model"] != "linear":  # the producer trains again
        return NetsNeeds(trained=(frozenset({"W"}), frozenset({"W", "b"}), frozenset({"W", "b", "v"})),
                         without=frozenset({"forgotten"}), unfixed=frozenset({"b"}),
                         trainers=frozenset({"train_kkt", "train"}),
                         why="retrain trains the nets again: train_kkt's (its init redrawn) or train's (its "
                             "stack rebuilt)")
    redraw = redraw or cell["unlearn_method"] == "retrain"
    if redraw or cell["unlearn_method"] == "sequential_ga" or cell["model"] == "linear":
        return NetsNeeds(trained=(frozenset({"W"}), frozenset({"W", "b"})), output="frozen",
                         without=frozenset({"forgotten"}), unfixed=frozenset({"b"}),
                         trainers=frozenset({"train_kkt"}) if redraw else frozenset(),
                         data=frozenset({"d_mg"}) if cell["test_points"] > 0 else frozenset(),
                         why="paper 001: GA on W with u frozen; retrain / ref_retrain / test_points redraw "
                             "train_kkt's init and D_MG points")
    return NetsNeeds(trained=(frozenset({"W"}), frozenset({"W", "b"}), frozenset({"W", "b", "v"})),
                     without=frozenset({"forgotten"}), unfixed=frozenset({"b"}),
                     why="GA over the trained blocks: W (and b) with u frozen, or W, b, v")


def check(cell: dict) -> None:
    """``forget_set``: distinct non-negative integers; one point only for ``ga`` (k_ga / sequential_ga
    / retrain forget several)."""
    try:
        idx = cell_fn.parse_forget_set(cell["forget_set"])
    except ValueError as err:
        raise ConfigError("forget_set", str(err)) from None
    if len(idx) > 1 and cell["unlearn_method"] == "ga":
        raise ConfigError("forget_set", f"method 'ga' forgets one point, got {len(idx)}; use k_ga, sequential_ga "
                          "or retrain for a set")


def check_points(cell: dict, m: int) -> tuple[str, str] | None:
    """``forget`` (an index l, or -1 / -2) and the k points {l, …, l+k-1} mod m, or ``forget_set``, against
    an upstream net of m training points (the run-time check of tasks/cells/unlearn.py::forget_sets, at
    config time)."""
    idx = cell_fn.parse_forget_set(cell.get("forget_set", ""))
    if idx:
        if max(idx) >= m:
            return "forget_set", f"index {max(idx)} is out of range for {{upstream}} (allowed 0..{m - 1})"
        if len(idx) >= m:
            return "forget_set", f"forgets all {m} points of {{upstream}}: no retained point"
        return None
    if cell["forget"] >= m:
        return "forget", (f"is out of range for {{upstream}} (allowed -2..{m - 1}: an index l, -1 one random l "
                          "per net, -2 every l)")
    if cell["k"] >= m:
        return "k", f"points forgotten at once leave no retained point of {{upstream}} (allowed 1..{m - 1})"
    return None


EXPERIMENT = register(Experiment(
    name="unlearn",
    figures="analysis.unlearn",
    acceptance="analysis.acceptance_001",
    paper="001 Provable unlearning with gradient ascent on two-layer ReLU networks",
    description="GA / k-GA / retrain unlearning judged by the KKT criterion (Def 2.2) on stored nets (reads 'nets')",
    params=P, variables=V, run_bundle=run_bundle, bundle_key=bundle_key, reads="nets", inherits=INHERITS,
    produces=("nets",), nets=contract, needs=needs, nets_arrays={"forgotten": ("sample",)}, check_points=check_points,
    check=check,
    cost=lambda c: 1.0 + (c.get("retrain_epochs", 10**5) if c["unlearn_method"] == "retrain" or c["ref_retrain"] else 0),
    summary=("m_used", "eps", "eps_mean", "delta", "eps_rel", "eps1", "tau_fixed", "cos_svm", "preconditions_met"),
    spec_ids=("F001-1", "F001-2", "F001-3", "F001-4", "F001-5", "F001-6", "P001-4", "P001-5", "P001-6", "P001-7",
              "P001-8", "P001-10"),
))
