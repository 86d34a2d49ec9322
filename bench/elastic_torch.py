#!/usr/bin/env python3
"""PyTorch's side of bench/elastic.py: the job in DDP, restarted by torchrun from a checkpoint.

Run under torchrun, one process per rank, Gloo, CPU, one intra-op thread each (as chorus's CPU
workers), restarted once by torchrun's elastic agent when a worker dies:

    python3 -m torch.distributed.run --nproc-per-node 3 --max-restarts 1 --rdzv-backend c10d \
        --rdzv-endpoint localhost:29400 bench/elastic_torch.py --events run.jsonl \
        --checkpoint ckpt.pt --kill-rank 1 --kill-point forward --kill-step 17

The job is chorus's elastic bench job: the MLP of `model.kind = "mlp"` with hidden [64, 32]
(src/model/mlp.cc: Linear + ReLU per hidden layer, a linear head, weights and biases uniform in
+-1/sqrt(fan_in)) on inputs of [1, 28, 28] and 10 classes; synthetic samples shaped as chorus's
(src/data/synthetic.cc: a per-class prototype plus per-sample noise, both uniform in [-1, 1);
the values come from another generator); the global batch split evenly over the ranks, taken from
a per-epoch permutation that depends on the step alone (so a replayed step takes the same batch);
AdamW (betas 0.9/0.999, eps 1e-8, no weight decay), cosine from lr to a tenth, no warm-up; DDP
buckets of a quarter of the gradient (chorus's rule).

Rank 0 writes a checkpoint (model, optimizer, step) every --checkpoint-every steps with
torch.save to a temporary file renamed over the last one (atomic). Each worker starts from the
checkpoint when there is one. On the first attempt only (TORCHELASTIC_RESTART_COUNT = 0) the
--kill-rank worker SIGKILLs itself at --kill-point of step --kill-step (from 0, as CHORUS_FAULT's
STEP): "forward" before the forward pass, "reduce" in DDP's communication hook of the last
gradient bucket (the others in flight), "optimizer" after backward, before the optimizer steps.

--events gets rank 0's JSON lines, appended: {"event": "start", "attempt", "started", "imported",
"connected", "ready", "resumed_step"} per attempt (unix times: the script's first line, after
importing torch, after the process group, after the data, model, AdamW, checkpoint and DDP) and
{"step" (from 1), "time", "attempt", "loss"} after each step; EVENTS.kill the victim's
{"event": "kill", "time", ...}, written just before its SIGKILL.
"""
import time

STARTED = time.time()  # before importing torch: a restarted worker's first moment

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import warnings  # noqa: E402

warnings.filterwarnings("ignore", message=".*NumPy.*")  # this image has no NumPy; nothing uses it

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

IMPORTED = time.time()
INPUT_SHAPE = (1, 28, 28)  # chorus's default model.input_shape
CLASSES = 10


def build_model(hidden, seed):
    """chorus's Mlp: flatten, Linear + ReLU per hidden width, a linear head; fan-in uniform init."""
    layers, width = [nn.Flatten()], math.prod(INPUT_SHAPE)
    for out in hidden:
        layers += [nn.Linear(width, out), nn.ReLU()]
        width = out
    layers.append(nn.Linear(width, CLASSES))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in layers:
            if isinstance(layer, nn.Linear):
                bound = 1.0 / math.sqrt(layer.in_features)
                layer.weight.uniform_(-bound, bound, generator=generator)
                layer.bias.uniform_(-bound, bound, generator=generator)
    return nn.Sequential(*layers)


def synthetic_dataset(size, seed):
    """Samples shaped as chorus's SyntheticClassification: prototype[label] + noise."""
    generator = torch.Generator().manual_seed(seed)
    features = math.prod(INPUT_SHAPE)
    prototypes = torch.rand(CLASSES, features, generator=generator) * 2 - 1
    labels = torch.randint(0, CLASSES, (size,), generator=generator)
    noise = torch.rand(size, features, generator=generator) * 2 - 1
    return (prototypes[labels] + noise).view(size, *INPUT_SHAPE), labels


def batch_ids(step, size, global_batch, seed):
    """The global batch of `step`: a slice of its epoch's permutation, as chorus's GlobalSampler."""
    per_epoch = size // global_batch
    epoch, position = divmod(step, per_epoch)
    order = torch.randperm(size, generator=torch.Generator().manual_seed(seed * 7919 + epoch))
    return order[position * global_batch:(position + 1) * global_batch]


