"""A worker whose steps `chorus run --metrics-port/--trace` observes (test_observe.py,
prometheus_run_test.py).

    python observed.py --steps N [--global-batch B] [--lr LR] [--hold FILE] [--no-loss]
                       [--kill-member M --kill-step S] [--pause SECONDS]

Trains a small MLP on seeded synthetic data with chorus.DataParallel, ShardSampler and
chorus.step for N steps (with loss=, unless --no-loss) through chorus.elastic_steps (a plain loop
unless `chorus run --elastic` started it), then, with --hold, stays until FILE exists (at most
120 s), so that the test can read the agent's metrics of a finished job while the agent still
serves them. Member M SIGKILLs itself at the start of step S. --pause sleeps that long
before each step (as a slow data loader would), so that the agent takes every report even on a
loaded host: its socket queues only 10 datagrams (docs/observability.md, "Limits"). Rank 0
prints "observed: N steps done" when its steps are done.
"""

import argparse
import os
import signal
import sys
import time

import torch
import torch.nn.functional as F

import chorus

HOLD_DEADLINE_S = 120


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--global-batch", type=int, default=48)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--hold")
    parser.add_argument("--no-loss", action="store_true")
    parser.add_argument("--kill-member", type=int, default=-1)
    parser.add_argument("--kill-step", type=int, default=-1)
    parser.add_argument("--pause", type=float, default=0.0)
    args = parser.parse_args()

    ctx = chorus.init()
    generator = torch.Generator().manual_seed(1234)
    inputs = torch.randn(1024, 20, generator=generator)
    targets = torch.randint(0, 5, (1024,), generator=generator)
    data = torch.utils.data.TensorDataset(inputs, targets)
    torch.manual_seed(7)
    module = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.Tanh(),
                                 torch.nn.Linear(64, 5))
    model = chorus.DataParallel(module, global_batch=args.global_batch, balance="fixed")
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    sampler = chorus.ShardSampler(data, global_batch=args.global_batch, seed=0)
    loader = torch.utils.data.DataLoader(data, batch_sampler=sampler)

    def train_step(batch):
        time.sleep(args.pause)
        if ctx.member == args.kill_member and model.step_count == args.kill_step:
            os.kill(os.getpid(), signal.SIGKILL)
        batch_inputs, batch_targets = batch
        loss = F.cross_entropy(model(batch_inputs), batch_targets, reduction="sum")
        loss.backward()
        return chorus.step(optimizer, loss=None if args.no_loss else loss)

    for _ in chorus.elastic_steps(loader, train_step, optimizer, steps=args.steps):
        pass
    done = model.step_count
    if ctx.rank == 0:
        print(f"observed: {done} steps done", flush=True)
    if args.hold:
        deadline = time.monotonic() + HOLD_DEADLINE_S
        while not os.path.exists(args.hold):
            if time.monotonic() > deadline:
                sys.exit(f"rank {ctx.rank}: {args.hold} did not appear within {HOLD_DEADLINE_S} s")
            time.sleep(0.05)


if __name__ == "__main__":
    main()
