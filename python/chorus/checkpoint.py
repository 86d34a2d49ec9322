"""Checkpoints: chorus's state (step, balancer, sampler, every rank's RNG) next to the user's.

``chorus.save(path, model=..., optimizer=..., sampler=...)`` writes one file with the state dicts
of what it is given and chorus's own state; every rank calls it (it is collective: rank 0
gathers every rank's RNG state and writes). The file is written to a temporary name and renamed,
so a job killed while saving leaves the previous checkpoint whole, and a SHA-256 of its bytes in
``path + ".sha256"`` is checked by ``chorus.load``, which raises CheckpointError on a damaged
file. ``chorus.load(path, model=..., optimizer=..., sampler=...)`` restores all of it on every
rank (the file must be readable by every rank: one host, or a shared file system).

A checkpoint taken on another number of ranks restores the model, optimizer, step and sampler
(the global batches do not depend on the world size) but not the balancer or the RNG states,
which are per rank: the balancer then profiles the new devices afresh.

Under ZeRO (``DataParallel(zero=...)``) the file is the same: the model whole (stage 3 gathers
it for the save) and the optimizer's state consolidated from every rank's slice into the state
dict it would have without ZeRO (python/chorus/zero.py), so a job of any stage, shards or world
size loads it and cuts it into its own slices.

The file is a ``torch.save`` of a dict that libtorch's C++ unpickler reads too, so that ``chorus
checkpoint consolidate FILE`` (src/runtime/checkpoint/python_checkpoint.cc) writes its model as
one model.pt without Python. libtorch reads only some of what Python pickles: it refuses the
whole file over one int beyond 32 bits (every ``random.getstate()`` holds some), a set, bytes, a
complex, a dtype, a sparse tensor or an instance of a class, and reads an ``OrderedDict`` as
None. So the outer dict holds only::

    "chorus":  {"format": "chorus-python-checkpoint/1"}
    "model":   {name: tensor}  (the state dict's dense tensors; only when a model was saved)
    "model_python_only": [name, ...]  (its other entries: non-tensors such as extra states,
                                        sparse or quantized tensors; stored in "python")
    "python":  uint8 tensor, the ``torch.save`` bytes of everything else: chorus's own state,
               ``extra``, the optimizer's, the scaler's, the model's other entries, its key order
               and ``_metadata``

and ``chorus.load`` puts the two back together. It also reads files of the earlier layout (one
dict of "chorus", "extra", "model", "optimizer", "scaler"), which libtorch could not.
"""

import collections
import contextlib
import ctypes
import hashlib
import io
import os
import random

import torch

from . import zero as _zero
from .context import current
from .errors import CheckpointError

_FORMAT = "chorus-python-checkpoint/1"


def _gather_rng(ctx):
    """Every rank's torch CPU RNG state, on every rank (a list indexed by rank)."""
    mine = torch.get_rng_state()
    out = torch.empty(mine.numel() * ctx.world_size, dtype=torch.uint8)
    ctx.world.all_gather(mine, out).wait()
    # One tensor of its own per rank: torch.set_rng_state crashed (SIGSEGV, torch 2.15) on a row
    # view of the gathered tensor, whose storage offset is not 0.
    return [row.clone() for row in out.view(ctx.world_size, -1)]


def state_dict(sampler=None, context=None):
    """chorus's state of this job as a dict (collective: gathers every rank's RNG state)."""
    ctx = current(context)
    dp = ctx.data_parallel
    return {
        "format": _FORMAT,
        "world_size": ctx.world_size,
        "step": dp.step_count if dp is not None else None,
        "global_batch": dp.global_batch if dp is not None else None,
        "balancer": dp._core.balancer_state() if dp is not None else None,
        "sampler": sampler.state_dict() if sampler is not None else None,
        "torch_rng": _gather_rng(ctx),
        "python_rng": random.getstate(),
    }


def load_state_dict(state, sampler=None, context=None):
    """Restores what :func:`state_dict` returned (see the module's note on other world sizes)."""
    ctx = current(context)
    if state.get("format") != _FORMAT:
        raise CheckpointError(f"not a chorus checkpoint state (format {state.get('format')!r})")
    same_world = state["world_size"] == ctx.world_size
    dp = ctx.data_parallel
    if dp is not None and state["step"] is not None:
        if state["global_batch"] != dp.global_batch:
            raise CheckpointError(f"checkpoint of global_batch {state['global_batch']}, this job "
                                  f"has {dp.global_batch}")
        balancer = state["balancer"] if same_world else dp._core.balancer_state()
        dp._core.restore(balancer, state["step"])
    if sampler is not None:
        if state["sampler"] is None:
            raise CheckpointError("the checkpoint holds no sampler state")
        sampler.load_state_dict(state["sampler"])
    if same_world:
        torch.set_rng_state(state["torch_rng"][ctx.rank].clone())
        random.setstate(state["python_rng"])


