#!/usr/bin/env python3
"""The training script of bench/python_elastic.py, with its two ways of surviving a lost worker.

    chorus run --elastic --devices cpu,cpu,cpu -- python3 python_elastic_worker.py --front chorus \
        --events run.jsonl --kill-member 1 --kill-step 17
    python3 -m torch.distributed.run --nproc-per-node 3 --max-restarts 1 --rdzv-backend c10d \
        --rdzv-endpoint localhost:29400 python_elastic_worker.py --front torch --events run.jsonl \
        --checkpoint ckpt.pt --kill-member 1 --kill-step 17

The same job either way: an MLP 784-256-128-10 on seeded synthetic data, a global batch of 96
split evenly over 3 CPU workers (one intra-op thread each), SGD with momentum. `--front chorus`
runs it through chorus.DataParallel and chorus.elastic_steps (the survivors regroup and redo the
interrupted step); `--front torch` is what a torchrun user writes: DDP over Gloo, rank 0 saving a
checkpoint every --checkpoint-every steps, every worker resuming from it when torchrun restarts
them all. The victim (--kill-member, its launch rank) SIGKILLs itself before the forward pass of
--kill-step (from 0), on torchrun's first attempt only, after appending {"event": "kill", "time"}
to EVENTS.kill. Rank 0 appends {"step", "time", "attempt"} to EVENTS after each step ("attempt":
chorus's generation, or torchrun's restart count) and {"event": "start", ...} at each start.
"""
import time

STARTED = time.time()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import warnings  # noqa: E402

warnings.filterwarnings("ignore", message=".*NumPy.*")  # this image has no NumPy; nothing uses it

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

FEATURES, CLASSES, SAMPLES = 784, 10, 4800


def make_data():
    generator = torch.Generator().manual_seed(11)
    prototypes = torch.rand(CLASSES, FEATURES, generator=generator) * 2 - 1
    labels = torch.randint(0, CLASSES, (SAMPLES,), generator=generator)
    noise = torch.rand(SAMPLES, FEATURES, generator=generator) * 2 - 1
    return torch.utils.data.TensorDataset(prototypes[labels] + noise, labels)


def make_model():
    torch.manual_seed(5)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 128), torch.nn.ReLU(),
                               torch.nn.Linear(128, CLASSES))


def append(path, record):
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def kill_now(args, member, step):
    append(args.events + ".kill", {"event": "kill", "time": time.time(), "member": member,
                                   "step": step})
    os.kill(os.getpid(), signal.SIGKILL)


def run_chorus(args):
    import chorus
    ctx = chorus.init()
    if ctx.rank == 0:
        append(args.events, {"event": "start", "attempt": 0, "started": STARTED})
    data = make_data()
    model = chorus.DataParallel(make_model(), global_batch=args.global_batch, balance="fixed")
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loader = torch.utils.data.DataLoader(
        data, batch_sampler=chorus.ShardSampler(data, global_batch=args.global_batch, seed=3))

    def train_step(batch):
        inputs, targets = batch
        if ctx.member == args.kill_member and model.step_count == args.kill_step:
            kill_now(args, ctx.member, model.step_count)
        loss = F.cross_entropy(model(inputs), targets, reduction="sum")
        loss.backward()
        return chorus.step(optimizer, loss=loss)

    for info in chorus.elastic_steps(loader, train_step, optimizer, args.steps):
        if ctx.rank == 0:
            append(args.events, {"step": info.step, "time": time.time(),
                                 "attempt": ctx.generation})


def run_torch(args):
    import torch.distributed as dist
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    torch.set_num_threads(1)
    # Each attempt under a prefix of its own: torchrun shares its rendezvous store with every
    # attempt's workers (see bench/elastic_torch.py).
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False)
    dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt_{attempt}", store),
                            rank=rank, world_size=world)
    data = make_data()
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    first = 0
    if os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        first = state["step"]
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    if rank == 0:
        append(args.events, {"event": "start", "attempt": attempt, "started": STARTED,
                             "resumed_step": first})
    local = args.global_batch // world
    per_epoch = SAMPLES // args.global_batch
    inputs, targets = data.tensors
    for step in range(first, args.steps):
        epoch, position = divmod(step, per_epoch)
        order = torch.randperm(SAMPLES, generator=torch.Generator().manual_seed(3 + epoch))
        ids = order[position * args.global_batch:(position + 1) * args.global_batch]
        mine = ids[rank * local:(rank + 1) * local]
        if attempt == 0 and rank == args.kill_member and step == args.kill_step:
            kill_now(args, rank, step)
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(ddp(inputs[mine]), targets[mine]).backward()
        optimizer.step()
        if rank == 0:
            append(args.events, {"step": step, "time": time.time(), "attempt": attempt})
            if (step + 1) % args.checkpoint_every == 0:
                temporary = args.checkpoint + ".tmp"
                torch.save({"step": step + 1, "model": model.state_dict(),
                            "optimizer": optimizer.state_dict()}, temporary)
                os.replace(temporary, args.checkpoint)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--front", choices=("chorus", "torch"), required=True)
    parser.add_argument("--events", required=True)
    parser.add_argument("--checkpoint", default="")
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--global-batch", type=int, default=96)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--kill-member", type=int, default=-1)
    parser.add_argument("--kill-step", type=int, default=-1)
    args = parser.parse_args()
    (run_chorus if args.front == "chorus" else run_torch)(args)


if __name__ == "__main__":
    main()
