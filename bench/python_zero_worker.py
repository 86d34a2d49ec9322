#!/usr/bin/env python3
"""The ranks of bench/python_zero.py: the zoo's GPT trained by the Python front or by PyTorch.

  chorus run --devices cpu,cpu,cpu -- python3 bench/python_zero_worker.py chorus OUT_DIR --zero 3
      One rank of the Python front: bench/gpt_torch.py's Gpt (the nn.Module bench/zero_torch.py
      trains, built and initialized the same way) wrapped in chorus.DataParallel(zero=N,
      shards="even", balance="fixed"), AdamW, chorus.step; the job of bench/zero_torch.py: the
      same global batch split evenly, synthetic token sequences of the same shape and per-rank
      generator, learning-rate schedule (zero_torch.learning_rate), one intra-op thread
      (chorus.init's default), and the step timed the same way, from before its data to after
      chorus.step (which all-gathers the step's figures, as zero_torch all-reduces the loss).
      The loss back-propagated is the sum over the rank's samples of each sample's mean token
      loss (chorus divides the reduced gradients by the global batch): the gradient of
      zero_torch's mean loss.

  python3 bench/python_zero_worker.py torch OUT_DIR --mode fsdp|ddp
      PyTorch's side, unchanged: spawns --world processes that each run bench/zero_torch.py's
      worker() (FSDP2 fully_shard or DDP), with one global optimizer-step pre-hook added for the
      tally below; zero_torch writes its own result (OUT_DIR/torch.json).

Both write OUT_DIR/tally<R>.json: the tally, taken by the same function (held_bytes) at the same
moment, the pre-hook of the second optimizer step (gradients reduced, optimizer state made by the
first step): the bytes of the distinct tensor storages this rank holds for the model's
parameters, its gradients, the optimizer's parameters where they are other tensors than the
module's (chorus's ZeRO fp32 master slices) and the optimizer state. The chorus side also writes
OUT_DIR/tally_backward<R>.json, the same tally right after that step's backward(), before
chorus.step ends the reduction: stage 1 still holds every .grad there, stage 3 the gathered
module (python/chorus/zero.py drops both in chorus.step, before the optimizer's step). On
PyTorch's side the two moments hold the same tensors (backward returns with DDP's all-reduce and
FSDP's reduce-scatter done and FSDP's parameters resharded; only the loss's all-reduce lies
between), so its pre-hook tally stands for both. DTensors (FSDP2) count their
local shards. Buffers that neither side shows Python (DDP's and chorus's reducer buckets, FSDP's
all-gather buffers, freed outside each layer's compute) are not counted. The chorus side also
writes OUT_DIR/rank<R>.json: its step times, losses and RSS (peak: ru_maxrss; before the first
step: VmRSS, as zero_torch measures them).
"""

import argparse
import json
import os
import resource
import sys
import time
import warnings

warnings.filterwarnings("ignore", message=".*NumPy.*")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.optim.optimizer import register_optimizer_step_pre_hook  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zero_torch  # noqa: E402  (PyTorch's side and its schedule, reused as they are)
from gpt_torch import GPT_DEFAULTS, Gpt, init_like_chorus, synthetic_tokens  # noqa: E402

TALLY_AT_STEP = 1  # the second optimizer step, from 0


def _local(tensor):
    return getattr(tensor, "_local_tensor", tensor)  # a DTensor's shard on this rank


def held_bytes(optimizer, module=None, slices=()):
    """Bytes of distinct storages: parameters, gradients, master slices, optimizer state.
    ``slices``: (kind, tensor) pairs the optimizer may not point at yet (chorus's ZeRO slices)."""
    seen, tally = set(), {"parameters": 0, "gradients": 0, "master_slices": 0,
                          "optimizer_state": 0}

    def add(kind, tensor):
        if not torch.is_tensor(tensor):
            return
        storage = _local(tensor).untyped_storage()
        if storage.nbytes() == 0 or storage.data_ptr() in seen:
            return
        seen.add(storage.data_ptr())
        tally[kind] += storage.nbytes()

    optimized = [p for group in optimizer.param_groups for p in group["params"]]
    module_parameters = list(module.parameters()) if module is not None else optimized
    for p in module_parameters:
        add("parameters", p)
    for p in optimized:
        add("master_slices", p)
    for p in module_parameters + optimized:
        add("gradients", p.grad)
    for kind, tensor in slices:
        add(kind, tensor)
    for state in optimizer.state.values():
        for value in state.values():
            add("optimizer_state", value)
    tally["total"] = sum(tally.values())
    return tally


