"""chorus for PyTorch: train your own torch.nn.Module across unlike devices.

    import chorus
    chorus.init()                                     # identity from `chorus run`
    model = chorus.DataParallel(net, global_batch=256, balance="adaptive")
    sampler = chorus.ShardSampler(train_set, global_batch=256, seed=0)
    loader = torch.utils.data.DataLoader(train_set, batch_sampler=sampler)
    for x, y in loader:
        loss = F.cross_entropy(model(x), y, reduction="sum")   # the SUM over your samples
        loss.backward()
        chorus.step(optimizer, loss=loss)

Under ``chorus run --elastic``, ``chorus.elastic_steps(loader, step_fn, optimizer, steps)`` runs
the same step in a function and goes on when a worker is lost. See docs/python.md.
"""

import torch  # noqa: F401  (first: chorus._C links the libtorch that torch loads)

from . import _C
from .checkpoint import load, load_state_dict, save, state_dict
from .context import Context, current, init
from .data_parallel import DataParallel
from .elastic import Recovery, elastic_steps
from .errors import (AuthError, CheckpointError, CommError, ConfigError, DeviceError, Error,
                     LaunchError, OutOfMemoryError, PeerFailure, ProtocolError, TimeoutError)
from .sampler import ShardSampler
from .step import StepInfo, step

Communicator = _C.Communicator
Work = _C.Work
__version__ = _C.__version__


def world(context=None):
    """The communicator of all ranks: all_reduce, broadcast, all_gather, send/recv, barrier...
    each with a deadline (``timeout=`` seconds, default the job's); ``wait()`` raises
    :class:`chorus.TimeoutError` naming the ranks that did not arrive."""
    return current(context).world


def rank(context=None):
    return current(context).rank


def world_size(context=None):
    return current(context).world_size
