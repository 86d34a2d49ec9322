#!/usr/bin/env python3
"""PyTorch DDP baseline for the heterogeneous data-parallel benchmark (bench/hetero_dp.py).

Run under torchrun, one process per emulated device, Gloo backend, CPU, one intra-op thread:

    python3 -m torch.distributed.run --standalone --nproc-per-node 3 bench/ddp_baseline.py \
        --speeds 1.0,0.5,0.25 --global-batch 192 --steps 60 --log-prefix /tmp/ddp

It trains the same residual CNN as chorus (src/model/cnn.cc) the way DDP always does: every rank
takes the same batch, B / world_size samples.  Emulated speed works as in chorus
(src/device/speed_emulator.cc): the CPU time of each rank's forward + backward, measured in *thread*
CPU time (so blocked waits and Gloo's own threads do not count), is padded with sleep so that the
phase lasts cpu_time / speed, and its gradient buckets go out at the emulated pace, as chorus's
trainer releases them: this script's DDP communication hook (register_comm_hook) notes the CPU
time so far when a bucket is ready and hands the bucket to a launcher thread, which starts DDP's
default all-reduce on it when the emulated device would have had it ready (the phase's start +
CPU time so far / speed); the rest of the padding follows when backward returns.  The real compute
stays in one block, as in chorus.  So a slow rank's all-reduces start at the emulated pace: padded
only at the end, its all-reduce would run inside that sleep and look free.  The buckets are cut by
chorus's rule (bucket_cap_mb = the gradient bytes / 4, at least 32 KiB), and their overlap with
backward is DDP's own.  Only
compute is padded, never the time spent waiting for peers: the phase's wall time, which the sleeps
top up, ends when the last gradient is ready (GradientClock), not when backward returns after
DDP has waited for its all-reduce.  When the ranks outnumber the cores they take turns within a
step exactly as chorus's do (device::staggerOffsets, SpeedEmulator::beginStep): a rank with a step
offset sleeps that fraction of its previous step's emulated compute first and counts it against
this step's padding, and a padded rank gets back the time it waited for a core between its
phases (the kernel's run delay), also exactly as chorus's do.

Every rank r writes one JSON object per step to PREFIX.rank<r>.jsonl (no extra collective in the
loop): ``step``, ``step_s`` (its own wall time of the whole step), ``loss`` (mean over its samples),
``compute_s`` (emulated compute seconds: CPU time / speed) and ``wait_s`` (from the last gradient
to the end of backward: DDP waiting for its all-reduce).  bench/hetero_dp.py merges them into
chorus's per-step format.
"""

import argparse
import gc
import json
import math
import os
import queue
import threading
import time
import warnings

# torch warns at import when NumPy is absent; the benchmark does not use NumPy.
warnings.filterwarnings("ignore", message=".*NumPy.*")

import torch  # noqa: E402  (after the warning filter on purpose)
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

HEAD_GRID = 4  # the head pools to a 4 x 4 map, as chorus's CNN does
CLASSES = 10
INPUT_SHAPE = (1, 28, 28)  # chorus's default model.input_shape (Fashion-MNIST)
SHARED_FILL = 0.8  # device::staggerOffsets: the busiest a core is made by turns taken by choice
DATA_POOL = 8  # distinct batches per rank, cycled through (data loading is not what is measured)


class ConvNorm(nn.Module):
    """A 3x3 convolution (padding 1) followed by GroupNorm; bias only without normalization."""

    def __init__(self, cin, cout, stride, groups):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=groups == 0)
        self.norm = nn.GroupNorm(groups, cout) if groups > 0 else nn.Identity()

    def forward(self, x):
        return self.norm(self.conv(x))


class ResidualBlock(nn.Module):
    """conv-norm-relu, conv-norm, add the input, relu (chorus's ResidualBlock)."""

    def __init__(self, channels, groups):
        super().__init__()
        self.first = ConvNorm(channels, channels, 1, groups)
        self.second = ConvNorm(channels, channels, 1, groups)

    def forward(self, x):
        return torch.relu(x + self.second(torch.relu(self.first(x))))


