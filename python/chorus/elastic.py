"""chorus.elastic_steps: a training loop that goes on when a worker is lost (docs/python.md).

Under ``chorus run --elastic`` a worker that dies, or hangs long enough to miss its heartbeats,
does not stop the others. The loop's step runs in a function the loop calls, so that chorus sees
whatever a loss makes the step raise (torch's RuntimeError from a gradient bucket's all-reduce
inside backward, chorus.CommError from the end of the reduction), and then:

1. the survivors agree on the next generation through chorus's C++ ElasticMembership (heartbeats,
   the agents' exit reports, the lost set, the source: the survivor that got furthest);
2. they join that generation's world communicator;
3. the source hands every member its model, optimizer (and scaler, and whatever ``state`` names)
   and the balancer's state for the survivors, in which the lost ranks' samples are spread over
   the survivors in proportion to their shares;
4. every member rebuilds its gradient reducer and balancer on the new world, and the loop redoes
   the step the source goes on from with the same global batch (the ShardSampler's batches depend
   on the step alone), cut by the new shares.

Data parallelism replicates the model and the optimizer state on every rank, and a step changes
them only after its reduction completed on every rank, so no checkpoint is needed: the run goes on
along the trajectory of one that never lost the worker, every step done once.
"""

import collections
import ctypes
import dataclasses
import io
import sys
import time

import torch

from .context import current
from .errors import CommError, ConfigError, PeerFailure
from .sampler import ShardSampler


@dataclasses.dataclass
class Recovery:
    """What one recovery did (``context.recoveries``, the same on every member)."""

    generation: int        # the generation it formed
    members: list          # their launch ranks, in rank order
    lost: list             # launch ranks left out
    reason: str            # how the loss was noticed first
    step: int              # the step the members went on from
    source: int            # the launch rank whose state they took
    shares: list           # the members' shares from then on
    agree_seconds: float   # from the failure seen here to the agreement
    rebuild_seconds: float  # from the agreement to the rebuilt reducer and loaded state


def elastic_steps(loader, step_fn, optimizer, steps, scaler=None, state=None, context=None):
    """Runs ``step_fn(batch)`` for each batch of ``loader`` until ``steps`` steps are done,
    recovering from a lost worker; yields what each completed step's call returned.

    ``loader``: a ``torch.utils.data.DataLoader`` whose ``batch_sampler`` is a
    :class:`chorus.ShardSampler` (epochs follow one another; a recovery starts a new iterator at
    the step to redo). ``step_fn``: one training step that ends with exactly one
    :func:`chorus.step` and returns anything (its :class:`chorus.StepInfo`, say). ``optimizer``,
    ``scaler`` and ``state`` (a dict of objects with ``state_dict()`` / ``load_state_dict()``,
    e.g. an LR scheduler) are handed from the source to the other members at a recovery, with the
    wrapped module's parameters and buffers. ``steps``: the total, counted by the DataParallel
    (a resumed job goes on from its checkpoint's step).

    The loop's body runs once for every completed step, on every member, after the step's
    ``chorus.step``: what it does there (a log line, ``scheduler.step()``) is not redone. Without
    an elastic context (``chorus.init(elastic=...)``) it is a plain loop and a lost worker's error
    propagates. Raises ConfigError on arguments that do not fit; the CommError of a worker that the
    others left out (declared lost, e.g. stopped too long), and every error that is not a lost
    worker's, propagate.
    """
    ctx = current(context)
    dp = ctx.data_parallel
    if dp is None:
        raise ConfigError("chorus.elastic_steps needs a chorus.DataParallel in this process")
    sampler = getattr(loader, "batch_sampler", None)
    if not isinstance(sampler, ShardSampler):
        raise ConfigError("chorus.elastic_steps needs a DataLoader whose batch_sampler is a "
                          "chorus.ShardSampler: a step redone after a loss must take the same "
                          f"global batch, cut by the survivors' shares (got {type(sampler)})")
    if not callable(step_fn):
        raise ConfigError("chorus.elastic_steps: step_fn must be callable")
    if optimizer is None or not hasattr(optimizer, "load_state_dict"):
        raise ConfigError("chorus.elastic_steps: optimizer must be the torch optimizer that "
                          "chorus.step steps (its state is handed to the survivors)")
    state = dict(state or {})
    for name, value in state.items():
        if not (hasattr(value, "state_dict") and hasattr(value, "load_state_dict")):
            raise ConfigError(f"chorus.elastic_steps: state[{name!r}] has no state_dict() and "
                              "load_state_dict()")
    holders = _Holders(dp, optimizer, scaler, state)
    return _steps(ctx, dp, loader, sampler, step_fn, int(steps), holders)


