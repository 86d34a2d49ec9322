#!/usr/bin/env python3
"""Real PyTorch pipelining next to chorus: same GPT, same cut, same emulated device speeds.

Runs `pipeline_bench --only hetero` (chorus, unless --no-chorus) and then the same job with
`torch.distributed.pipelining` (PipelineStage + Schedule1F1B or ScheduleGPipe) on Gloo, one
process per stage, one intra-op thread each, and writes both throughputs and their ratio to
bench/results/pipeline.json (key "pytorch").

The model mirrors chorus's GPT layer for layer (bench/gpt_torch.py), and the stages take the
layers of chorus's automatic cut. Speeds are emulated as chorus does: every forward and every
backward of a stage is padded with sleep to cpu_time / speed, measured in the thread's CPU time.
(The first stage's backward is timed from its embedding's output, since token ids carry no
gradient: its embedding backward, a scatter-add of a few KiB, goes unpadded.)

    python3 bench/pipeline_torch.py                 # from the repository root, ~1 minute
    python3 bench/pipeline_torch.py --bench build/bench/pipeline_bench --speed-scale 0.25
    python3 bench/pipeline_torch.py --no-chorus --cuts 0,7,10
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

from gpt_torch import make_layers  # the GPT twin, shared with bench/zero_torch.py

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_JSON = os.path.join(REPO, "bench", "results", "pipeline.json")
DEFAULT_BENCH = os.path.join(REPO, "build", "bench", "pipeline_bench")
MODEL = dict(vocab=64, layers=8, width=128, heads=4, context=64)  # pipeline_bench.cc benchModel


class _MarkBackwardStart(torch.autograd.Function):
    """At a stage's output: its backward is the first of the stage's backward pass."""

    @staticmethod
    def forward(ctx, x, clock):
        ctx.clock = clock
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.clock["backward_start"] = time.thread_time()
        return grad, None


class _PadBackward(torch.autograd.Function):
    """At a stage's input: its backward is the last of the stage's backward pass; pads it."""

    @staticmethod
    def forward(ctx, x, clock, speed):
        ctx.clock, ctx.speed = clock, speed
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        cpu = time.thread_time() - ctx.clock.pop("backward_start")
        time.sleep(cpu * (1.0 / ctx.speed - 1.0))
        return grad, None, None


class PaddedStage(nn.Module):
    """Layers [first, last) whose forward and backward take cpu_time / speed."""

    def __init__(self, layers, speed):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.speed = speed
        self.clock = {}

    def forward(self, x):
        start = time.thread_time()
        # The backward pad sits on the first tensor that carries a gradient: the received
        # activation, or on the first stage the embedding's output.
        padded = x.is_floating_point()
        if padded:
            x = _PadBackward.apply(x, self.clock, self.speed)
        for layer in self.layers:
            x = layer(x)
            if not padded:
                x, padded = _PadBackward.apply(x, self.clock, self.speed), True
        x = _MarkBackwardStart.apply(x, self.clock)
        time.sleep((time.thread_time() - start) * (1.0 / self.speed - 1.0))
        return x


def worker(rank, world, port, args, queue):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    torch.manual_seed(11)
    layers = make_layers(MODEL)
    cuts, speeds = args.cuts, args.speeds
    stage_module = PaddedStage(layers[cuts[rank]:cuts[rank + 1]], speeds[rank])
    # Static shapes (the image has no numpy, which PyTorch's dynamic shape exchange needs).
    micro, t, w = args.batch // args.micro_batches, MODEL["context"], MODEL["width"]
    activation = torch.zeros(micro, t, w, requires_grad=True)  # carries a gradient back
    example_in = torch.zeros(micro, t, dtype=torch.long) if rank == 0 else activation
    example_out = (torch.zeros(micro, t, MODEL["vocab"], requires_grad=True)
                   if rank == world - 1 else activation)
    stage = PipelineStage(stage_module, rank, world, torch.device("cpu"), input_args=example_in,
                          output_args=example_out)

    def loss_fn(logits, targets):
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))

    schedule_type = Schedule1F1B if args.schedule == "1f1b" else ScheduleGPipe
    schedule = schedule_type(stage, n_microbatches=args.micro_batches, loss_fn=loss_fn)
    optimizer = torch.optim.SGD(stage_module.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(3)
    elapsed = 0.0
    for step in range(args.warmup + args.steps):
        tokens = torch.randint(0, MODEL["vocab"], (args.batch, MODEL["context"]),
                               generator=generator)
        targets = torch.roll(tokens, -1, dims=1)
        if step == args.warmup:
            dist.barrier()
            start = time.perf_counter()
        optimizer.zero_grad()
        if rank == 0:
            schedule.step(tokens)
        elif rank == world - 1:
            schedule.step(target=targets, losses=[])
        else:
            schedule.step()
        optimizer.step()
    elapsed = time.perf_counter() - start
    slowest = torch.tensor([elapsed])
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    if rank == 0:
        queue.put(args.batch * args.steps / slowest.item())
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_torch(args):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    world = len(args.speeds)
    mp.start_processes(worker, args=(world, free_port(), args, queue), nprocs=world, join=True,
                       start_method="spawn")
    return queue.get()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--speeds", default="1.0,0.4")
    parser.add_argument("--speed-scale", type=float, default=1.0,
                        help="multiplies every speed, as pipeline_bench --speed-scale does")
    parser.add_argument("--cuts", default=None, help="layer cuts, e.g. 0,7,10 (default: chorus's)")
    parser.add_argument("--schedule", default="1f1b", choices=["1f1b", "gpipe"])
    parser.add_argument("--micro-batches", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--bench", default=DEFAULT_BENCH, help="the pipeline_bench binary")
    parser.add_argument("--no-chorus", action="store_true", help="do not run chorus first")
    parser.add_argument("--json", default=DEFAULT_JSON)
    args = parser.parse_args()
    args.speeds = [float(s) * args.speed_scale for s in args.speeds.split(",")]

    results = {}
    if os.path.exists(args.json):
        with open(args.json) as f:
            results = json.load(f)
    chorus = None
    if not args.no_chorus:
        subprocess.run([args.bench, "--only", "hetero", "--steps", str(args.steps),
                        "--speed-scale", str(args.speed_scale), "--json", args.json],
                       check=True, cwd=REPO)
        with open(args.json) as f:
            results = json.load(f)
        chorus = results["hetero"]["auto"]
    if args.cuts is None:
        if chorus is None:
            sys.exit("--cuts is needed with --no-chorus")
        args.cuts = chorus["cuts"]
    else:
        args.cuts = [int(c) for c in args.cuts.split(",")]

    throughput = run_torch(args)
    entry = {"torch_version": torch.__version__, "schedule": args.schedule,
             "speeds": args.speeds, "cuts": args.cuts, "micro_batches": args.micro_batches,
             "global_batch": args.batch, "samples_per_second": throughput}
    print(f"pytorch pipelining ({args.schedule}, cuts {args.cuts}, speeds {args.speeds}): "
          f"{throughput:.1f} samples/s")
    if chorus is not None:
        entry["chorus_samples_per_second"] = chorus["samples_per_second"]
        entry["chorus_over_pytorch"] = chorus["samples_per_second"] / throughput
        print(f"chorus auto cut: {chorus['samples_per_second']:.1f} samples/s, "
              f"{entry['chorus_over_pytorch']:.2f}x PyTorch")
    results["pytorch"] = entry
    with open(args.json, "w") as f:
        json.dump(results, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