class ResidualCNN(nn.Module):
    """chorus's CNN: stride-2 stem, residual blocks, 4x4 average pool, linear head."""

    def __init__(self, channels, blocks, groups, in_channels=INPUT_SHAPE[0], classes=CLASSES):
        super().__init__()
        self.stem = ConvNorm(in_channels, channels, 2, groups)
        self.blocks = nn.Sequential(*[ResidualBlock(channels, groups) for _ in range(blocks)])
        self.head = nn.Linear(channels * HEAD_GRID * HEAD_GRID, classes)

    def forward(self, x):
        x = self.blocks(torch.relu(self.stem(x)))
        return self.head(F.adaptive_avg_pool2d(x, HEAD_GRID).flatten(1))


def parse_args():
    """Command-line options (the model and batch must match the chorus runs being compared)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--speeds", default="1.0,0.5,0.25",
                        help="emulated speed per rank, comma-separated (one per process)")
    parser.add_argument("--global-batch", type=int, default=192,
                        help="global batch B; every rank takes B / world_size samples")
    parser.add_argument("--steps", type=int, default=60, help="training steps")
    parser.add_argument("--channels", type=int, default=32, help="CNN width")
    parser.add_argument("--blocks", type=int, default=2, help="CNN residual blocks")
    parser.add_argument("--groups", type=int, default=8, help="GroupNorm groups (0: no norm)")
    parser.add_argument("--lr", type=float, default=0.05, help="SGD learning rate")
    parser.add_argument("--seed", type=int, default=1, help="model and data seed")
    parser.add_argument("--log-prefix", required=True,
                        help="rank r writes one JSON object per step to PREFIX.rank<r>.jsonl")
    return parser.parse_args()


def make_data(rank, per_rank, seed):
    """A small pool of fixed random batches for this rank: (inputs, targets) pairs."""
    generator = torch.Generator().manual_seed(seed * 1000 + rank)
    return [(torch.randn((per_rank,) + INPUT_SHAPE, generator=generator),
             torch.randint(0, CLASSES, (per_rank,), generator=generator))
            for _ in range(DATA_POOL)]


class GradientClock:
    """Remembers when backward produced the last gradient: there the compute phase ends.

    DDP's backward does not return until its all-reduce is done, so the wall time of backward
    includes waiting for peers.  A post-accumulate-grad hook on every parameter marks the moment the
    last gradient was ready (DDP launches the last bucket's all-reduce right then); the time from the
    start of forward to that moment is the phase's wall time without the wait.
    """

    def __init__(self, parameters):
        self.last = 0.0
        for parameter in parameters:
            parameter.register_post_accumulate_grad_hook(self._mark)

    def _mark(self, _parameter):
        self.last = time.perf_counter()


def stagger_offsets(speeds, cores):
    """device::staggerOffsets: where each emulated worker computes within a step, as the fraction
    of its emulated compute time it sleeps first.  Workers take turns on the fullest core that
    stays at most SHARED_FILL busy, else on a core of their own, else on the core with the most
    room; a worker that fits nowhere computes at once (offset 0)."""
    offsets = [0.0] * len(speeds)
    if cores < 1:
        return offsets
    used = []  # per core: [filled, workers]
    for worker in sorted(range(len(speeds)), key=lambda i: -speeds[i]):  # stable, as in C++
        speed = min(1.0, max(0.0, speeds[worker]))
        fitting = [c for c in used if c[0] + speed <= SHARED_FILL + 1e-9]
        if fitting:
            core = max(fitting, key=lambda c: c[0])  # the fullest; the first on ties
        elif len(used) < cores:
            used.append([speed, [worker]])
            continue
        else:
            core = min(used, key=lambda c: c[0])  # the most room; the first on ties
            if core[0] + speed > 1 + 1e-9:
                continue
        core[0] += speed
        core[1].append(worker)
    for filled, workers in used:  # spare time split after each turn
        gap = max(0.0, 1 - filled) / len(workers)
        start = 0.0
        for worker in workers:
            offsets[worker] = start
            start += min(1.0, max(0.0, speeds[worker])) + gap
    return offsets


class PhasePadder:
    """SpeedEmulator::ComputeScope in Python: pads one compute phase to cpu / speed.

    begin() opens a phase; moment(cpu) is when the emulated device reaches `cpu` seconds of the
    phase's compute (the phase's start, less `credit`, the sleep taken before it, + cpu / speed);
    end() sleeps until the moment of the whole phase's compute.  Like chorus, a late wake-up is
    repaid from the next phase's padding.  Used on the training thread only (DDP runs a CPU
    backward's hooks on it); moment() is also read by the launcher thread.
    """

    def __init__(self, speed):
        self.speed = speed
        self.overshoot = 0.0
        self.credit = 0.0
        self.cpu_start = self.wall_start = 0.0
        self.active = False

    def begin(self, credit):
        """Opens a phase; `credit` is sleep already taken before it (step offset, run delay)."""
        self.credit = credit
        self.cpu_start, self.wall_start = time.thread_time(), time.perf_counter()
        self.active = True

    def cpu(self):
        """CPU seconds of the phase so far (blocked waits use none)."""
        return time.thread_time() - self.cpu_start

    def moment(self, cpu):
        """When (perf_counter) the emulated device reaches `cpu` seconds of the phase's compute."""
        return self.wall_start - self.credit + cpu / self.speed

    def end(self):
        """Pads the rest of the phase; returns its CPU seconds."""
        cpu = self.cpu()
        self.active = False
        if self.speed >= 1:
            return cpu
        behind = self.moment(cpu) - time.perf_counter()
        if behind <= 0:  # the phase has lasted long enough already
            return cpu
        owed = behind - self.overshoot
        if owed <= 0:
            self.overshoot = -owed
            return cpu
        start = time.perf_counter()
        time.sleep(owed)
        self.overshoot = max(0.0, time.perf_counter() - start - owed)
        return cpu