def learning_rate(args, step):
    """runtime::learningRateAt without warm-up: cosine from lr to min_lr_ratio * lr."""
    progress = min(1.0, step / max(1, args.steps))
    floor = args.lr * args.min_lr_ratio
    return floor + (args.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def append_json(path, record):
    """Appends one line (and one write) to the JSON lines at `path`."""
    with open(path, "a") as log:
        log.write(json.dumps(record) + "\n")


class Fault:
    """The victim's self-kill at one point of one step, on the first attempt only."""

    def __init__(self, args, rank, attempt):
        self.armed = attempt == 0 and rank == args.kill_rank and args.kill_step >= 0
        self.args, self.rank, self.step = args, rank, -1

    def at(self, point):
        if not self.armed or self.step != self.args.kill_step or point != self.args.kill_point:
            return
        append_json(self.args.events + ".kill", {"event": "kill", "time": time.time(),
                                                 "rank": self.rank, "step": self.step,
                                                 "point": point, "pid": os.getpid()})
        os.kill(os.getpid(), signal.SIGKILL)


def reduce_hook(fault):
    """DDP's all-reduce hook, with the "reduce" fault before the last bucket's all-reduce."""
    def hook(state, bucket):
        if bucket.is_last():
            fault.at("reduce")
        return default_hooks.allreduce_hook(state, bucket)
    return hook


def save_checkpoint(path, step, model, optimizer):
    """Atomic: a kill during the write leaves the previous checkpoint whole."""
    temporary = path + ".tmp"
    torch.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()},
               temporary)
    os.replace(temporary, path)


def load_checkpoint(path, model, optimizer):
    """The number of completed steps in the checkpoint, 0 without one."""
    if not os.path.exists(path):
        return 0
    state = torch.load(path, weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return state["step"]


def train(args):
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    torch.set_num_threads(1)
    # torchrun shares its rendezvous TCPStore with the workers of every attempt (unless
    # TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1), and this torch adds no per-attempt prefix: a restarted
    # worker would read the dead attempt's Gloo addresses. So each attempt gets its own prefix.
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False)
    dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt_{attempt}", store),
                            rank=rank, world_size=world)
    connected = time.time()
    inputs, labels = synthetic_dataset(args.data_size, args.seed)
    model = build_model(args.hidden, args.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.999), eps=1e-8,
                                  weight_decay=0.0)
    first = load_checkpoint(args.checkpoint, model, optimizer)
    gradient_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    ddp = DistributedDataParallel(model, bucket_cap_mb=max(32 * 1024, gradient_bytes // 4) / 2**20)
    fault = Fault(args, rank, attempt)
    ddp.register_comm_hook(dist.group.WORLD, reduce_hook(fault))
    local = args.global_batch // world
    if rank == 0:
        append_json(args.events, {"event": "start", "attempt": attempt, "started": STARTED,
                               "imported": IMPORTED, "connected": connected, "ready": time.time(),
                               "resumed_step": first})
    for step in range(first, args.steps):
        fault.step = step
        ids = batch_ids(step, args.data_size, args.global_batch, args.seed)
        mine = ids[rank * local:(rank + 1) * local]
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(args, step)
        optimizer.zero_grad(set_to_none=True)
        fault.at("forward")
        loss = F.cross_entropy(ddp(inputs[mine]), labels[mine])
        loss.backward()
        fault.at("optimizer")
        optimizer.step()
        if rank == 0:
            append_json(args.events, {"step": step + 1, "time": time.time(), "attempt": attempt,
                                   "loss": loss.item()})
            if (step + 1) % args.checkpoint_every == 0:
                save_checkpoint(args.checkpoint, step + 1, model, optimizer)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", required=True, help="JSON lines, appended")
    parser.add_argument("--checkpoint", required=True, help="the checkpoint file")
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--global-batch", type=int, default=120)
    parser.add_argument("--data-size", type=int, default=4096)
    parser.add_argument("--hidden", type=lambda text: [int(w) for w in text.split(",")],
                        default=[64, 32])
    parser.add_argument("--lr", type=float, default=0.003)
    parser.add_argument("--min-lr-ratio", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--kill-rank", type=int, default=-1)
    parser.add_argument("--kill-step", type=int, default=-1, help="from 0; -1: no fault")
    parser.add_argument("--kill-point", choices=["forward", "reduce", "optimizer"],
                        default="forward")
    train(parser.parse_args())


if __name__ == "__main__":
    main()
