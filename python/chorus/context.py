"""chorus.init(): this process's place in the job, and the default context the API uses.

A :class:`Context` holds the C++ worker (identity, store, world communicator, device emulation),
the job's :class:`chorus.DataParallel` once one is made, and the shares each
:class:`chorus.ShardSampler` batch was cut with. ``chorus.init()`` makes one and keeps it as the
process's default, as ``torch.distributed.init_process_group`` keeps its default group: every
other call takes a ``context=`` argument and uses the default only when it is None, so a test can
run several contexts in one process. The environment is read once, by ``init()``.
"""

import atexit
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
    # The same for an elastic membership, whose monitor thread the child does not have either, and
    # for a node's metrics monitor (CHORUS_METRICS_PORT), whose server and receiver threads too.
    for context in list(_live):
        _kept_in_child.append(context.worker)
        if context._elastic is not None:
            _kept_in_child.append(context._elastic)
        if context._observation is not None:
            _kept_in_child.append(context._observation)


os.register_at_fork(after_in_child=_keep_workers_in_child)
_parent_pid = os.getpid()


def _close_elastic_sessions():
    # The membership's monitor thread must end before the interpreter tears down what it uses; a
    # forked child that runs atexit handlers (it has no monitor of its own) leaves the parent's.
    if os.getpid() != _parent_pid:
        return
    for context in list(_live):
        if context._elastic is not None:
            context._elastic.close()


atexit.register(_close_elastic_sessions)


def _finish_observations():
    # CHORUS_TRACE without an agent (mpirun, srun, torchrun): each rank hands its trace part to
    # rank 0, which merges them (runtime/launch/job_observation.h). Registered before any
    # DataParallel's flush, so it runs after them (atexit is last in, first out); the flush is
    # repeated here, harmlessly, for the order's sake.
    if os.getpid() != _parent_pid:
        return
    for context in list(_live):
        if context._observation is None:
            continue
        if context.data_parallel is not None:
            context.data_parallel._core.flush_observation()
        context._observation.finish()


atexit.register(_finish_observations)


class Context:
    """One worker's view of the job. Made by :func:`init`; not copyable, not thread-safe."""

    def __init__(self, worker, elastic=None, observe=None, observation=None):
        self.worker = worker
        self.data_parallel = None
        # What `chorus run --metrics-port/--trace` asks of this worker (its DataParallel reports
        # each step to the agent and records the timeline: python/src/step_observer.h), or, under
        # another launcher, CHORUS_METRICS_PORT / CHORUS_TRACE, which the job serves itself
        # (`observation`, a _C.JobObservation: the node's first rank serves the metrics, rank 0
        # merges the trace at exit).
        self._observation = observation
        self._observe = observe if observe is not None else _C.ObserveRequest()
        # Elastic recovery (python/chorus/elastic.py): the membership, the launch ranks of the
        # world the DataParallel's reducer runs on, and what each recovery did.
        self._elastic = elastic
        self._engine_members = list(elastic.current().members) if elastic is not None else None
        self.recoveries = []
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
    def member(self):
        """The rank this worker was launched as; ``rank`` is its place in the current world,
        which changes when an elastic job loses a worker (``member`` never does)."""
        return self.worker.member

    @property
    def elastic(self):
        """Whether a lost worker is recovered from (:func:`chorus.elastic_steps`)."""
        return self._elastic is not None

    @property
    def generation(self):
        """The elastic generation: 0 as launched, one more after each recovery (0 when not
        elastic)."""
        return self._elastic.current().number if self._elastic is not None else 0

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


def init(environment=None, single_thread=True, elastic=None, heartbeat=1.0, heartbeat_misses=3):
    """Joins the job: identity from ``chorus run`` (or mpirun / srun; a job of one otherwise).

    Reads the environment once (or ``environment``, a dict, instead), connects to the job's
    store and joins the world communicator, waiting at most the job's deadline for the other
    ranks (:class:`chorus.TimeoutError` names the absent ones). ``single_thread``: a CPU worker
    computes on the intra-op threads ``chorus run`` gives it, as chorus's workers do: one, or the
    node's spare cores for a CPU at full speed beside GPUs or alone (default True; False keeps
    PyTorch's setting). The first context made
    becomes the default that the rest of the API uses; calling ``init()`` again returns it.

    Metrics and a timeline (docs/python.md, "Metrics and timeline"): under ``chorus run
    --metrics-port/--trace`` the agent's; under mpirun, srun or torchrun (or none) the job's own
    when ``CHORUS_METRICS_PORT`` / ``CHORUS_TRACE`` are set: each node's first rank serves its
    node's ``/metrics`` from here on, and rank 0 merges the trace when its process exits.

    ``elastic``: recover from a lost worker in :func:`chorus.elastic_steps` (docs/python.md,
    "Elastic"). None (default): when the job was started by ``chorus run --elastic``; True
    requires that (ConfigError otherwise); False never. An elastic worker's membership then
    starts here, collectively: each worker beats every ``heartbeat`` seconds, and one that misses
    ``heartbeat_misses`` beats (a hung or stopped process) is lost.
    """
    global _default
    if _default is not None and environment is None:
        return _default
    if elastic not in (None, True, False):
        raise ConfigError(f"elastic must be None, True or False, got {elastic!r}")
    # Before joining: a request that cannot be served (the agent's socket without its agent,
    # CHORUS_METRICS_PORT under chorus run) is refused at once.
    observe = _C.observe_request(environment)
    worker = _C.init(environment, single_thread)
    # Without an agent the ranks serve the metrics and merge the trace themselves (collective).
    observation = _C.observe_job(worker, observe)
    if observation is not None:
        observe = observation.request
    if elastic is None:
        elastic = _C.launched_elastic(worker)
    session = None
    if elastic:
        session = _C.ElasticSession(worker, float(heartbeat), int(heartbeat_misses))
    context = Context(worker, session, observe, observation)
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
