"""ShardSampler: each rank's share of every global batch, as a DataLoader ``batch_sampler``.

The global batches are those of chorus's C++ sampler (src/data/sampler.cc): a pure function of
(dataset size, global batch, seed, shuffle) and the step, the same on every rank whatever the
world size or the shares, so that training matches single-process training on the same batches.
An epoch is ``len(dataset) // global_batch`` steps; the last ``len % global_batch`` ids of each
epoch's permutation are dropped, so every batch is full. Rank r takes the contiguous slice of
each global batch that the current shares give it, and a change of shares by the balancer
applies from the next batch the DataLoader asks for (the next step, with ``num_workers=0``).
"""

import torch.utils.data

from . import _C
from .context import current
from .errors import CheckpointError, ConfigError


class ShardSampler(torch.utils.data.Sampler):
    """Yields this rank's sample ids of each global batch, one list per step.

    ``DataLoader(dataset, batch_sampler=ShardSampler(dataset, global_batch=B, seed=0))``.
    Iterating yields the rest of the current epoch; the position (global step) is state:
    ``state_dict()`` / ``load_state_dict()``, or :func:`chorus.save` / :func:`chorus.load`.
    ``len()`` is the number of steps in an epoch.

    With ``DataLoader(num_workers=N)`` the loader reads its batch sampler ahead (N x
    prefetch_factor batches): a rebalance then applies that many steps late on every rank, and
    the balancer is told the shares each step really ran with (the same read-ahead on every rank
    is required; chorus.step raises ConfigError when the ranks' batches do not add up).
    """

    def __init__(self, dataset, global_batch, seed=0, shuffle=True, context=None):
        super().__init__()
        self._context = current(context)
        size = len(dataset)
        self._global = _C.GlobalSampler(size, int(global_batch), int(seed), bool(shuffle))
        self.global_batch = int(global_batch)
        self.dataset_size = size
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self._next_step = 0

    def __len__(self):
        return self._global.batches_per_epoch

    @property
    def epoch(self):
        """The epoch of the next step to be yielded, from 0."""
        return self._global.epoch_of(self._next_step)

    @property
    def step(self):
        """The global step of the next batch to be yielded, from 0."""
        return self._next_step

    def global_batch_ids(self, step):
        """The ids of global step ``step`` (all ranks'), in order."""
        return self._global.batch(step)

    def __iter__(self):
        per_epoch = self._global.batches_per_epoch
        end = (self._next_step // per_epoch + 1) * per_epoch
        while self._next_step < end:
            step = self._next_step
            shares = self._context.shares(self.global_batch)
            rank = self._context.rank
            ids = _C.shard_of(self._global.batch(step), shares, rank)
            if self._context.data_parallel is not None:  # chorus.step will consume it
                self._context._note_batch(self, step, len(ids))
            self._next_step += 1
            yield ids

    def _rewind(self, step):
        """Elastic recovery: the next batch yielded is global step ``step``'s, cut by the shares
        of then; the batches cut before (for the old world) are forgotten."""
        self._context._drop_batches(self)
        self._next_step = int(step)

    def _resume_step(self):
        """The first step no chorus.step has consumed (what a checkpoint must resume from)."""
        pending = [step for sampler, step, _ in self._context._pending if sampler is self]
        return min(pending) if pending else self._next_step

    def state_dict(self):
        step = self._resume_step()
        state = self._global.state(step)
        state.update(global_batch=self.global_batch, dataset_size=self.dataset_size,
                     seed=self.seed, shuffle=self.shuffle)
        return state

    def load_state_dict(self, state):
        for key, mine in (("global_batch", self.global_batch),
                          ("dataset_size", self.dataset_size), ("seed", self.seed),
                          ("shuffle", self.shuffle)):
            if state.get(key) != mine:
                raise CheckpointError(f"sampler state of another sampler: {key} {state.get(key)}, "
                                      f"this sampler has {mine}")
        try:
            step = self._global.resume(state["epoch"], state["position"], state["step"])
        except ConfigError as error:
            raise CheckpointError(f"sampler state does not fit: {error}") from error
        self._context._drop_batches(self)
        self._next_step = step
