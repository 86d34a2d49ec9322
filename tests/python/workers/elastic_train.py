"""An elastic training worker for test_elastic.py, started by `chorus run --elastic`.

    python elastic_train.py OUT_DIR --steps N --global-batch B --shares 10,20,34
                            [--fault-member M --fault-step S --fault kill|stop]
                            [--heartbeat SECONDS] [--scaler] [--hold-member H]

Trains train.py's MLP on its synthetic data with chorus.elastic_steps, SGD with momentum (so
that the optimizer state a survivor takes over matters) and fixed shares. Member M injects its
own fault at the start of step S, read from the command line at start-up: `kill` SIGKILLs
itself, `stop` writes its pid to OUT_DIR/stopped.pid and SIGSTOPs itself (the test continues it
once the survivors are done). Member H (--hold-member) waits in step S, between its forward and
its backward, until the loss has aborted its world. Rank 0 of each generation prints one line per completed step,
"STEP <step> generation <g> loss <loss>"; each worker that finishes writes
OUT_DIR/member<M>.pt: its final parameters, optimizer state, the shares of every step it
completed, and the recoveries it took part in. A worker the others left out prints "LEFT OUT"
and exits 3.
"""

import argparse
import os
import signal
import sys
import time

import torch
import torch.nn.functional as F

import chorus

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train import make_data, make_model  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--global-batch", type=int, default=64)
    parser.add_argument("--shares", default="")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--fault-member", type=int, default=-1)
    parser.add_argument("--fault-step", type=int, default=-1)
    parser.add_argument("--fault", default="kill", choices=("kill", "stop"))
    parser.add_argument("--heartbeat", type=float, default=1.0)
    parser.add_argument("--scaler", action="store_true")
    parser.add_argument("--hold-member", type=int, default=-1)
    args = parser.parse_args()

    ctx = chorus.init(heartbeat=args.heartbeat)
    assert ctx.elastic, "test_elastic starts this worker under chorus run --elastic"
    data = make_data()
    shares = [int(s) for s in args.shares.split(",")] if args.shares else None
    model = chorus.DataParallel(make_model(), global_batch=args.global_batch, balance="fixed",
                                shares=shares)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0) if args.scaler else None
    sampler = chorus.ShardSampler(data, global_batch=args.global_batch, seed=3)
    loader = torch.utils.data.DataLoader(data, batch_sampler=sampler)
    faulty = ctx.member == args.fault_member

    def train_step(batch):
        inputs, targets = batch
        if faulty and model.step_count == args.fault_step:
            if args.fault == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            with open(os.path.join(args.out, "stopped.pid"), "w") as f:
                f.write(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGSTOP)
        loss = F.cross_entropy(model(inputs), targets, reduction="sum")
        held = ctx.member == args.hold_member and model.step_count == args.fault_step and \
            ctx.generation == 0
        if held:
            # Backward only once the loss aborted the world: its buckets' all-reduces then fail
            # in their autograd hooks, and the failure reaches Python from backward().
            deadline = time.monotonic() + 30
            while not ctx.world.broken and time.monotonic() < deadline:
                time.sleep(0.01)
        try:
            (scaler.scale(loss) if scaler is not None else loss).backward()
        except Exception as error:
            if held:
                print(f"HELD member {ctx.member}: backward raised {type(error).__name__}",
                      flush=True)
            raise
        return chorus.step(optimizer, scaler=scaler, loss=loss)

    record = {"steps": [], "shares": []}
    try:
        for info in chorus.elastic_steps(loader, train_step, optimizer, args.steps,
                                         scaler=scaler):
            record["steps"].append(info.step)
            record["shares"].append(info.shares)
            if ctx.rank == 0:
                print(f"STEP {info.step} generation {ctx.generation} loss {info.loss:.6f}",
                      flush=True)
    except chorus.CommError as error:
        print(f"LEFT OUT member {ctx.member}: {error}", flush=True)
        sys.exit(3)
    record["parameters"] = [p.detach().clone() for p in model.module.parameters()]
    record["momentum"] = [optimizer.state[p]["momentum_buffer"].clone()
                          for p in model.module.parameters()]
    record["recoveries"] = [vars(r) for r in ctx.recoveries]
    record["rank"] = ctx.rank
    record["world_size"] = ctx.world_size
    torch.save(record, os.path.join(args.out, f"member{ctx.member}.pt"))


if __name__ == "__main__":
    main()