def tally_hook(path, module=None, slices=()):
    """An optimizer-step pre-hook that writes held_bytes at the TALLY_AT_STEP-th step."""
    calls = [0]

    def hook(optimizer, args, kwargs):
        if calls[0] == TALLY_AT_STEP:
            with open(path, "w") as out:
                json.dump(held_bytes(optimizer, module, slices), out)
        calls[0] += 1

    return register_optimizer_step_pre_hook(hook)


def chorus_rank(args):
    import chorus  # noqa: PLC0415  (only the chorus side needs it)

    context = chorus.init()
    rank, world = context.rank, context.world_size
    m = dict(GPT_DEFAULTS)
    module = Gpt(m)
    init_like_chorus(module, m, torch.Generator().manual_seed(args.seed))  # as zero_torch
    model = chorus.DataParallel(module, global_batch=args.global_batch, balance="fixed",
                                zero=args.zero, shards="even" if args.zero else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.999), eps=1e-8,
                                  weight_decay=0.0)
    tally = {}
    tally_path = os.path.join(args.out, f"tally{rank}.json")
    zero = model._zero  # its master and gradient slices (None at stage 0)
    slices = [("master_slices", zero.master_slice()), ("gradients", zero.gradient_slice())] \
        if zero is not None else []
    tally_hook(tally_path, module, slices)
    successor = torch.randperm(m["vocab"], generator=torch.Generator().manual_seed(args.seed))
    generator = torch.Generator().manual_seed(args.seed * 1000 + rank)
    local = model.local_share
    rss_before = zero_torch.rss_kib()
    step_s, losses, parts = [], [], []
    model.train()
    chorus.world().barrier().wait()
    for step in range(args.steps):
        start = time.perf_counter()
        inputs, targets = synthetic_tokens(local, m, generator, successor)
        for group in optimizer.param_groups:
            group["lr"] = zero_torch.learning_rate(args, step)
        forward_at = time.perf_counter()
        logits = model(inputs)
        loss = F.cross_entropy(logits.reshape(-1, m["vocab"]), targets.reshape(-1),
                               reduction="sum") / m["context"]
        loss.backward()
        backward_end = time.perf_counter()
        if step == TALLY_AT_STEP:  # before chorus.step's reduction end frees or drops anything
            with open(os.path.join(args.out, f"tally_backward{rank}.json"), "w") as out:
                json.dump(held_bytes(optimizer, module, slices), out)
        step_at = time.perf_counter()
        info = chorus.step(optimizer, loss=loss)
        step_s.append(time.perf_counter() - start)
        losses.append(info.loss)
        # Where the step's time went on this rank: data, forward + backward (ZeRO-3's gather at
        # the first forward included), chorus.step (the reduction's end, the optimizer, stages
        # 1-2's all-gather); and chorus's own figures: compute and wait per rank.
        parts.append({"data_s": forward_at - start, "forward_backward_s": backward_end - forward_at,
                      "chorus_step_s": time.perf_counter() - step_at,
                      "compute_s": info.compute_seconds, "wait_s": info.wait_seconds})
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with open(tally_path) as f:
        tally = json.load(f)
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as out:
        json.dump({"rank": rank, "world": world, "zero": model.zero_stage,
                   "shard_fractions": model.shard_fractions, "local_share": local,
                   "rss_before_kib": rss_before, "peak_rss_kib": peak, "held_bytes": tally,
                   "step_s": step_s, "loss": losses, "parts": parts,
                   "torch": torch.__version__}, out)


def torch_rank(rank, args, port, out_dir):
    tally_hook(os.path.join(out_dir, f"tally{rank}.json"))
    zero_torch.worker(rank, args, port, os.path.join(out_dir, "torch.json"))


def torch_job(args):
    import torch.multiprocessing as mp  # noqa: PLC0415

    job = argparse.Namespace(mode=args.mode, world=args.world, global_batch=args.global_batch,
                             steps=args.steps, lr=args.lr, lr_warmup=args.lr_warmup,
                             min_lr_ratio=args.min_lr_ratio, seed=args.seed)
    mp.start_processes(torch_rank, args=(job, zero_torch.free_port(), args.out),
                       nprocs=args.world, join=True, start_method="spawn")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("side", choices=["chorus", "torch"])
    parser.add_argument("out", help="a directory for the ranks' files")
    parser.add_argument("--zero", type=int, default=0, help="chorus: the ZeRO stage")
    parser.add_argument("--mode", choices=["fsdp", "ddp"], help="torch: FSDP2 or DDP")
    parser.add_argument("--world", type=int, default=3, help="torch: ranks")
    parser.add_argument("--global-batch", type=int, default=24)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--lr", type=float, default=0.001)
    parser.add_argument("--lr-warmup", type=int, default=20)
    parser.add_argument("--min-lr-ratio", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.side == "chorus":
        chorus_rank(args)
    else:
        torch_job(args)


if __name__ == "__main__":
    main()
