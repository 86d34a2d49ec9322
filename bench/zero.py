#!/usr/bin/env python3
"""ZeRO stages 1 and 2 against replicated data parallelism (stage 0): throughput and memory.

Runs `chorus train` on the zoo's GPT with AdamW on three CPU workers (real processes, the shm
transport), alternately with zero.stage = 0, 1 and 2 (stages 1 and 2 with the given shards), and
reads rank 0's per-step log (--log-json). For each stage: the median step time over the steps
after the warm-up, per round, and its ratio to stage 0's in the same round (the ratio is the
figure: the rounds interleave the stages, so a drift of the host's load touches all alike).
Every worker also reports its peak bytes (the counting allocator of a memory budget: each worker
gets a budget large enough never to bind, so that its allocations are counted), from the log
line "memory budget ... peak".

Writes bench/results/zero.json.

    bench/zero.py [--build build] [--steps 30] [--warmup 5] [--rounds 3] [--global-batch 24]
                  [--shards 0.5,0.3,0.2] [--out bench/results/zero.json]

PyTorch FSDP is not compared: the zoo's GPT has no Python twin here (docs/performance.md).
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def job(args, stage, log):
    settings = {
        "devices": "cpu,cpu,cpu", "balance": "off", "seed": "1",
        "train.steps": str(args.steps), "train.global_batch": str(args.global_batch),
        "train.eval_every": "0", "train.eval_samples": "32", "train.log_every": "1000",
        "train.target_accuracy": "0", "model.kind": "gpt", "data.dataset": "synthetic",
        "data.size": "4096", "optimizer.name": "adamw", "optimizer.lr": "0.001",
        "zero.stage": str(stage),
    }
    if stage > 0:
        settings["zero.shards"] = "[" + args.shards + "]"
    command = [os.path.join(ROOT, args.build, "chorus"), "train", "--log-json", log]
    for key, value in settings.items():
        command += ["--set", f"{key}={value}"]
    return command


def run_stage(args, stage, workdir, round_index):
    log = os.path.join(workdir, f"zero{stage}_{round_index}.jsonl")
    result = subprocess.run(job(args, stage, log), capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        sys.exit(f"stage {stage} failed:\n{result.stdout}\n{result.stderr}")
    with open(log) as lines:
        steps = [json.loads(line) for line in lines if line.strip()]
    times = [step["step_s"] for step in steps[args.warmup:]]
    return {"median_step_s": statistics.median(times), "steps": len(times),
            "final_loss": steps[-1]["loss"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--global-batch", type=int, default=24)
    parser.add_argument("--shards", default="0.5,0.3,0.2")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "zero.json"))
    args = parser.parse_args()
    started = datetime.datetime.now(datetime.timezone.utc)
    load_before = os.getloadavg()
    rounds = []
    with tempfile.TemporaryDirectory() as workdir:
        for index in range(args.rounds):
            measured = {stage: run_stage(args, stage, workdir, index) for stage in (0, 1, 2)}
            base = measured[0]["median_step_s"]
            for stage in (0, 1, 2):
                measured[stage]["vs_stage0"] = base / measured[stage]["median_step_s"]
            rounds.append(measured)
            print(f"round {index + 1}: " + ", ".join(
                f"stage {s} {m['median_step_s'] * 1000:.1f} ms ({m['vs_stage0']:.3f}x)"
                for s, m in measured.items()), flush=True)
    summary = {}
    for stage in (0, 1, 2):
        ratios = [r[stage]["vs_stage0"] for r in rounds]
        summary[str(stage)] = {"throughput_vs_stage0_min": min(ratios),
                               "throughput_vs_stage0_median": statistics.median(ratios),
                               "median_step_ms": statistics.median(
                                   r[stage]["median_step_s"] * 1000 for r in rounds)}
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    result = {
        "benchmark": "zero", "date": started.isoformat(timespec="seconds"),
        "machine": {"nproc": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version(), "git_commit": commit,
                    "loadavg_before": load_before, "loadavg_after": os.getloadavg()},
        "settings": vars(args), "rounds": [{str(k): v for k, v in r.items()} for r in rounds],
        "summary": summary,
    }
    with open(args.out, "w") as out:
        json.dump(result, out, indent=2)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