def _steps(ctx, dp, loader, sampler, step_fn, steps, holders):
    iterator = None
    while dp.step_count < steps:
        fresh = iterator is None
        if fresh:
            iterator = iter(loader)
        try:
            batch = next(iterator)
        except StopIteration:  # the epoch ended: the sampler's next iteration is the next epoch
            if fresh:
                raise ConfigError("chorus.elastic_steps: the loader yields no batch (a dataset "
                                  "smaller than the global batch?)") from None
            iterator = None
            continue
        before = dp.step_count
        try:
            result = step_fn(batch)
        except Exception as error:  # noqa: BLE001 (a loss reaches us as torch's or chorus's)
            if not _is_loss(ctx, error):
                raise
            del batch
            iterator = None  # what it read ahead was cut by the old shares
            _recover(ctx, dp, error, holders)
            sampler._rewind(dp.step_count)
            continue
        if dp.step_count != before + 1:
            raise ConfigError(f"chorus.elastic_steps: step_fn must end the step with one "
                              f"chorus.step(); step {before} ran {dp.step_count - before}")
        yield result


def _is_loss(ctx, error):
    """Whether ``error`` is what a lost worker makes a step raise."""
    if ctx._elastic is None:
        return False
    if isinstance(error, CommError):
        return True
    # A gradient bucket's all-reduce starts in an autograd hook: a failure there reaches Python
    # as torch's RuntimeError from backward(), not as chorus's error. The world says why.
    return isinstance(error, RuntimeError) and ctx.world.broken


class _Holders:
    """What the source hands over: the module's values, the optimizer, the scaler, ``state``."""

    def __init__(self, dp, optimizer, scaler, state):
        self.dp = dp
        self.optimizer = optimizer
        self.scaler = scaler
        self.state = state

    def forget_step(self):
        """Drops what the interrupted step left: gradients, the scaler's unscale_ record."""
        self.optimizer.zero_grad(set_to_none=True)
        for parameter in self.dp.module.parameters():
            parameter.grad = None
        if self.scaler is not None:
            # What GradScaler.update() does last: unscale_() refuses a second call per optimizer
            # until then, and the interrupted step may have made the first.
            from torch.amp.grad_scaler import _refresh_per_optimizer_state
            self.scaler._per_optimizer_states = collections.defaultdict(
                _refresh_per_optimizer_state)

    def pack(self, kept):
        entries = {
            "step": self.dp.step_count,
            "balancer": self.dp._core.survivor_balancer_state(kept),
            "model": self.dp.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "state": {name: value.state_dict() for name, value in self.state.items()},
        }
        buffer = io.BytesIO()
        torch.save(entries, buffer)
        return buffer.getvalue()

    def load(self, entries):
        self.dp.module.load_state_dict(entries["model"])
        self.optimizer.load_state_dict(entries["optimizer"])
        if self.scaler is not None:
            self.scaler.load_state_dict(entries["scaler"])
        for name, value in self.state.items():
            value.load_state_dict(entries["state"][name])


def _broadcast_bytes(world, payload, root):
    length = torch.tensor([len(payload) if payload is not None else 0], dtype=torch.int64)
    world.broadcast(length, root).wait()
    if payload is not None:
        data = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    else:
        data = torch.empty(int(length.item()), dtype=torch.uint8)
    world.broadcast(data, root).wait()
    return ctypes.string_at(data.data_ptr(), data.numel())  # torch without numpy has no .numpy()


def _recover(ctx, dp, error, holders):
    session = ctx._elastic
    holders.forget_step()
    ctx._pending.clear()
    start = time.monotonic()
    failure = error
    lost = set()  # over every attempt
    while True:
        try:
            ranks = list(failure.ranks) if isinstance(failure, PeerFailure) else []
            # chorus's errors say where their C++ side raised them; torch's come from backward.
            where = (getattr(failure, "file", "") or "backward", getattr(failure, "line", 0))
            generation = session.agree(dp.step_count, str(failure), ranks, *where)
            lost.update(generation.lost)
            agreed = time.monotonic()
            session.regroup(generation)
            root = generation.rank_of(generation.source)
            payload = None
            if ctx.rank == root:
                kept = [ctx._engine_members.index(m) for m in generation.members]
                payload = holders.pack(kept)
            payload = _broadcast_bytes(ctx.world, payload, root)
            entries = torch.load(io.BytesIO(payload), weights_only=False)
            dp._core.regroup(entries["balancer"], entries["step"])
            ctx._engine_members = list(generation.members)
            if ctx.rank != root:
                holders.load(entries)
            break
        except CommError as again:
            if session.left_out:
                raise
            holders.forget_step()
            failure = again  # another loss while recovering: agree again
    record = Recovery(generation=generation.number, members=list(generation.members),
                      lost=sorted(lost), reason=generation.reason,
                      step=dp.step_count, source=generation.source, shares=dp.shares,
                      agree_seconds=agreed - start, rebuild_seconds=time.monotonic() - agreed)
    ctx.recoveries.append(record)
    dp._core.note_recovery(record.generation, record.agree_seconds, record.rebuild_seconds,
                           record.lost)
    if ctx.rank == 0:
        print(f"chorus: elastic: generation {record.generation}: lost rank "
              f"{','.join(map(str, record.lost))} ({record.reason}); ranks "
              f"{','.join(map(str, record.members))} go on from step {record.step} with shares "
              f"{','.join(map(str, record.shares))}; agreed in {record.agree_seconds:.3f} s, "
              f"rebuilt in {record.rebuild_seconds:.3f} s", file=sys.stderr, flush=True)
