"""A training worker for the pytest suite, started by `chorus run` (or alone, as a job of one).

    python train.py OUT_DIR --steps N --global-batch B [--shares 5,17,42] [--balance fixed]
                    [--save-at S] [--resume] [--die-at S --die-rank R --die-how kill|stall]
                    [--overflow-at S --overflow-rank R] [--dropout P] [--model mlp|cnn]
                    [--zero 0|1|2|3 --shards memory|even|0.2,0.3,0.5] [--optimizer sgd|adamw]
                    [--on-device] [--amp bf16|fp16] [--algorithm flat|hierarchical|2d|auto]

Trains a small model on synthetic data (seeded) with chorus.DataParallel, ShardSampler and
chorus.step, plain SGD, and writes OUT_DIR/rank<R>.pt with the final parameters, the shares and
losses of every step. The data and initial model depend only on the seeds, so the test can
replay the same global batches in one process and compare. --on-device puts the model and each
batch on the rank's device (`chorus run --devices cuda:0,cpu`: a CUDA module beside a CPU one);
--amp runs forward under torch.autocast on that device (fp16 with a GradScaler).
"""

import argparse
import os
import signal
import sys
import time

import torch
import torch.nn.functional as F

import chorus


def make_data(samples=512, features=20, classes=5):
    generator = torch.Generator().manual_seed(1234)
    inputs = torch.randn(samples, features, generator=generator)
    targets = torch.randint(0, classes, (samples,), generator=generator)
    return torch.utils.data.TensorDataset(inputs, targets)


def make_model(kind="mlp", dropout=0.0, features=20, classes=5, width=64):
    torch.manual_seed(7)
    if kind == "mlp":
        return torch.nn.Sequential(torch.nn.Linear(features, width), torch.nn.Tanh(),
                                   torch.nn.Dropout(dropout), torch.nn.Linear(width, width),
                                   torch.nn.Tanh(), torch.nn.Linear(width, classes))
    if kind == "conv":  # much compute per sample, few parameters: little fixed cost per step
        return torch.nn.Sequential(torch.nn.Unflatten(1, (1, 28, 28)),
                                   torch.nn.Conv2d(1, 32, 3, padding=1), torch.nn.ReLU(),
                                   torch.nn.Conv2d(32, 32, 3, padding=1), torch.nn.ReLU(),
                                   torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                   torch.nn.Linear(32, classes))
    raise SystemExit(f"unknown model {kind}")


