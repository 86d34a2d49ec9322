#!/usr/bin/env python3
"""PyTorch's side of bench/zero.py: the zoo's GPT with FSDP2 (`fully_shard`) or DDP, CPU, Gloo.

One process per rank (spawned), one intra-op thread each (as chorus's CPU workers:
runtime::init sets at::set_num_threads(1)), the Gloo backend. The model is chorus's GPT
(bench/gpt_torch.py) with chorus's initialization; the job mirrors `chorus train` with
model.kind = "gpt", balance = off and the built-in job's optimizer settings: AdamW (betas 0.9 and
0.999, eps 1e-8, no weight decay), lr warmed up linearly over 20 steps, then cosine to a tenth;
the global batch split evenly over the ranks; synthetic token sequences of the same shape.

- `--mode fsdp`: `fully_shard` on each of chorus's layers (the embedding, every block, the head),
  then on the root, with the default full sharding (parameters resharded after forward and
  gathered again for backward), as chorus's stage 3 gathers each layer before its forward and
  its backward, prefetching the next.
- `--mode ddp`: DistributedDataParallel with buckets cut by chorus's rule (a quarter of the
  gradient bytes, at least 32 KiB), the baseline for chorus's stage 0.

Each step, timed on every rank with a wall clock from before its data to after the optimizer's
step, also all-reduces the loss (chorus gathers each step's figures, a small collective, the
same way). Writes one JSON object to --out: rank 0's step times and losses, every rank's peak RSS
(ru_maxrss) and its RSS before training.

    python3 bench/zero_torch.py --mode fsdp --world 3 --global-batch 24 --steps 30 --out f.json
"""

import argparse
import json
import math
import os
import resource
import socket
import time
import warnings

# torch warns at import when NumPy is absent; nothing here uses NumPy.
warnings.filterwarnings("ignore", message=".*NumPy.*")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from gpt_torch import GPT_DEFAULTS, Gpt, init_like_chorus, synthetic_tokens  # noqa: E402


def learning_rate(args, step):
    """runtime::learningRateAt: linear warm-up, then cosine to min_lr_ratio * lr."""
    if args.lr_warmup > 0 and step < args.lr_warmup:
        return args.lr * (step + 1) / args.lr_warmup
    span = max(1, args.steps - args.lr_warmup)
    progress = min(1.0, (step - args.lr_warmup) / span)
    floor = args.lr * args.min_lr_ratio
    return floor + (args.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def rss_kib():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def wrap(model, args):
    if args.mode == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (args.world,))
        for layer in model.layers:
            fully_shard(layer, mesh=mesh)
        return fully_shard(model, mesh=mesh)
    from torch.nn.parallel import DistributedDataParallel
    gradient_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    bucket_mb = max(32 * 1024, gradient_bytes // 4) / 2**20
    return DistributedDataParallel(model, bucket_cap_mb=bucket_mb)


def worker(rank, args, port, path):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=args.world)
    m = dict(GPT_DEFAULTS)
    model = Gpt(m)
    init_like_chorus(model, m, torch.Generator().manual_seed(args.seed))  # alike on every rank
    model = wrap(model, args)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.999), eps=1e-8,
                                  weight_decay=0.0)
    successor = torch.randperm(m["vocab"], generator=torch.Generator().manual_seed(args.seed))
    generator = torch.Generator().manual_seed(args.seed * 1000 + rank)
    local = args.global_batch // args.world
    rss_before = rss_kib()
    step_s, losses = [], []
    model.train()
    dist.barrier()
    for step in range(args.steps):
        start = time.perf_counter()
        inputs, targets = synthetic_tokens(local, m, generator, successor)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(args, step)
        optimizer.zero_grad(set_to_none=True)
        logits = model(inputs)
        loss = F.cross_entropy(logits.reshape(-1, m["vocab"]), targets.reshape(-1))
        loss.backward()
        figures = torch.tensor([loss.item() * local])
        dist.all_reduce(figures)  # as chorus gathers each step's loss sum and timings
        optimizer.step()
        step_s.append(time.perf_counter() - start)
        losses.append(figures.item() / args.global_batch)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Tensors, not all_gather_object: that one needs NumPy, which this image lacks.
    mine = torch.tensor([rss_before, peak] + step_s, dtype=torch.float64)
    gathered = [torch.empty_like(mine) for _ in range(args.world)]
    dist.all_gather(gathered, mine)
    if rank == 0:
        ranks = [{"rss_before_kib": int(g[0]), "peak_rss_kib": int(g[1]),
                  "step_s": g[2:].tolist()} for g in gathered]
        with open(path, "w") as out:
            json.dump({"mode": args.mode, "torch": torch.__version__, "step_s": step_s,
                       "loss": losses, "ranks": ranks}, out)
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mode", choices=["fsdp", "ddp"], required=True)
    parser.add_argument("--world", type=int, default=3)
    parser.add_argument("--global-batch", type=int, default=24)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--lr", type=float, default=0.001)
    parser.add_argument("--lr-warmup", type=int, default=20, help="optimizer.warmup_steps")
    parser.add_argument("--min-lr-ratio", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.global_batch % args.world != 0:
        parser.error("--global-batch must split evenly over --world")
    mp.start_processes(worker, args=(args, free_port(), args.out), nprocs=args.world, join=True,
                       start_method="spawn")


if __name__ == "__main__":
    main()
