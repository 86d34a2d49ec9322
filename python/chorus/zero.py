"""ZeRO for chorus.DataParallel(zero=1|2|3): the user's optimizer steps this rank's slice only.

The C++ side (python/src/zero_core.h) flattens the module's trainable parameters in the gradient
reducer's order and gives rank r one contiguous slice of them, with an fp32 master copy and the
slice's averaged gradient. At the first ``chorus.step(optimizer)`` the optimizer is *sharded*:
in each of its param groups, every parameter of the module is replaced by views of the master
slice, one per parameter that overlaps this rank's slice (none when it lies elsewhere), and any
state it had is cut the same way. The optimizer then keeps state for the slice alone and its
step updates the master slice, which the C++ side all-gathers back into the parameters. An
element-wise optimizer (SGD, Adam, AdamW, RMSprop, Adagrad...) computes exactly what it would on
the whole parameters; one that looks across a parameter (LAMB, LARS, Adafactor's factored
moments) would see pieces of it and is not supported.

A checkpoint holds the optimizer's state *consolidated*: :func:`full_state_dict` puts every
rank's pieces back together into the state dict the optimizer would have without ZeRO (rank 0
gets it), and :func:`load_state_dict` loads one into a sharded optimizer by un-sharding it,
loading, and sharding it again over this job's slices: any world size, shards or stage.
"""

import collections
import contextlib
import ctypes
import io

import torch

from .errors import ConfigError

_STAGES = (0, 1, 2, 3)
_SHARD_NAMES = ("memory", "even")
# Tags of the point-to-point messages that bring rank 0 the optimizer state of every slice.
_SIZE_TAG, _DATA_TAG = 7101, 7102


def parse_options(zero, shards, world_size):
    """(stage, shards kind, fractions) for the C++ core; ConfigError on what it cannot run."""
    if isinstance(zero, bool) or not isinstance(zero, int) or zero not in _STAGES:
        raise ConfigError(f"zero must be 0, 1, 2 or 3, got {zero!r}")
    if shards is None:
        return zero, "memory", []
    if zero == 0:
        raise ConfigError(f"shards={shards!r} needs zero >= 1 (stage 0 replicates everything)")
    if isinstance(shards, str):
        if shards not in _SHARD_NAMES:
            raise ConfigError(f"shards {shards!r} is unknown: expected \"memory\", \"even\" or "
                              f"a list of fractions, one per rank")
        return zero, shards, []
    if isinstance(shards, (list, tuple)):
        if len(shards) != world_size:
            raise ConfigError(f"shards has {len(shards)} fractions for {world_size} ranks")
        try:
            fractions = [float(f) for f in shards]
        except (TypeError, ValueError) as error:
            raise ConfigError(f"shards must be numbers, got {shards!r}") from error
        return zero, "list", fractions
    raise ConfigError(f"shards must be \"memory\", \"even\" or a list of fractions, "
                      f"got {shards!r}")


class _Sharding:
    """What sharding did to one optimizer: its groups' original parameters, and the pieces."""

    def __init__(self, zero, original, pieces):
        self.zero = zero
        self.original = original        # per group, the parameters it was given
        self.pieces = pieces            # (parameter index, offset, master view, gradient view)


def _is_sharded(key, value, numel):
    return torch.is_tensor(value) and key != "step" and value.dim() > 0 and value.numel() == numel


def shard(data_parallel, optimizer):
    """Points ``optimizer`` at this rank's slice (once; later calls return its sharding)."""
    zero = data_parallel._zero
    sharding = getattr(optimizer, "_chorus_zero", None)
    if sharding is not None:
        if sharding.zero is not zero:
            raise ConfigError("this optimizer was sharded for another chorus.DataParallel")
        return sharding
    parameters = data_parallel._trained
    index_of = {id(p): i for i, p in enumerate(parameters)}
    master, gradient = zero.master_slice(), zero.gradient_slice()
    views = collections.defaultdict(list)
    for index, offset, at, count in zero.pieces():
        views[index].append((offset, master[at:at + count], gradient[at:at + count]))
    original = [list(group["params"]) for group in optimizer.param_groups]
    pieces, seen, moved = [], set(), {}
    for group in optimizer.param_groups:
        kept = []
        for parameter in group["params"]:
            index = index_of.get(id(parameter))
            if index is None:  # not the module's: the optimizer steps it whole, as without ZeRO
                kept.append(parameter)
                continue
            if index in seen:
                raise ConfigError("a parameter appears twice in the optimizer's param groups")
            seen.add(index)
            state = optimizer.state.pop(parameter, None)
            for offset, piece, piece_gradient in views[index]:
                kept.append(piece)
                pieces.append((index, offset, piece, piece_gradient))
                if state:
                    moved[piece] = {key: value.detach().reshape(-1)[offset:offset + piece.numel()]
                                    .clone() if _is_sharded(key, value, parameter.numel())
                                    else value for key, value in state.items()}
        group["params"] = kept
    optimizer.state.update(moved)
    sharding = _Sharding(zero, original, pieces)
    optimizer._chorus_zero = sharding
    return sharding


