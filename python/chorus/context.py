"""chorus.init(): this process's place in the job, and the default context the API uses.

A :class:`Context` holds the C++ worker (identity, store, world communicator, device emulation),
the job's :class:`chorus.DataParallel` once one is made, and the shares each
:class:`chorus.ShardSampler` batch was cut with. ``chorus.init()`` makes one and keeps it as the
process's default, as ``torch.distributed.init_process_group`` keeps its default group: every
other call takes a ``context=`` argument and uses the default only when it is None, so a test can
run several contexts in one process. The environment is read once, by ``init()``.
"""

import collections
import os
import weakref

import torch  # noqa: F401  (loads the libtorch that chorus._C links, before it)

from . import _C
from .errors import ConfigError

_default = None
# Every context of this process, and, in a forked child, their workers kept for its whole life.
_live = weakref.WeakSet()
_kept_in_child = []


def _keep_workers_in_child():
    # A forked child (a DataLoader worker) has none of the parent's threads: destroying a C++
    # worker there, when the garbage collector frees a context the parent had dropped, would wait
    # forever for the communicator's threads. The child keeps them all until it exits.
    _kept_in_child.extend(context.worker for context in list(_live))


os.register_at_fork(after_in_child=_keep_workers_in_child)


class Context:
    """One worker's view of the job. Made by :func:`init`; not copyable, not thread-safe."""

    def __init__(self, worker):
        self.worker = worker
        self.data_parallel = None
        # (sampler, step, share) of each batch a ShardSampler cut and no chorus.step consumed
        # yet, oldest first (a DataLoader with workers reads its sampler ahead).
        self._pending = collections.deque()
        _live.add(self)

    @property
    def rank(self):
        return self.worker.rank

    @property
    def world_size(self):
        return self.worker.world_size

    @property
    def world(self):
        """The communicator of all ranks (:class:`chorus.Communicator`)."""
        return self.worker.world

    @property
    def device(self):
        """The torch device this worker computes on, e.g. ``torch.device("cpu")``."""
        return torch.device(self.worker.device)

    def shares(self, global_batch):
        """The shares of the coming step: the DataParallel's, or an equal split without one."""
        if self.data_parallel is not None:
            if self.data_parallel.global_batch != global_batch:
                raise ConfigError(
                    f"a sampler with global_batch {global_batch} next to a DataParallel with "
                    f"global_batch {self.data_parallel.global_batch}: they must agree")
            return list(self.data_parallel.shares)
        world = self.world_size
        return [global_batch // world + (1 if r < global_batch % world else 0)
                for r in range(world)]

    def _attach(self, data_parallel):
        if self.data_parallel is not None:
            raise ConfigError("this process has a chorus.DataParallel already (one per job)")
        self.data_parallel = data_parallel

    def _note_batch(self, sampler, step, share):
        self._pending.append((sampler, step, share))

    def _take_batch(self):
        """The oldest batch not consumed yet, as (sampler, step, share), or None."""
        return self._pending.popleft() if self._pending else None

    def _drop_batches(self, sampler):
        self._pending = collections.deque(p for p in self._pending if p[0] is not sampler)


def init(environment=None, single_thread=True):
    """Joins the job: identity from ``chorus run`` (or mpirun / srun; a job of one otherwise).

    Reads the environment once (or ``environment``, a dict, instead), connects to the job's
    store and joins the world communicator, waiting at most the job's deadline for the other
    ranks (:class:`chorus.TimeoutError` names the absent ones). ``single_thread``: a CPU worker
    computes on the intra-op threads ``chorus run`` gives it, as chorus's workers do: one, or the
    node's spare cores for a CPU at full speed beside GPUs or alone (default True; False keeps
    PyTorch's setting). The first context made
    becomes the default that the rest of the API uses; calling ``init()`` again returns it.
    """
    global _default
    if _default is not None and environment is None:
        return _default
    context = Context(_C.init(environment, single_thread))
    if _default is None:
        _default = context
    return context


def current(context=None):
    """``context`` if given, else the default one; ConfigError before :func:`init`."""
    if context is not None:
        return context
    if _default is None:
        raise ConfigError("chorus.init() has not been called in this process")
    return _default
