#!/usr/bin/env python3
"""A weaker device never slows a stronger one: `chorus train` on a strong device alone against the
same job with a weak device beside it, in paired runs.

    python3 bench/weak_device.py                                  # cpu@1.0 against cpu@1.0,cpu@0.01
    python3 bench/weak_device.py --strong cuda:0 --weak cpu       # on a GPU machine

Each pair runs the job twice, alone first, then with the weak device (`--strong` then
`--strong,--weak`), on the example CNN (examples/hetero-emulated.toml: channels 32, 2 blocks,
Fashion-MNIST or synthetic data) at global batch --batch, --steps steps; a run's throughput is the
median samples/s of its last --tail steps (after the balancer's profile and any leave-out).
Reported: per pair the two throughputs and their ratio (mixed / alone), then the min and median
of the ratios, the mixed runs' first and last shares and whether the log says the weak device
was left out. The target of issue 38: the median ratio >= 0.97 on CPU (>= 0.98 for cuda:0,cpu).

JSON goes to --out (default bench/results/weak_device_<date>.json) with the host's CPU model, the
load average before and after, torch's version and chorus's commit.
"""

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = os.path.join(REPO, "examples", "hetero-emulated.toml")


def cpu_model():
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def commit():
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                          text=True, check=False)
    return done.stdout.strip() or "unknown"


def run_job(args, devices, workdir, name):
    """Runs one `chorus train`; returns its per-step JSON rows and its output."""
    log = os.path.join(workdir, name + ".jsonl")
    command = [args.chorus, "train", JOB, "--steps", str(args.steps), "--log-json", log,
               "--set", f'devices="{devices}"', "--set", f"train.global_batch={args.batch}",
               "--set", "train.eval_every=0", "--set", "train.log_every=1000",
               # cpu@1.0 alone would compute on every core; beside an emulated device on one
               "--set", "cpu_threads=1"]
    if args.synthetic:
        command += ["--set", 'data.dataset="synthetic"', "--set", "data.size=8192"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=args.timeout,
                          check=False)
    output = done.stdout + done.stderr
    if done.returncode != 0:
        sys.exit(f"weak_device: {devices} failed ({done.returncode}):\n{output[-3000:]}")
    with open(log) as lines:
        rows = [json.loads(line) for line in lines if line.strip()]
    return rows, output


def throughput(rows, tail):
    return statistics.median(row["samples_per_s"] for row in rows[-tail:])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--strong", default="cpu@1.0", help="the strong device (default cpu@1.0)")
    parser.add_argument("--weak", default="cpu@0.01", help="the weak device (default cpu@0.01)")
    parser.add_argument("--batch", type=int, default=96, help="global batch (default 96)")
    parser.add_argument("--steps", type=int, default=50, help="steps per run (default 50)")
    parser.add_argument("--tail", type=int, default=20, help="steps measured (default the last 20)")
    parser.add_argument("--pairs", type=int, default=5, help="paired runs (default 5)")
    parser.add_argument("--synthetic", action="store_true",
                        help="synthetic data instead of Fashion-MNIST (a GPU image has no data)")
    parser.add_argument("--chorus", default=os.path.join(REPO, "build", "chorus"))
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    load_before = os.getloadavg()[0]
    pairs = []
    with tempfile.TemporaryDirectory(prefix="weak_device.") as workdir:
        for k in range(args.pairs):
            alone_rows, _ = run_job(args, args.strong, workdir, f"alone{k}")
            mixed_rows, output = run_job(args, f"{args.strong},{args.weak}", workdir, f"mixed{k}")
            alone, mixed = throughput(alone_rows, args.tail), throughput(mixed_rows, args.tail)
            left_out = re.search(r"left out: [^\n]*", output)
            pair = {"alone_samples_per_s": alone, "mixed_samples_per_s": mixed,
                    "mixed_over_alone": mixed / alone, "first_shares": mixed_rows[0]["shares"],
                    "last_shares": mixed_rows[-1]["shares"],
                    "left_out": left_out.group(0) if left_out else None}
            pairs.append(pair)
            print(f"pair {k + 1}/{args.pairs}: alone {alone:8.1f} samples/s, with {args.weak} "
                  f"{mixed:8.1f} ({mixed / alone:.3f}); shares {pair['first_shares']} -> "
                  f"{pair['last_shares']}", flush=True)
    ratios = [pair["mixed_over_alone"] for pair in pairs]
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host_cpu": cpu_model(), "cores": os.cpu_count(), "commit": commit(),
        "load_before": load_before, "load_after": os.getloadavg()[0],
        "strong": args.strong, "weak": args.weak, "global_batch": args.batch,
        "steps": args.steps, "tail": args.tail, "synthetic": args.synthetic,
        "ratio_min": min(ratios), "ratio_median": statistics.median(ratios), "pairs": pairs,
    }
    print(f"{args.strong},{args.weak} over {args.strong} alone: median {result['ratio_median']:.3f}"
          f", min {result['ratio_min']:.3f} over {len(ratios)} pairs ({cpu_model()}, load "
          f"{load_before:.2f} -> {result['load_after']:.2f})")
    out = args.out or os.path.join(
        REPO, "bench", "results", f"weak_device_{datetime.date.today().isoformat()}.json")
    with open(out, "w") as handle:
        json.dump(result, handle, indent=2)
        handle.write("\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
