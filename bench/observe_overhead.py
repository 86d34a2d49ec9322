#!/usr/bin/env python3
"""Overhead of observability on the default job: metrics (--metrics-port 0, each worker sends its
agent a report after every step) and the trace (--trace covering every measured step), each
against a plain run, measured in the same session.

Runs the built-in default job (`chorus train` with no config: the residual CNN on Fashion-MNIST,
devices = auto) for --steps steps in three settings, in rounds that alternate the settings so a
drift of the host's load touches all alike, and reads rank 0's per-step log (--log-json). For each
setting: the median step time over the steps after --warmup. Overhead = median(setting) /
median(plain) - 1, per round, and its median over the rounds. Writes bench/results/observe.json.

    bench/observe_overhead.py [--build build] [--steps 60] [--warmup 10] [--rounds 3]
                              [--out bench/results/observe.json]
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
SETTINGS = {
    "plain": [],
    "metrics": ["--metrics-port", "0"],
    "trace": ["--trace", "{dir}/trace.json", "--trace-steps", "0:{steps}"],
}


def run_once(chorus, setting, args, workdir):
    log = os.path.join(workdir, f"{setting}.jsonl")
    extra = [a.format(dir=workdir, steps=args.steps) for a in SETTINGS[setting]]
    command = [chorus, "train", "--steps", str(args.steps), "--set", "train.eval_every=0",
               "--set", "train.target_accuracy=0", "--log-json", log, *extra]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    with open(log) as lines:
        steps = [json.loads(line) for line in lines]
    return statistics.median(s["step_s"] for s in steps[args.warmup:])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "observe.json"))
    args = parser.parse_args()
    chorus = os.path.join(args.build, "chorus")
    rounds = []
    with tempfile.TemporaryDirectory(prefix="chorus-observe-bench-") as workdir:
        for round_index in range(args.rounds):
            medians = {s: run_once(chorus, s, args, workdir) for s in SETTINGS}
            rounds.append(medians)
            print(f"round {round_index + 1}: median step " +
                  ", ".join(f"{s} {m * 1000:.1f} ms" for s, m in medians.items()) +
                  f"; metrics {medians['metrics'] / medians['plain'] - 1:+.2%}, "
                  f"trace {medians['trace'] / medians['plain'] - 1:+.2%}", flush=True)
    result = {
        "bench": "observe_overhead",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(), "cores": os.cpu_count(),
        "job": "built-in default (cnn, fashion-mnist, devices auto)",
        "steps": args.steps, "warmup": args.warmup, "rounds": rounds,
        "overhead_median": {
            s: statistics.median(r[s] / r["plain"] - 1 for r in rounds)
            for s in ("metrics", "trace")},
        "targets": {"metrics": 0.01, "trace": 0.03},
    }
    print("| setting | median step (ms), per round | overhead (median of rounds) | target |")
    print("|---|---|---|---|")
    def per_round(setting):
        return ", ".join(f"{r[setting] * 1000:.1f}" for r in rounds)

    print(f"| plain | {per_round('plain')} | — | — |")
    for s in ("metrics", "trace"):
        print(f"| {s} | {per_round(s)} | "
              f"{result['overhead_median'][s]:+.2%} | ≤ {result['targets'][s]:.0%} |")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as out:
        json.dump(result, out, indent=2)
        out.write("\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