class DeferredLauncher:
    """Starts each DDP bucket's all-reduce when the emulated device would have had it ready.

    The comm hook (hook()) runs on the training thread when DDP's bucket is ready: at full speed it
    launches DDP's default all-reduce at once; emulated, it notes the moment of the CPU time so far
    (PhasePadder.moment) and queues the bucket for this thread, which sleeps until that moment and
    launches it, in the order the hooks ran (every rank issues the same collectives in the same
    order).  The future DDP waits for is completed with the averaged bucket, as DDP's default hook's
    is.  `last_launch` is when the last all-reduce went out.
    """

    def __init__(self, padder):
        self.padder = padder
        self.queue = queue.SimpleQueue()
        self.last_launch = 0.0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def hook(self, bucket):
        """DDP communication hook."""
        if self.padder.speed >= 1 or not self.padder.active:
            self.last_launch = time.perf_counter()
            return default_hooks.allreduce_hook(None, bucket)
        done = torch.futures.Future()
        self.queue.put((bucket.buffer(), self.padder.moment(self.padder.cpu()), done))
        return done

    def stop(self):
        """Ends the thread after the buckets queued so far."""
        self.queue.put(None)
        self.thread.join()

    def _run(self):
        world = dist.get_world_size()
        while (item := self.queue.get()) is not None:
            tensor, moment, done = item
            delay = moment - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            self.last_launch = time.perf_counter()
            reduced = dist.all_reduce(tensor.div_(world), async_op=True).get_future()
            reduced.add_done_callback(lambda future, done=done: done.set_result(future.value()[0]))


def chorus_bucket_cap_mb(net):
    """The bucket cap chorus's reducer uses for this model (ReducerOptions: DDP's 25 MiB, but at
    most the gradient bytes / 4 and at least 32 KiB), so that both overlap the same buckets:
    with DDP's own 25 MiB the CNN here is one bucket, launched when backward ends."""
    gradient_bytes = sum(4 * p.numel() for p in net.parameters())
    return min(25.0, max(32 * 1024, gradient_bytes / 4) / 2**20)


def deferred_allreduce_hook(launcher, bucket):
    """DDP communication hook: DDP's default all-reduce, at the emulated pace."""
    return launcher.hook(bucket)


