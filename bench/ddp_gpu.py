#!/usr/bin/env python3
"""PyTorch DDP on emulated devices that share one GPU: the peer of scripts/gpu-check's pair.

Run under torchrun, one process per emulated device, every one on cuda:0:

    python3 -m torch.distributed.run --standalone --nproc-per-node 2 bench/ddp_gpu.py \
        --speeds 1.0,0.4 --budgets-gib 40,16 --global-batch 512 --steps 40 --log-prefix /tmp/ddp

It trains chorus's residual CNN (bench/ddp_baseline.py's copy) as DDP always does: every rank takes
B / world_size samples, the equal split chorus's `balance = "off"` also runs. NCCL refuses two
ranks on one GPU, so the process group is Gloo (which all-reduces CUDA tensors through the host),
as chorus's bridge joins such ranks through host memory.

Emulation as chorus's on a GPU (device::TimeBasis::kWall): a phase's compute is its wall time with
the device synchronized, padded with sleep to wall / speed, and each gradient bucket's all-reduce
goes out when the emulated device would have had it ready (ddp_baseline.py's DeferredLauncher,
with this wall clock in place of the CPU clock). A budget caps the process's CUDA caching allocator
at budget / device memory, as chorus's `cuda:0/16GiB` does. Per-step JSON lines go to
PREFIX.rank<r>.jsonl as in ddp_baseline.py.
"""

import argparse
import gc
import os
import sys
import time
import warnings

warnings.filterwarnings("ignore", message=".*NumPy.*")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ddp_baseline as base  # noqa: E402


class WallPadder(base.PhasePadder):
    """PhasePadder on the wall clock of a synchronized GPU instead of the thread's CPU time."""

    def begin(self, credit):
        torch.cuda.synchronize()
        super().begin(credit)

    def cpu(self):
        """Seconds of the phase so far, the GPU's queued work included."""
        torch.cuda.synchronize()
        return time.perf_counter() - self.wall_start


def parse_args():
    """Command-line options (model and batch must match the chorus runs they are compared with)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--speeds", default="1.0,0.4", help="emulated speed per rank")
    parser.add_argument("--budgets-gib", default="", help="CUDA memory budget per rank (GiB)")
    parser.add_argument("--global-batch", type=int, default=512, help="samples per step")
    parser.add_argument("--steps", type=int, default=40, help="training steps")
    parser.add_argument("--channels", type=int, default=64, help="CNN width")
    parser.add_argument("--blocks", type=int, default=2, help="CNN residual blocks")
    parser.add_argument("--groups", type=int, default=8, help="GroupNorm groups (0: no norm)")
    parser.add_argument("--lr", type=float, default=0.05, help="SGD learning rate")
    parser.add_argument("--seed", type=int, default=1, help="model and data seed")
    parser.add_argument("--log-prefix", required=True, help="per-rank JSON lines go to PREFIX.rank<r>.jsonl")
    return parser.parse_args()


def train(args):
    """The DDP loop on this rank (ddp_baseline.run_steps), on cuda:0."""
    rank, world = dist.get_rank(), dist.get_world_size()
    speeds = [float(s) for s in args.speeds.split(",")]
    if len(speeds) != world or args.global_batch % world:
        raise SystemExit(f"{len(speeds)} speeds and global batch {args.global_batch} for {world} ranks")
    device = torch.device("cuda:0")
    if args.budgets_gib:
        budget = float(args.budgets_gib.split(",")[rank]) * 2**30
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, budget / total), device)
    torch.manual_seed(args.seed)
    net = base.ResidualCNN(args.channels, args.blocks, args.groups).to(device)
    clock = base.GradientClock(net.parameters())
    model = DistributedDataParallel(net, bucket_cap_mb=base.chorus_bucket_cap_mb(net))
    padder = WallPadder(speeds[rank])
    launcher = base.DeferredLauncher(padder)
    model.register_comm_hook(launcher, base.deferred_allreduce_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    per_rank = args.global_batch // world
    data = [(x.to(device), y.to(device)) for x, y in base.make_data(rank, per_rank, args.seed)]
    scale = world / args.global_batch
    with open(f"{args.log_prefix}.rank{rank}.jsonl", "w", encoding="utf-8") as log:
        dist.barrier()
        base.run_steps(args, model, optimizer, data, clock, scale, (padder, launcher, 0.0), log)
    launcher.stop()


def main():
    """Entry point: Gloo process group from torchrun's environment."""
    args = parse_args()
    dist.init_process_group("gloo")
    try:
        train(args)
        dist.barrier()
        gc.collect()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
