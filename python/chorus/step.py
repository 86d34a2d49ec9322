"""chorus.step(optimizer): the end of a training step on every rank.

In order: the gradient reduction completes (an emulated device first releases its held buckets
and pads its compute), a ``torch.amp.GradScaler`` unscales and looks for overflows, every rank's
figures are all-gathered (compute time, wait, loss, overflow, samples), all ranks skip the
optimizer step together when any overflowed, the balancer sets the next shares, and the
gradients are cleared. Under ZeRO (``DataParallel(zero=...)``) the optimizer steps this rank's
slice of the parameters (python/chorus/zero.py) and the slices are all-gathered after it.
"""

import dataclasses

import torch

from . import zero as _zero
from .context import current
from .errors import ConfigError


@dataclasses.dataclass
class StepInfo:
    """What every rank learned at the end of a step (the same on every rank)."""

    step: int                 # the step just finished, from 0
    loss: float               # Σ over ranks of the ``loss`` given to step() / global_batch
    skipped: bool             # the optimizer step was skipped (an overflow on some rank)
    shares: list              # samples each rank took in this step
    next_shares: list         # shares of the coming step
    compute_seconds: list     # per rank, as its (emulated) device would have taken
    wait_seconds: list        # per rank, blocked for the gradient reduction after backward
    rebalance: str            # the balancer's explanation when the shares changed, else ""


def _found_inf(scaler, optimizer):
    return scaler._found_inf_per_device(optimizer)  # set by unscale_(); GradScaler's own helper


def _learning_rate(optimizer):
    groups = optimizer.param_groups
    return float(groups[0]["lr"]) if groups and "lr" in groups[0] else 0.0


def step(optimizer, scaler=None, loss=None, context=None):
    """Ends the step: reduce, agree on overflows, step the optimizer, feed the balancer.

    ``optimizer``: steps the wrapped module's parameters. ``scaler``: a ``torch.amp.GradScaler``
    whose ``scale(loss)`` was back-propagated; chorus calls its ``unscale_``, ``step`` and
    ``update`` (do not call them yourself), and when any rank overflowed every rank skips the
    step and lowers its scale alike. ``loss``: this rank's loss sum (a tensor or float), to
    report the global mean loss in the result. Returns a :class:`StepInfo`.
    """
    ctx = current(context)
    dp = ctx.data_parallel
    if dp is None:
        raise ConfigError("chorus.step() needs a chorus.DataParallel in this process")
    core = dp._core
    core.synchronize()
    if dp._zero is not None:  # the optimizer steps this rank's slice, with its gradient
        _zero.attach_gradients(_zero.shard(dp, optimizer))
    overflow = False
    scaling = scaler is not None and scaler.is_enabled()
    if scaling:
        scaler.unscale_(optimizer)
        overflow = any(float(t.item()) > 0 for t in _found_inf(scaler, optimizer).values())
    loss_sum = 0.0
    if loss is not None:
        loss_sum = float(loss.detach().float().item()) if isinstance(loss, torch.Tensor) \
            else float(loss)
    scale = float(scaler.get_scale()) if scaling and core.observing else 0.0  # before update()
    batch = ctx._take_batch()
    samples = batch[2] if batch is not None else -1
    figures = core.finish_step(loss_sum, overflow, samples)
    if scaling:
        if figures["overflow"]:
            for found in _found_inf(scaler, optimizer).values():
                found.fill_(1.0)  # another rank overflowed: skip together, lower the scale alike
        scaler.step(optimizer)
        scaler.update()
    elif not figures["overflow"]:
        optimizer.step()
    if dp._zero is not None and not figures["overflow"]:
        dp._zero.gather_parameters()  # every rank's stepped slice into the parameters (1 and 2)
    optimizer.zero_grad(set_to_none=True)
    if core.observing:  # `chorus run --metrics-port/--trace`: the step's report and timeline
        core.end_step(_learning_rate(optimizer), scale, loss is not None)
    return StepInfo(step=figures["step"], loss=figures["loss"], skipped=figures["overflow"],
                    shares=figures["samples"], next_shares=figures["shares"],
                    compute_seconds=figures["compute_seconds"],
                    wait_seconds=figures["wait_seconds"], rebalance=figures["rebalance"])
