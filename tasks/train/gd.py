"""Batched training of E two-layer nets to a tiny loss (paper 002 Sec. 6, spec §2.2, §2.6).

The step is the spec's log-space form of plain GD/SGD on the exponential or logistic loss:

    ∇L = -L · Σ_i π_i y_i ∇_θ N(x_i),   π_i = |ℓ'(q_i)| / Σ_l ℓ(q_l)        (spec 002 §2.2)
    θ ← θ + exp(log lr_t + log L) · Σ_i π_i y_i ∇_θ N(x_i)

so neither L ≈ 1e-30 nor lr ≈ 1e25 is ever formed as a float. Gradients are written by hand
with two ``bmm`` per step (no autograd graph), all E nets in one kernel (on a CPU in
cache-sized chunks of nets, :func:`auto_chunk`, issue 19). ``train(..., compile=True)`` runs
full-batch steps in compiled blocks (:func:`_steps`), which carry the pre-activations through
the Gram matrix X Xᵀ when n ≤ d and form W once per block. Each net keeps its own
schedule state and stops on device when its full-data loss drops below the target; finished
nets are frozen (scale 0), which is identical to stopping them. Only every ``sync_every``
steps does the host look at the state.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import torch

from tasks.nets import TwoLayer, log_loss_terms, mean_log_loss

RUNNING, CONVERGED, MAX_ITERS, DEAD, DIVERGED = 0, 1, 2, 3, 4
STATUS_NAMES = {RUNNING: "running", CONVERGED: "converged", MAX_ITERS: "max_iters", DEAD: "dead",
                DIVERGED: "diverged"}


@dataclasses.dataclass(frozen=True)
class Schedule:
    """Paper 002 Sec. 6: lr_t = lr0 · factor^(t // period), stop when loss < target.

    ``period_fast`` (spec E14): once every training point of a net is classified correctly its
    period switches to ``period_fast`` (None keeps the paper's schedule). "Every point" is the
    full data, judged whenever the full-data loss is (every step with full batch, at the sync
    points every ``sync_every`` steps with minibatches; spec A3), never on a minibatch. ``max_log_lr`` caps the
    LR exponent (spec A22); ``max_iters`` caps the run (spec A15).
    """

    loss: str = "exp"  # "exp" | "logistic"
    lr0: float = 1e-5
    factor: float = 1.1
    period: int = 100
    period_fast: int | None = None
    target_loss: float = 1e-30
    max_iters: int = 150_000
    batch_size: int = 5000
    max_log_lr: float = math.log(1e30)
    sync_every: int = 100


@dataclasses.dataclass
class TrainState:
    """Everything needed to continue training (checkpoint / resume inside a cell)."""

    net: TwoLayer
    log_lr: torch.Tensor  # (E,) float64
    plateau_pos: torch.Tensor  # (E,) int64, steps taken in the current LR plateau
    iters: torch.Tensor  # (E,) int64, steps taken
    status: torch.Tensor  # (E,) int8, see STATUS_NAMES
    log_loss: torch.Tensor  # (E,) float64, last full-data log loss (mean reduction)
    separated: torch.Tensor  # (E,) bool, every training point correct at that evaluation (E14)

    @property
    def running(self) -> torch.Tensor:
        return self.status == RUNNING


def init_state(net: TwoLayer, schedule: Schedule) -> TrainState:
    E, dev = net.E, net.W.device
    return TrainState(
        net=net.clone(),
        log_lr=torch.full((E,), math.log(schedule.lr0), dtype=torch.float64, device=dev),
        plateau_pos=torch.zeros(E, dtype=torch.int64, device=dev),
        iters=torch.zeros(E, dtype=torch.int64, device=dev),
        status=torch.zeros(E, dtype=torch.int8, device=dev),
        log_loss=torch.zeros(E, dtype=torch.float64, device=dev),
        separated=torch.zeros(E, dtype=torch.bool, device=dev),
    )


def _status(st: TrainState, cond: torch.Tensor, code: int) -> None:
    st.status = st.status.masked_fill(st.running & cond, code)


def _separated(q: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Every valid point classified correctly, (E,) bool."""
    return ((q > 0) | ~mask).all(1)


def _full_data_check(st: TrainState, log_L: torch.Tensor, separated: torch.Tensor, sched: Schedule) -> None:
    """Record a full-data evaluation of the running nets: loss, separation, convergence, divergence."""
    st.log_loss = torch.where(st.running, log_L, st.log_loss)
    st.separated = torch.where(st.running, separated, st.separated)
    _status(st, log_L < math.log(sched.target_loss), CONVERGED)
    _status(st, ~torch.isfinite(log_L), DIVERGED)


def _dead(A: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(E,) bool: no neuron active on any valid sample (activations A), so GD can never move the
    net again (spec A22)."""
    return (A * mask.unsqueeze(-1)).flatten(1).amax(1) <= 0


def _weights(st: TrainState, q: torch.Tensor, y, mask, sched: Schedule, check_stop: bool,
             dead: torch.Tensor | None, log_m: torch.Tensor, padded: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """From the margins q (E, n): the loss, the full-data check if ``check_stop`` (spec A3), the
    dead nets ``dead`` marked, and the ascent weights g_i = y_i · lr · L · π_i of the running nets
    (spec 002 §2.2). Returns (g, running)."""
    log_l, log_dl = log_loss_terms(q, sched.loss)
    if padded:
        log_l = log_l.masked_fill(~mask, -math.inf)
    # log Σ ℓ in the working dtype: only the scale exp(log lr + log L) needs float64 (spec 002
    # §6: the per-sample weights π_i = exp(log|ℓ'_i| - log Σ ℓ) lie in [0, 1])
    lse = torch.logsumexp(log_l, 1)
    log_L = lse.to(torch.float64) - log_m  # mean reduction (spec A2)
    if check_stop:  # full batch: the batch is the data, checked every step (spec A3)
        _full_data_check(st, log_L, _separated(q, mask), sched)
    if dead is not None:
        _status(st, dead, DEAD)
    run = st.running
    # log of lr·L·π_i: log π_i in the working dtype plus the per-net log lr·L, formed in float64
    # (lr·L ≈ 1e-5 during a run, spec 002 §6: its log rounds to float32 within ~5e-7); weights
    # below the dtype's smallest normal are 0 (subnormals would add nothing measurable and slow
    # the CPU down ~100x)
    log_w = log_dl - lse.unsqueeze(1) + (st.log_lr + log_L).to(q.dtype).unsqueeze(1)
    keep = run.unsqueeze(1) & (log_w > math.log(torch.finfo(q.dtype).tiny))
    keep = keep & mask if padded else keep
    return y * torch.where(keep, torch.exp(log_w), torch.zeros_like(log_w)), run


def _fused_grads(A: torch.Tensor, g: torch.Tensor, v: torch.Tensor):
    """(G, dv, db) of spec 002 §2.2 in forms inductor fuses: G = g_i v_j 1[h_ij > 0] (sign(relu(h))
    is the indicator), and the v- and b-gradients in one reduction over the samples,
    Σ_i G_i = v ⊙ Σ_i s_i g_i."""
    S = torch.sign(A)
    G = S * g.unsqueeze(-1) * v.unsqueeze(1)
    return G, (A * g.unsqueeze(-1)).sum(1), (S * g.unsqueeze(-1)).sum(1) * v


def _schedule(st: TrainState, run: torch.Tensor, sched: Schedule) -> None:
    """Count the step of the running nets; per-net LR plateaus, whose period shortens once the net
    separates the data (E14). New tensors: in place, a compiled block would copy them back into
    its inputs at its end."""
    st.iters = st.iters + run
    st.plateau_pos = st.plateau_pos + run
    if sched.period_fast is None:
        bump = run & (st.plateau_pos >= sched.period)
    else:  # full-data separation, never the minibatch's (E14)
        period = torch.where(st.separated, sched.period_fast, sched.period)
        bump = run & (st.plateau_pos >= period)
    st.log_lr = torch.where(bump, (st.log_lr + math.log(sched.factor)).clamp_max(sched.max_log_lr), st.log_lr)
    st.plateau_pos = st.plateau_pos.masked_fill(bump, 0)


def _step(st: TrainState, X, y, mask, sched: Schedule, check_stop: bool, check_dead: bool,
          log_m: torch.Tensor, padded: bool) -> None:
    """One GD step on batch (X, y, mask) for every running net, in place. ``log_m`` (E,) is
    log(mask.sum(1)) in float64, ``padded`` whether any sample is masked out (both constant over
    a call of :func:`train`, so formed once there).

    Cost per step: two bmm for the forward/backward of W, two thin bmm for v, and four
    elementwise passes over the (E, n, k) activations (the bias broadcast inside ``baddbmm``,
    relu in place, the indicator sign(A), and two in-place products with g and v).
    """
    net = st.net
    fused = torch.compiler.is_compiling()  # under compiled_step: forms inductor fuses into its loops
    if fused:  # bias add + ReLU + the margin's product with v: one pass over the GEMM's output
        A = torch.relu(torch.bmm(X, net.W.transpose(1, 2)) + net.b.unsqueeze(1))
        q = y * (A * net.v.unsqueeze(1)).sum(-1)
    else:
        A = torch.relu_(net.pre(X))  # (E,n,k), in place: one (E,n,k) buffer fewer per step
        q = y * torch.bmm(A, net.v.unsqueeze(-1)).squeeze(-1)
    g, run = _weights(st, q, y, mask, sched, check_stop, _dead(A, mask) if check_dead else None, log_m, padded)
    # W is updated through its transpose, W^T += X^T G: with W held column-major (train's
    # as_columns) that is a contiguous (E, d, k) output, and the forward's W^T a contiguous operand
    if fused:  # new tensors rather than in-place updates: no copy back into the inputs
        G, dv, db = _fused_grads(A, g, net.v)
        net.W = torch.baddbmm(net.W.transpose(1, 2), X.transpose(1, 2), G).transpose(1, 2)
        net.b, net.v = net.b + db, net.v + dv
    else:  # formed in place on the indicator: s·g·v equals g·v·s exactly, s being 0 or 1
        G = torch.sign(A).mul_(g.unsqueeze(-1)).mul_(net.v.unsqueeze(1))
        dv = torch.bmm(A.transpose(1, 2), g.unsqueeze(-1)).squeeze(-1)
        net.W.transpose(1, 2).baddbmm_(X.transpose(1, 2), G)
        net.b += G.sum(1)
        net.v += dv
    _schedule(st, run, sched)


@functools.cache
def compiled_step():
    """:func:`_step` under ``torch.compile`` (issue 19): inductor fuses the elementwise passes over
    the (E, n, k) activations and the per-net schedule bookkeeping into a few loops; the GEMMs stay
    library calls. Built once per process; each new (chunk) shape or flag combination compiles
    once more (seconds with a warm inductor cache, tens of seconds cold). The same maths as the
    eager step; the fused margins and v-gradient sum in another order, so parameters equal the
    eager step's to ~1e-16 relative (tests/test_train.py), not bit for bit."""
    return torch.compile(_step)


def _steps(st: TrainState, X, y, mask, sched: Schedule, block: int, log_m: torch.Tensor, padded: bool,
           gram: torch.Tensor | None = None, first_dead: bool = False) -> None:
    """``block`` full-batch steps of :func:`_step` in one call; only the first checks for dead nets,
    and only if ``first_dead`` (compiled blocks never do: the caller checks before a block that
    starts at a sync point, and runs it eagerly with ``first_dead`` if a net died). Under
    :func:`compiled_steps` one graph per block size, and one call's overhead (guards, wrappers,
    output tensors: ~20-50 µs on this CPU) per block instead of per step (issue 19).

    With ``gram`` = X Xᵀ (E, n, n) the block never forms W between its steps: the pre-activations
    follow the update W ← W + Gᵀ X as H ← H + (X Xᵀ) G + Δb (exact in exact arithmetic, as
    X W_{t+1}ᵀ = X W_tᵀ + X Xᵀ G_t), and W takes the block's Σ_t G_t once at its end. A block of
    B steps then costs one forward GEMM, B - 1 products with the Gram matrix (n² k each) and one
    update, against 2 B GEMMs of n d k: fewer flops when n < 2d (:func:`use_gram`)."""
    if gram is None:
        for i in range(block):
            _step(st, X, y, mask, sched, check_stop=True, check_dead=first_dead and i == 0, log_m=log_m, padded=padded)
        return
    net = st.net
    H, G_sum = torch.bmm(X, net.W.transpose(1, 2)) + net.b.unsqueeze(1), None
    for i in range(block):
        A = torch.relu(H)
        g, run = _weights(st, y * (A * net.v.unsqueeze(1)).sum(-1), y, mask, sched, True, None, log_m, padded)
        G, dv, db = _fused_grads(A, g, net.v)
        net.b, net.v = net.b + db, net.v + dv
        G_sum = G if G_sum is None else G_sum + G
        if i < block - 1:
            H = H + torch.bmm(gram, G) + db.unsqueeze(1)
        _schedule(st, run, sched)
    net.W = torch.baddbmm(net.W.transpose(1, 2), X.transpose(1, 2), G_sum).transpose(1, 2)


def use_gram(n: int, d: int) -> bool:
    """Whether compiled blocks of full-batch steps carry the pre-activations through the Gram
    matrix X Xᵀ (:func:`_steps`): when n ≤ d, where a block of 4 steps needs at most 5/8 of the
    direct form's GEMM flops (the break-even is n = 2d; n ≤ d leaves a margin for the (E, n, n)
    matrix's memory and the extra pass that sums G)."""
    return n <= d


@functools.cache
def compiled_steps():
    """:func:`_steps` under ``torch.compile``: a block of full-batch steps unrolled into one graph."""
    return torch.compile(_steps)


STEPS_PER_CALL = 4  # full-batch steps per compiled call (a divisor of sync_every: see block_size)


def block_size(sync_every: int, steps_per_call: int = STEPS_PER_CALL) -> int:
    """The largest divisor of ``sync_every`` up to ``steps_per_call``: blocks aligned to it never
    straddle a sync point, so the host sees the state exactly where the one-step loop does, and
    only a block's first step can be a dead-net check."""
    return max(c for c in range(1, max(1, steps_per_call) + 1) if sync_every % c == 0)


CHUNK_BYTES = 1 << 20  # CPU: one (chunk, n, k) activation tensor of at most ~1 MiB (issue 19)


def auto_chunk(E: int, n: int, k: int, dtype: torch.dtype, device) -> int:
    """Nets per kernel call: the whole stack on a GPU; on a CPU the largest chunk whose (chunk,
    n, k) activations fit in ``CHUNK_BYTES`` (at least 1), so that a chunk's working set stays in
    the L2 cache for all its steps and no temporary reaches malloc's mmap threshold (issue 19:
    the per-net cost doubled once E·n·k left the cache)."""
    if torch.device(device).type != "cpu":
        return E
    per_net = max(1, n * k * torch.finfo(dtype).bits // 8)
    return max(1, min(E, CHUNK_BYTES // per_net))


def even_chunk(E: int, chunk: int) -> int:
    """The largest divisor of E in (chunk/2, chunk], else ``chunk``: equal chunks, so a compiled
    step compiles one shape, not a second (dynamic-shape) one for a smaller last chunk (issue 19)."""
    return next((c for c in range(min(chunk, E), chunk // 2, -1) if E % c == 0), chunk)


def concat_states(states: list[TrainState]) -> TrainState:
    """Stack the states of consecutive chunks of nets into one state."""
    if len(states) == 1:
        return states[0]
    net = TwoLayer(*(torch.cat([getattr(s.net, p) for s in states]) for p in ("W", "b", "v")))
    return TrainState(net=net, **{f: torch.cat([getattr(s, f) for s in states]) for f in STATE_FIELDS})


def train(net: TwoLayer, X: torch.Tensor, y: torch.Tensor, schedule: Schedule, *,
          mask: torch.Tensor | None = None, batch_generators: list[torch.Generator] | None = None,
          state: TrainState | None = None, max_steps: int | None = None,
          chunk: int | None = None, compile: bool = False,
          steps_per_call: int = STEPS_PER_CALL, progress=None) -> TrainState:
    """Train the stack until every net has converged, died, diverged or hit ``max_iters``.

    X (E,m,d), y (E,m) in {±1}, mask (E,m) marks real samples (padding is False). If
    m > batch_size, plain SGD with a fresh per-net permutation each epoch (spec A4; needs
    ``batch_generators``, one per net, and no padding). ``state`` continues an earlier call;
    ``max_steps`` bounds this call (for checkpointing), the returned state says where it stopped;
    a ``state`` passed in is consumed (parts of it may be updated in place): go on from the one
    returned.

    ``chunk`` nets run together (default :func:`auto_chunk`): each chunk of the stack runs all
    its steps before the next one starts. Nets never interact, so every net's numbers are those
    of an unchunked run (tests/test_train.py pins it).

    ``compile`` runs the step under ``torch.compile`` (:func:`compiled_step`): faster per step
    where the step is not all GEMM, after a one-off compile per shape (measured in
    benchmarks/train_batched.py, whose README says where it pays). Full-batch steps then run in
    compiled blocks of :func:`block_size` steps (``steps_per_call``, :func:`compiled_steps`); a
    call's last few steps that do not fill a block run eagerly.

    ``progress`` (optional): called as ``progress(done, of, loss=...)`` at each sync point (where the
    host looks anyway), the call's steps done of all it may take; ``loss()`` gives the worst running
    net's natural log loss (a host sync: call it only when it will be shown).
    """
    E, m, _ = X.shape
    if chunk is None:
        chunk = auto_chunk(E, min(m, schedule.batch_size), net.W.shape[1], X.dtype, X.device)
        chunk = even_chunk(E, chunk) if compile else chunk
    if chunk < E:
        parts, n_parts = [], -(-E // chunk)
        for lo in range(0, E, chunk):
            sl = slice(lo, min(E, lo + chunk))
            part = None if progress is None else (
                lambda s, n, loss=None, i=lo // chunk: progress(i * n + s, n_parts * n, loss=loss))
            sub = None if state is None else TrainState(
                net=state.net.select(sl), **{f: getattr(state, f)[sl] for f in STATE_FIELDS})
            parts.append(train(net.select(sl), X[sl], y[sl], schedule, mask=None if mask is None else mask[sl],
                               batch_generators=None if batch_generators is None else batch_generators[sl],
                               state=sub, max_steps=max_steps, chunk=sl.stop - sl.start, compile=compile,
                               steps_per_call=steps_per_call, progress=part))
        return concat_states(parts)
    mask = torch.ones(E, m, dtype=torch.bool, device=X.device) if mask is None else mask
    st = state if state is not None else init_state(net, schedule)
    st.net.W = as_columns(st.net.W)
    full_batch = m <= schedule.batch_size
    if not full_batch:
        if not bool(mask.all()):
            raise ValueError("padded samples (mask) are not supported with minibatches")
        if batch_generators is None or len(batch_generators) != E:
            raise ValueError("minibatch training needs one batch generator per net")
    padded = full_batch and not bool(mask.all())
    log_m = torch.log(mask.sum(1).to(torch.float64)) if full_batch else None
    step = compiled_step() if compile else _step
    block = block_size(schedule.sync_every, steps_per_call) if compile and full_batch else 1
    gram = torch.bmm(X, X.transpose(1, 2)) if block > 1 and use_gram(m, X.shape[2]) else None
    steps, batches = 0, []
    max_steps = max_steps if max_steps is not None else schedule.max_iters
    while steps < max_steps:
        check_dead = steps % schedule.sync_every == 0
        if block > 1 and steps + block <= max_steps:  # aligned: steps is a multiple of block here
            # the dead-net check of a sync point is made before its block, not in it (one compiled
            # graph, not two); a block where a running net has died runs eagerly, its first step
            # marking it as the one-step loop does (rare, spec A22)
            if check_dead and bool((_dead(torch.relu(st.net.pre(X)), mask) & st.running).any()):
                _steps(st, X, y, mask, schedule, block, log_m, padded, first_dead=True)
            else:
                compiled_steps()(st, X, y, mask, schedule, block, log_m, padded, gram)
            steps += block - 1  # the last of the block's steps is counted below
        elif full_batch:
            (_step if block > 1 else step)(st, X, y, mask, schedule, check_stop=True, check_dead=check_dead,
                                           log_m=log_m, padded=padded)
        else:
            if not batches:
                perms = torch.stack([torch.randperm(m, generator=gen) for gen in batch_generators]).to(X.device)
                batches = list(torch.split(perms, schedule.batch_size, dim=1))
            idx = batches.pop(0)
            Xb = torch.gather(X, 1, idx.unsqueeze(-1).expand(-1, -1, X.shape[2]))
            yb = torch.gather(y, 1, idx)
            nb = torch.full((E,), float(idx.shape[1]), dtype=torch.float64, device=X.device)
            step(st, Xb, yb, torch.ones_like(yb, dtype=torch.bool), schedule, check_stop=False,
                  check_dead=check_dead, log_m=torch.log(nb), padded=False)
        steps += 1
        at_sync = steps % schedule.sync_every == 0
        if not full_batch and (at_sync or steps == max_steps):
            q = y * st.net(X)
            _full_data_check(st, mean_log_loss(q, mask, schedule.loss), _separated(q, mask), schedule)
        if at_sync:
            _status(st, st.iters >= schedule.max_iters, MAX_ITERS)
            if not bool(st.running.any()):
                break
            if progress is not None:
                progress(steps, max_steps, loss=lambda: _worst_log_loss(st))
    st.net.W = st.net.W.contiguous()
    return st


def _worst_log_loss(st: TrainState) -> float:  # the largest log loss of the running nets (of all, when none runs)
    return float(st.log_loss[st.running].max() if bool(st.running.any()) else st.log_loss.max())


def as_columns(W: torch.Tensor) -> torch.Tensor:
    """W (E, k, d) with the same values, held in memory as its transpose (E, d, k): the step's
    two GEMMs then read W^T and write W^T += X^T G contiguously, which MKL does ~10-25 % faster
    than through transposed operands at the small shapes of paper 002 (issue 19). :func:`train`
    returns W contiguous again."""
    return W.transpose(1, 2).contiguous().transpose(1, 2)


STATE_FIELDS = ("log_lr", "plateau_pos", "iters", "status", "log_loss", "separated")