def make_optimizer(kind, parameters, lr, momentum):
    if kind == "sgd":
        return torch.optim.SGD(parameters, lr=lr, momentum=momentum)
    if kind == "adamw":
        return torch.optim.AdamW(parameters, lr=lr, weight_decay=0.01)
    raise SystemExit(f"unknown optimizer {kind}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--global-batch", type=int, default=64)
    parser.add_argument("--shares", default="")
    parser.add_argument("--balance", default="fixed")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.0)
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--save-at", type=int, default=-1)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--die-at", type=int, default=-1)
    parser.add_argument("--die-rank", type=int, default=-1)
    parser.add_argument("--die-how", default="kill")
    parser.add_argument("--overflow-at", type=int, default=-1)
    parser.add_argument("--overflow-rank", type=int, default=0)
    parser.add_argument("--zero", type=int, default=0)
    parser.add_argument("--shards", default="")
    parser.add_argument("--optimizer", default="sgd")
    parser.add_argument("--on-device", action="store_true")
    parser.add_argument("--algorithm", default="flat")
    parser.add_argument("--amp", default="", choices=["", "bf16", "fp16"])
    args = parser.parse_args()

    # The launcher stops every worker (SIGTERM) when one dies; the failure tests want to see what
    # the survivors' collectives report first, so they ignore it (the launcher's SIGKILL after
    # --grace still ends them).
    ctx = chorus.init()
    if args.die_at >= 0 and ctx.rank != args.die_rank:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    data = make_data(args.samples, 784 if args.model == "conv" else 20)
    shares = [int(s) for s in args.shares.split(",")] if args.shares else None
    zero_shards = None
    if args.shards:
        zero_shards = (args.shards if args.shards in ("memory", "even")
                       else [float(f) for f in args.shards.split(",")])
    device = ctx.device if args.on_device else torch.device("cpu")
    model = chorus.DataParallel(make_model(args.model, args.dropout).to(device),
                                global_batch=args.global_batch,
                                balance=args.balance, shares=shares, zero=args.zero,
                                shards=zero_shards, algorithm=args.algorithm)
    optimizer = make_optimizer(args.optimizer, model.parameters(), args.lr, args.momentum)
    sampler = chorus.ShardSampler(data, global_batch=args.global_batch, seed=3)
    # Its own generator: a DataLoader draws a seed from the global RNG whenever an iterator starts
    # (each epoch, and at a resume), which would shift the dropout masks of a resumed job.
    loader = torch.utils.data.DataLoader(data, batch_sampler=sampler,
                                         generator=torch.Generator().manual_seed(0))
    scaler = None
    if args.overflow_at >= 0 or args.amp == "fp16":
        scaler = torch.amp.GradScaler(device.type, init_scale=1024.0)
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.amp)
    checkpoint = os.path.join(args.out, "checkpoint.pt")
    torch.manual_seed(100 + ctx.rank)  # dropout differs by rank; a resume restores each RNG
    if args.resume:
        chorus.load(checkpoint, model=model, optimizer=optimizer, sampler=sampler)
    record = {"shares": [], "losses": [], "skipped": [], "scales": [], "compute": []}
    start_step = model.step_count
    while model.step_count < args.steps:
        for inputs, targets in loader:
            step = model.step_count
            began = time.monotonic()
            if step == args.die_at and ctx.rank == args.die_rank:
                if args.die_how == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(3600)  # stall: never arrive
            inputs, targets = inputs.to(device), targets.to(device)
            with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                loss = F.cross_entropy(model(inputs), targets, reduction="sum")
            if step == args.overflow_at and ctx.rank == args.overflow_rank:
                loss = loss * float("inf")
            try:
                if scaler is not None:
                    scaler.scale(loss).backward()
                    info = chorus.step(optimizer, scaler=scaler, loss=loss)
                    record["scales"].append(scaler.get_scale())
                else:
                    loss.backward()
                    info = chorus.step(optimizer, loss=loss)
            except chorus.CommError as error:
                missing = getattr(error, "missing_ranks", None) or getattr(error, "ranks", [])
                print(f"CAUGHT {type(error).__name__} step={step} ranks={missing} "
                      f"isTimeoutError={isinstance(error, TimeoutError)} "
                      f"elapsed={time.monotonic() - began:.2f} message={error}",
                      flush=True)
                sys.exit(3)
            record["shares"].append(info.shares)
            record["losses"].append(info.loss)
            record["skipped"].append(info.skipped)
            record["compute"].append(info.compute_seconds)
            if info.rebalance and ctx.rank == 0:
                print("rebalance:", info.rebalance, flush=True)
            if model.step_count == args.save_at:
                chorus.save(checkpoint, model=model, optimizer=optimizer, sampler=sampler)
            if model.step_count >= args.steps:
                break
    record["start_step"] = start_step
    record["sampler_step"] = sampler.step
    # ZeRO-3 keeps no parameter values between steps: bytes held now, then gathered to read.
    record["parameter_bytes"] = sum(p.untyped_storage().nbytes() for p in model.parameters())
    with model.gathered():
        record["parameters"] = [p.detach().cpu().clone() for p in model.module.parameters()]
    record["shard_bounds"] = model.shard_bounds
    record["shard_fractions"] = model.shard_fractions
    record["optimizer_elements"] = sum(t.numel() for state in optimizer.state.values()
                                       for t in state.values()
                                       if torch.is_tensor(t) and t.dim() > 0)
    record["speed"] = ctx.worker.speed
    torch.save(record, os.path.join(args.out, f"rank{ctx.rank}.pt"))


if __name__ == "__main__":
    main()