def attach_gradients(sharding):
    """Gives each piece its slice of the averaged gradient (a zero_grad may have unset it)."""
    for _, _, piece, gradient in sharding.pieces:
        piece.grad = gradient


def unshard(optimizer):
    """Gives the optimizer back its own parameters (the pieces' state is dropped)."""
    sharding = getattr(optimizer, "_chorus_zero", None)
    if sharding is None:
        return
    for _, _, piece, _ in sharding.pieces:
        optimizer.state.pop(piece, None)
    for group, parameters in zip(optimizer.param_groups, sharding.original):
        group["params"] = list(parameters)
    del optimizer._chorus_zero


def full_state_dict(data_parallel, optimizer, context):
    """Collective: the optimizer's state dict as it would be without ZeRO, on rank 0 (None on the
    other ranks). Every rank sends rank 0 its pieces' state."""
    sharding = getattr(optimizer, "_chorus_zero", None)
    if sharding is None:  # never stepped under ZeRO: nothing is sharded yet
        return optimizer.state_dict() if context.rank == 0 else None
    mine = []
    for index, offset, piece, _ in sharding.pieces:
        state = optimizer.state.get(piece)
        if state:
            mine.append((index, offset, piece.numel(), dict(state)))
    everyone = _gather_to_rank_zero(context, mine)
    if context.rank != 0:
        return None
    found = collections.defaultdict(list)
    for part in everyone:
        for index, offset, count, state in part:
            found[index].append((offset, count, state))
    index_of = {id(p): i for i, p in enumerate(data_parallel._trained)}
    state, groups, number = {}, [], 0
    for group, parameters in zip(optimizer.param_groups, sharding.original):
        numbers = []
        for parameter in parameters:
            index = index_of.get(id(parameter))
            if index is None:
                own = optimizer.state.get(parameter)
                if own:
                    state[number] = own
            elif found[index]:
                state[number] = _joined(sorted(found[index], key=lambda p: p[0]), parameter)
            numbers.append(number)
            number += 1
        groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": numbers})
    return {"state": state, "param_groups": groups}


def _joined(parts, parameter):
    """One parameter's state from its pieces' (offset, count, state), in offset order."""
    whole = {}
    for key, value in parts[0][2].items():
        if _is_sharded(key, value, parts[0][1]):
            joined = torch.cat([state[key].reshape(-1) for _, _, state in parts])
            if joined.numel() != parameter.numel():
                raise ConfigError(f"ZeRO: the pieces of '{key}' hold {joined.numel()} of "
                                  f"{parameter.numel()} elements")
            whole[key] = joined.reshape(parameter.shape)
        else:
            whole[key] = value
    return whole


def load_state_dict(data_parallel, optimizer, state):
    """Loads a whole (consolidated) optimizer state dict into an optimizer that may be sharded."""
    sharded = getattr(optimizer, "_chorus_zero", None) is not None
    unshard(optimizer)
    optimizer.load_state_dict(state)
    if sharded:
        shard(data_parallel, optimizer)


@contextlib.contextmanager
def gathered(data_parallel):
    """Stage 3: the parameters hold their values inside (collective); nothing otherwise."""
    zero = data_parallel._zero
    if zero is None or zero.gathered:
        yield
        return
    zero.gather()
    try:
        yield
    finally:
        zero.release()


def _gather_to_rank_zero(context, value):
    """Collective: every rank's ``value`` (anything torch.save takes), as a list by rank, on rank
    0 (None elsewhere), sent point to point so that no other rank holds them all."""
    world = context.world
    if context.rank != 0:
        buffer = io.BytesIO()
        torch.save(value, buffer)
        data = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)
        world.send(torch.tensor([data.numel()], dtype=torch.int64), 0, tag=_SIZE_TAG).wait()
        world.send(data, 0, tag=_DATA_TAG).wait()
        return None
    values = [value]
    for rank in range(1, context.world_size):
        size = torch.zeros(1, dtype=torch.int64)
        world.recv(size, rank, tag=_SIZE_TAG).wait()
        data = torch.empty(int(size.item()), dtype=torch.uint8)
        world.recv(data, rank, tag=_DATA_TAG).wait()
        raw = ctypes.string_at(data.data_ptr(), data.numel())
        values.append(torch.load(io.BytesIO(raw), weights_only=False))
    return values