def save(path, model=None, optimizer=None, scaler=None, sampler=None, extra=None, context=None):
    """Writes a checkpoint (collective; rank 0 writes). ``extra``: anything torch.save takes."""
    ctx = current(context)
    dp = ctx.data_parallel
    entries = {"chorus": state_dict(sampler, ctx), "extra": extra}
    if model is not None:
        with _zero_gathered(dp):  # stage 3: the parameters' values exist only inside
            state = model.state_dict()
            entries["model"] = collections.OrderedDict(
                (key, value.clone() if dp is not None and dp.zero_stage == 3 else value)
                for key, value in state.items())
            entries["model"]._metadata = getattr(state, "_metadata", None)
    if optimizer is not None:
        entries["optimizer"] = (_zero.full_state_dict(dp, optimizer, ctx)
                                if dp is not None and dp.zero_stage > 0
                                else optimizer.state_dict())
    if scaler is not None:
        entries["scaler"] = scaler.state_dict()
    if ctx.rank == 0:
        buffer = io.BytesIO()
        torch.save(_outer(entries), buffer)
        data = buffer.getvalue()
        _write_atomically(path, data)
        _write_atomically(path + ".sha256", hashlib.sha256(data).hexdigest().encode())
    ctx.world.barrier().wait()  # nobody loads or deletes it before it is whole


def load(path, model=None, optimizer=None, scaler=None, sampler=None, context=None):
    """Restores a checkpoint that :func:`save` wrote into what is given; returns ``extra``."""
    ctx = current(context)
    try:
        with open(path, "rb") as f:
            data = f.read()
        with open(path + ".sha256", "rb") as f:
            expected = f.read().decode().strip()
    except OSError as error:
        raise CheckpointError(f"cannot read checkpoint {path}: {error}") from error
    if hashlib.sha256(data).hexdigest() != expected:
        raise CheckpointError(f"checkpoint {path} is damaged: its SHA-256 does not match "
                              f"{path}.sha256")
    entries = torch.load(io.BytesIO(data), weights_only=False)
    if "python" in entries:  # this version's layout (see the module's note); else the earlier one
        entries = _inner(entries)
    for name, obj in (("model", model), ("optimizer", optimizer), ("scaler", scaler)):
        if obj is not None and name not in entries:
            raise CheckpointError(f"checkpoint {path} holds no {name} state")
    dp = ctx.data_parallel
    zero = dp is not None and dp.zero_stage > 0
    if model is not None:
        with _zero_gathered(dp):
            model.load_state_dict(entries["model"])
            if zero:  # the slices the optimizer steps come from the loaded parameters
                dp._zero.load_master_from_parameters()
    if optimizer is not None:
        if zero:
            _zero.load_state_dict(dp, optimizer, entries["optimizer"])
        else:
            optimizer.load_state_dict(entries["optimizer"])
    if scaler is not None:
        scaler.load_state_dict(entries["scaler"])
    load_state_dict(entries["chorus"], sampler, ctx)
    return entries.get("extra")


def _libtorch_reads(value):
    """Whether libtorch's unpickler reads this state dict entry as the tensor it is."""
    return (type(value) in (torch.Tensor, torch.nn.Parameter) and value.layout == torch.strided
            and not value.is_quantized)


def _outer(entries):
    """The dict chorus.save pickles, from the entries chorus.load returns (module's note)."""
    rest = {key: value for key, value in entries.items() if key != "model"}
    outer = {"chorus": {"format": _FORMAT}}
    if "model" in entries:
        state = entries["model"]
        outer["model"] = {key: value for key, value in state.items() if _libtorch_reads(value)}
        outer["model_python_only"] = [key for key in state if key not in outer["model"]]
        rest["model_objects"] = {key: state[key] for key in outer["model_python_only"]}
        rest["model_order"] = list(state)
        rest["model_metadata"] = getattr(state, "_metadata", None)
    buffer = io.BytesIO()
    torch.save(rest, buffer)
    outer["python"] = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)
    return outer


def _inner(outer):
    """The entries of chorus.save's dict put back together (the inverse of _outer)."""
    if outer.get("chorus", {}).get("format") != _FORMAT:
        raise CheckpointError(f"not a chorus checkpoint (format "
                              f"{outer.get('chorus', {}).get('format')!r})")
    blob = outer["python"].contiguous()
    # ctypes, not bytes(blob.untyped_storage()): that takes 98 s for 50 MB (torch 2.15).
    entries = torch.load(io.BytesIO(ctypes.string_at(blob.data_ptr(), blob.numel())),
                         weights_only=False)
    if "model" in outer:
        objects = entries.pop("model_objects")
        state = collections.OrderedDict(
            (key, outer["model"][key] if key in outer["model"] else objects[key])
            for key in entries.pop("model_order"))
        metadata = entries.pop("model_metadata")
        if metadata is not None:
            state._metadata = metadata
        entries["model"] = state
    return entries


def _zero_gathered(dp):
    return _zero.gathered(dp) if dp is not None else contextlib.nullcontext()


def _write_atomically(path, data):
    temporary = f"{path}.tmp-{os.getpid()}"
    with open(temporary, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)