def train(args):
    """Run the DDP training loop on this rank, logging per-step figures."""
    rank = dist.get_rank()
    world = dist.get_world_size()
    speeds = [float(s) for s in args.speeds.split(",")]
    if len(speeds) != world:
        raise SystemExit(f"--speeds lists {len(speeds)} speeds for {world} processes")
    if args.global_batch % world:
        raise SystemExit(f"global batch {args.global_batch} is not divisible by {world} ranks")
    speed = speeds[rank]
    per_rank = args.global_batch // world
    offset = stagger_offsets(speeds, len(os.sched_getaffinity(0)))[rank]

    torch.manual_seed(args.seed)  # same initial parameters everywhere (DDP broadcasts anyway)
    net = ResidualCNN(args.channels, args.blocks, args.groups)
    clock = GradientClock(net.parameters())
    model = DistributedDataParallel(net, bucket_cap_mb=chorus_bucket_cap_mb(net))
    padder = PhasePadder(speed)
    launcher = DeferredLauncher(padder)
    model.register_comm_hook(launcher, deferred_allreduce_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    data = make_data(rank, per_rank, args.seed)
    # Sum of per-sample losses over B, times world: DDP's gradient average then equals the
    # gradient of the global-batch mean, as in chorus (sum over samples divided by B).
    scale = world / args.global_batch

    with open(f"{args.log_prefix}.rank{rank}.jsonl", "w", encoding="utf-8") as log:
        dist.barrier()
        run_steps(args, model, optimizer, data, clock, scale, (padder, launcher, offset), log)
    launcher.stop()


def run_delay():
    """Seconds this thread has waited runnable for a CPU (/proc/thread-self/schedstat), or None."""
    try:
        with open("/proc/thread-self/schedstat", encoding="ascii") as stats:
            return int(stats.read().split()[1]) * 1e-9
    except (OSError, IndexError, ValueError):
        return None


def run_steps(args, model, optimizer, data, clock, scale, emulation, log):
    """The timed training loop: forward, backward (DDP all-reduces bucket by bucket, each at the
    emulated pace), the rest of the padding, optimizer step.  `emulation` is (PhasePadder,
    DeferredLauncher, step offset)."""
    padder, launcher, offset = emulation
    speed = padder.speed
    last_target, last_start, delay_mark = 0.0, None, None
    for step in range(1, args.steps + 1):
        start = time.perf_counter()
        # As chorus (SpeedEmulator::beginStep): a padded rank gets back the time it waited for a
        # core since its last phase ended, from its head start and then from its padding.
        now_delay = run_delay() if delay_mark is not None else None
        credit = max(0.0, now_delay - delay_mark) if now_delay is not None else 0.0
        if offset > 0 and last_start is not None:  # this rank's turn: later in the step
            head = offset * min(start - last_start, 2 * last_target) - credit
            if head > 0:
                time.sleep(head)
                credit += time.perf_counter() - start
        last_start = start
        inputs, targets = data[step % DATA_POOL]
        optimizer.zero_grad(set_to_none=True)
        padder.begin(credit)
        loss_sum = F.cross_entropy(model(inputs), targets, reduction="sum")
        (loss_sum * scale).backward()  # DDP all-reduces as buckets are due; waits before returning
        backward_end = time.perf_counter()
        ready = max(clock.last, launcher.last_launch)  # the last gradient, at the emulated pace
        cpu = padder.end()  # blocked waits use no CPU: compute only
        delay_mark = run_delay() if speed < 1 else None
        last_target = cpu / speed
        optimizer.step()
        loss = loss_sum.item() / len(inputs)
        step_s = time.perf_counter() - start
        log.write(json.dumps({"step": step, "step_s": step_s, "loss": loss,
                              "compute_s": cpu / speed, "wait_s": max(0.0, backward_end - ready)})
                  + "\n")


def nice_for(speed):
    """The CPU priority chorus gives an emulated device (SpeedEmulator::niceFor)."""
    return int(min(19.0, max(0.0, round(5.0 * math.log2(1.0 / speed)))))


def main():
    """Entry point: one intra-op thread, Gloo process group from torchrun's environment."""
    args = parse_args()
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    # The same emulation as chorus: slower emulated devices yield the shared cores to faster ones
    # (before Gloo starts its threads, which inherit the priority).
    speeds = [float(s) for s in args.speeds.split(",")]
    os.nice(nice_for(speeds[int(os.environ["RANK"])]))
    dist.init_process_group("gloo")
    try:
        train(args)
        dist.barrier()  # nobody tears Gloo down while a peer still talks to it
        gc.collect()  # the DDP reducer (in reference cycles) goes before its process group
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
