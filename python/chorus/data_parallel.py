"""DataParallel: a torch module trained with chorus's uneven shares, reducer and balancer.

Wrapping a module hooks chorus's C++ bucketed gradient reducer onto its parameters: each bucket's
all-reduce starts from an autograd hook while backward still runs, and the reduction writes
``sum over all ranks / global_batch`` into every ``.grad``, which is the gradient of
single-process training on the whole global batch when every rank back-propagates the SUM of its
samples' losses (``reduction="sum"``), whatever the shares. The time from each forward to the end
of the step's backward is the rank's compute; an emulated device (``cpu@0.5``) is padded there,
and every rank's compute feeds the load balancer that sets the next step's shares.
"""

import atexit
import contextlib
import os

import torch

from . import _C
from . import zero as _zero
from .context import current
from .errors import ConfigError


def _leading_size(args, kwargs):
    """Samples in a forward: the leading dimension of its first tensor argument (0 if none)."""
    for value in list(args) + list(kwargs.values()):
        if isinstance(value, torch.Tensor):
            return int(value.shape[0]) if value.dim() > 0 else 0
    return 0


def _flush_observation(core, pid):
    if os.getpid() == pid:  # not in a forked DataLoader worker
        core.flush_observation()


class DataParallel(torch.nn.Module):
    """Data parallelism over chorus's ranks with uneven, balanced shares of each global batch.

    Arguments:
      module: the model (its parameters on this worker's device, fp32 or any float type).
      global_batch: samples per step over all ranks (B); REQUIRES >= the number of ranks.
      balance: ``"adaptive"`` (default; refit every step and move samples whenever it pays),
        ``"static"`` (profile, rebalance once, keep) or ``"fixed"`` (keep the initial shares).
      shares: initial shares, one per rank, each >= 1, summing to B (default: equal split).
      bucket_cap_mb: cap of the gradient buckets after the first, MiB (default 25, DDP's).
      overlap: launch bucket all-reduces during backward (default True).
      algorithm: the gradient all-reduce over groups of ranks by host and device vendor, as
        chorus train's comm.algorithm: ``"flat"`` (default: on the device where one native
        collective spans the world, e.g. NCCL, else in host memory), ``"hierarchical"``, ``"2d"``
        or ``"auto"`` (reduce in each group, across groups through host memory: the bridge
        between a GPU group and CPU ranks). ZeRO stages 2 and 3 take only ``"flat"``.
      zero: ZeRO stage (default 0, everything replicated): 1 shards the optimizer state, 2 the
        gradients too (each bucket reduce-scattered during backward), 3 the parameters too (the
        module holds no values between steps and is all-gathered from the slices at the step's
        first forward). ``chorus.step(optimizer)`` then steps this rank's slice only, with the
        user's optimizer (see python/chorus/zero.py for which optimizers qualify).
      shards: how big each rank's slice is: ``"memory"`` (default; by each device's memory budget,
        ``chorus run --devices cpu/2GiB,...``, an even split when no device has one),
        ``"even"``, or a list of fractions, one per rank, summing to 1. Only with ``zero >= 1``.
      context: a :class:`chorus.Context` (default: the one ``chorus.init()`` made).

    At construction every rank's parameters and buffers are overwritten with rank 0's (as DDP
    does); buffers are not synchronized later (BatchNorm statistics stay per rank). A step with
    several backward passes (gradient accumulation) runs all but the last in ``no_sync()``. The
    step ends with :func:`chorus.step`. Forwards without gradients (``torch.no_grad()``) or in
    ``eval()`` mode are plain forwards of the module.
    """

    def __init__(self, module, global_batch, balance="adaptive", shares=None, bucket_cap_mb=25.0,
                 overlap=True, zero=0, shards=None, algorithm="flat", context=None):
        super().__init__()
        self.module = module
        context = current(context)
        if context.data_parallel is not None:  # refused before any collective of a second one
            raise ConfigError("this process has a chorus.DataParallel already (one per job)")
        stage, kind, fractions = _zero.parse_options(zero, shards, context.world_size)
        if stage > 0 and context.elastic:
            raise ConfigError(
                f"DataParallel(zero={stage}) in an elastic job: a lost rank's slice of the "
                "optimizer state is held nowhere else, and the Python front does not rebuild "
                "slices (chorus train does, from replicas or checkpoints); use zero=0, or "
                "chorus.init(elastic=False)")
        parameters = [p for p in module.parameters() if p.requires_grad]
        self._core = _C.DataParallelCore(context.worker, parameters, int(global_batch), balance,
                                         [int(s) for s in (shares or [])], float(bucket_cap_mb),
                                         bool(overlap), stage, kind, fractions,
                                         context._observe, str(algorithm))
        self._core.broadcast_from_rank_zero(
            [t.data for t in module.parameters()] + [b for b in module.buffers()])
        self._trained = parameters  # the core's parameter list (its indices)
        self._zero = self._core.zero  # None without ZeRO
        if self._zero is not None:
            self._zero.start()  # the slices from rank 0's values; stage 3 drops the parameters
        self._context = context
        self._no_sync = False
        context._attach(self)
        if self._core.observing:  # a trace cut short by the program's end is still written
            atexit.register(_flush_observation, self._core, os.getpid())

    def forward(self, *args, **kwargs):
        if self.training and torch.is_grad_enabled():
            self._core.begin_forward(not self._no_sync, _leading_size(args, kwargs))
            output = self.module(*args, **kwargs)
            self._core.end_forward()
            return output
        with _zero.gathered(self):  # ZeRO-3 outside a step: gathered for this forward only
            return self.module(*args, **kwargs)

    def gathered(self):
        """A context in which a ZeRO-3 module's parameters hold their values (for reading them,
        e.g. ``state_dict()``); collective: every rank enters it. Nothing to do otherwise."""
        return _zero.gathered(self)

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside only accumulate into ``.grad`` (all micro-batches but the last)."""
        previous, self._no_sync = self._no_sync, True
        try:
            yield
        finally:
            self._no_sync = previous

    def synchronize(self):
        """Finishes this step's gradient reduction now (chorus.step does it when not done yet):
        for code that needs the averaged gradients before the optimizer, e.g. clipping."""
        self._core.synchronize()

    @property
    def global_batch(self):
        return self._core.global_batch

    @property
    def shares(self):
        """Samples each rank takes in the coming step (a list, Σ = global_batch)."""
        return list(self._core.shares)

    @property
    def local_share(self):
        """This rank's share of the coming step."""
        return self._core.local_share

    @property
    def step_count(self):
        """Steps finished by chorus.step."""
        return self._core.step

    @property
    def zero_stage(self):
        """The ZeRO stage (0: none)."""
        return self._zero.stage if self._zero is not None else 0

    @property
    def shard_fractions(self):
        """Each rank's fraction of the flattened parameters under ZeRO (empty without)."""
        return list(self._zero.fractions) if self._zero is not None else []

    @property
    def shard_bounds(self):
        """Rank r's slice is [shard_bounds[r], shard_bounds[r + 1]) of the flattened parameters
        (empty without ZeRO)."""
        return list(self._zero.bounds) if self._zero is not None else []

    @property
    def num_buckets(self):
        return self._core.num_buckets
