#!/usr/bin/env python3
"""The Python front's side of bench/python_front.py: chorus's residual CNN, written in PyTorch
(bench/ddp_baseline.py's ResidualCNN, the architecture of src/model/cnn.cc), trained with
chorus.DataParallel, ShardSampler, a DataLoader and chorus.step, as a user's script would.

    chorus run --devices cpu@1,cpu@0.5 -- python3 bench/python_front_worker.py LOG.jsonl ...

Rank 0 writes one JSON object per step in the format of `chorus train --log-json` (the fields
bench/hetero_dp.py's summarize() reads): step (from 1), step_s (its wall time of the whole step,
data loading included), compute_s and wait_s per rank, shares, loss.
"""

import argparse
import json
import os
import sys
import time
import warnings

warnings.filterwarnings("ignore", message=".*NumPy.*")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import chorus  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddp_baseline import CLASSES, INPUT_SHAPE, ResidualCNN  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("log")
    parser.add_argument("--global-batch", type=int, default=192)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--balance", default="adaptive")
    parser.add_argument("--channels", type=int, default=32)
    parser.add_argument("--blocks", type=int, default=2)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--data-size", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    ctx = chorus.init()
    generator = torch.Generator().manual_seed(args.seed)
    data = torch.utils.data.TensorDataset(
        torch.randn((args.data_size,) + INPUT_SHAPE, generator=generator),
        torch.randint(0, CLASSES, (args.data_size,), generator=generator))
    torch.manual_seed(args.seed)
    model = chorus.DataParallel(ResidualCNN(args.channels, args.blocks, args.groups),
                                global_batch=args.global_batch, balance=args.balance)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sampler = chorus.ShardSampler(data, global_batch=args.global_batch, seed=args.seed)
    loader = torch.utils.data.DataLoader(data, batch_sampler=sampler)
    log = open(args.log, "w", encoding="utf-8") if ctx.rank == 0 else None
    start = time.perf_counter()
    while model.step_count < args.steps:
        for inputs, targets in loader:
            loss = F.cross_entropy(model(inputs), targets, reduction="sum")
            loss.backward()
            info = chorus.step(optimizer, loss=loss)
            now = time.perf_counter()
            if log:
                log.write(json.dumps({"step": info.step + 1, "step_s": now - start,
                                      "compute_s": info.compute_seconds,
                                      "wait_s": info.wait_seconds, "shares": info.shares,
                                      "loss": info.loss, "rebalance": info.rebalance}) + "\n")
            start = now
            if model.step_count >= args.steps:
                break
    if log:
        log.close()


if __name__ == "__main__":
    main()
