#!/usr/bin/env python3
"""What ZeRO's replicas for elastic recovery (`zero.redundancy = 1`) cost a step.

The GPT of bench/zero.py (AdamW, 3 CPU ranks, global batch 24, even shards) trained with elastic
recovery and ZeRO stage 1, 2 and 3, once without replicas and once with, alternating within each
round so that a slow minute of the host hits both alike. Per run: the median step time after
--warmup steps (from --log-json). The report gives, per stage, the median over rounds of each
and the ratio with / without per round (min / median / max). Memory is not measured here.

    bench/zero_replica.py [--chorus build/chorus] [--rounds 3] [--steps 30] [--warmup 5]
                          [--out bench/results/zero_replica.json]
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


def command_of(args, stage, replicas, log, checkpoints):
    settings = {
        "devices": "cpu,cpu,cpu", "balance": "off", "seed": "1",
        "train.steps": str(args.steps), "train.global_batch": "24", "train.eval_every": "0",
        "train.eval_samples": "32", "train.log_every": "1000", "train.target_accuracy": "0",
        "model.kind": "gpt", "data.dataset": "synthetic", "data.size": "4096",
        "optimizer.name": "adamw", "optimizer.lr": "0.001", "zero.stage": str(stage),
        "zero.shards": "even", "elastic.enabled": "true", "checkpoint.dir": checkpoints,
        "zero.redundancy": "1" if replicas else "0"}
    command = [args.chorus, "train", "--log-json", log]
    for key, value in settings.items():
        command += ["--set", f"{key}={value}"]
    return command


def run_once(args, stage, replicas, workdir, name):
    log = os.path.join(workdir, name + ".jsonl")
    checkpoints = os.path.join(workdir, name + ".ckpt")
    process = subprocess.Popen(command_of(args, stage, replicas, log, checkpoints),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output, _ = process.communicate()
    if process.returncode != 0:
        sys.exit(f"stage {stage} replicas={replicas} failed:\n{output[-3000:]}")
    with open(log) as lines:
        steps = [json.loads(line) for line in lines if '"event"' not in line]
    timed = [s["step_s"] for s in steps if s["step"] > args.warmup]
    return statistics.median(timed)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chorus", default=os.path.join(ROOT, "build", "chorus"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--stages", default="1,2,3")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results",
                                                      "zero_replica.json"))
    args = parser.parse_args()
    stages = [int(s) for s in args.stages.split(",")]
    runs = {stage: {"without": [], "with": []} for stage in stages}
    with tempfile.TemporaryDirectory() as workdir:
        for round_ in range(args.rounds):
            for stage in stages:
                order = [False, True] if round_ % 2 == 0 else [True, False]
                for replicas in order:
                    name = f"s{stage}-{'with' if replicas else 'without'}-{round_}"
                    step = run_once(args, stage, replicas, workdir, name)
                    runs[stage]["with" if replicas else "without"].append(step)
                    print(f"round {round_} stage {stage} replicas={replicas}: "
                          f"median step {step * 1e3:.2f} ms", flush=True)
    summary = {}
    for stage, sides in runs.items():
        ratios = [w / o for w, o in zip(sides["with"], sides["without"])]
        summary[stage] = {
            "median_step_ms_without": statistics.median(sides["without"]) * 1e3,
            "median_step_ms_with": statistics.median(sides["with"]) * 1e3,
            "ratio": {"min": min(ratios), "median": statistics.median(ratios),
                      "max": max(ratios)}, "runs": sides}
        print(f"ZeRO-{stage}: median step {summary[stage]['median_step_ms_without']:.2f} ms "
              f"without replicas, {summary[stage]['median_step_ms_with']:.2f} ms with; "
              f"with / without {min(ratios):.3f} / {statistics.median(ratios):.3f} / "
              f"{max(ratios):.3f} (min / median / max over {args.rounds} rounds)")
    document = {"benchmark": "zero_replica", "date": datetime.datetime.now(
        datetime.timezone.utc).isoformat(timespec="seconds"), "machine": {
            "nproc": os.cpu_count(), "platform": platform.platform()},
        "settings": vars(args), "stages": summary}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as out:
        json.dump(document, out, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
