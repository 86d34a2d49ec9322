#!/usr/bin/env python3
"""Pipeline replicas across a shaped link: the replicas' gradient all-reduce, overlapped or not,
compressed or not.

Two hosts as network namespaces (scripts/netns_hosts, host 0's link shaped by tbf), one
`chorus train` node on each with two CPU ranks: 2 replicas x 2 stages, replica 0 on host 0 and
replica 1 on host 1, so each stage's all-reduce crosses the link and the activations do not. The
same GPT job runs with the all-reduce after the schedule (`comm.overlap = false`), launched
bucket by bucket during the last micro-batch's backward (the default), and overlapped with the
bf16 and PowerSGD codecs. Reports the median step time (rank 0's --log-json, first steps
dropped), the bytes that crossed host 0's link per step and the final loss, and writes
bench/results/pipeline_sync.json.

    sudo bench/pipeline_sync.py [--build build] [--rate 200mbit] [--steps 14] [--repeats 2]
                                [--micro-batches 4]

Needs root (network namespaces). Every ratio is against the run without overlap in the same
invocation; the configurations alternate, `--repeats` times, and each reports its median run.
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
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import multihost  # noqa: E402  (the namespace helpers)

ROOT = multihost.ROOT
multihost.PREFIX = "cps"
PORT = 29431
SKIPPED_STEPS = 4  # start-up, allocations, the balancer's first steps

JOB = """
seed = 1
balance = "off"
[train]
global_batch = 32
eval_every = 0
eval_samples = 64
log_every = 100
[model]
kind = "gpt"
layers = 4
width = 192
heads = 4
context = 32
[data]
dataset = "synthetic"
size = 4096
[optimizer]
name = "adamw"
lr = 0.001
[parallel]
pipeline_stages = 2
replicas = 2
partition = "even"
"""

CONFIGS = [
    ("after the schedule", ["comm.overlap=false"]),
    ("overlapped", []),
    ("overlapped + bf16", ["comm.compression=bf16"]),
    ("overlapped + powersgd", ["comm.compression=powersgd"]),
]


def link_bytes():
    """Bytes host 0's eth0 sent and received so far."""
    out = subprocess.run(["ip", "-n", f"{multihost.PREFIX}-h0", "-s", "-j", "link", "show",
                          "eth0"], check=True, capture_output=True, text=True).stdout
    stats = json.loads(out)[0]["stats64"]
    return stats["tx"]["bytes"] + stats["rx"]["bytes"]


def run_job(args, work, settings):
    secret = os.path.join(work, "secret")
    with open(secret, "w") as f:
        f.write("pipeline-sync-bench-secret-012345")
    os.chmod(secret, 0o600)
    config = os.path.join(work, "job.toml")
    with open(config, "w") as f:
        f.write(JOB)
    log = os.path.join(work, "steps.jsonl")
    sets = [x for s in [f"train.steps={args.steps}", f"parallel.micro_batches={args.micro_batches}",
                        *settings] for x in ("--set", s)]

    def node(i):
        command = [os.path.join(args.build, "chorus"), "train", config, "--set", "devices=cpu,cpu",
                   *sets, "--nnodes", "2", "--node-rank", str(i), "--rdzv-endpoint",
                   f"10.77.0.1:{PORT}", "--secret-file", secret]
        if i == 0:
            command += ["--log-json", log]
        return command

    before = link_bytes()
    codes = {}
    other = threading.Thread(
        target=lambda: codes.__setitem__(1, multihost.in_host(1, node(1), f"{work}/n1")))
    other.start()
    codes[0] = multihost.in_host(0, node(0), f"{work}/n0")
    other.join()
    for i in (0, 1):
        if codes[i] != 0:
            sys.exit(f"node {i} failed ({codes[i]}):\n" + open(f"{work}/n{i}").read())
    crossed = link_bytes() - before
    with open(log) as f:
        steps = [json.loads(line) for line in f if line.strip()]
    timed = [s["step_s"] for s in steps[SKIPPED_STEPS:]]
    return {"step_s": statistics.median(timed), "link_mib_per_step": crossed / 2**20 / len(steps),
            "final_loss": steps[-1]["loss"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--rate", default="200mbit")
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--out",
                        default=os.path.join(ROOT, "bench", "results", "pipeline_sync.json"))
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("pipeline_sync.py: needs root (network namespaces)")
    runs = {name: [] for name, _ in CONFIGS}
    multihost.hosts("create", "2", "--rate", args.rate, "--shaped", "0")
    try:
        with tempfile.TemporaryDirectory() as work:
            for _ in range(args.repeats):
                for name, settings in CONFIGS:
                    runs[name].append(run_job(args, work, settings))
    finally:
        multihost.hosts("destroy")
    rows = []
    for name, _ in CONFIGS:
        ordered = sorted(runs[name], key=lambda r: r["step_s"])
        row = dict(ordered[len(ordered) // 2], config=name,
                   step_s_runs=[round(r["step_s"], 4) for r in runs[name]])
        rows.append(row)
    baseline = rows[0]["step_s"]
    print(f"{'replica sync':<24} {'step s':>8} {'vs after':>9} {'hidden s':>9}"
          f" {'link MiB/step':>14} {'final loss':>10}")
    for row in rows:
        row["speedup"] = baseline / row["step_s"]
        row["hidden_s"] = baseline - row["step_s"]
        print(f"{row['config']:<24} {row['step_s']:8.3f} {row['speedup']:8.2f}x"
              f" {row['hidden_s']:9.3f} {row['link_mib_per_step']:14.2f} {row['final_loss']:10.4f}")
    result = {
        "machine": f"{os.cpu_count()} vCPU, {platform.machine()}, Linux {platform.release()}",
        "date": datetime.date.today().isoformat(),
        "setup": f"2 hosts (network namespaces) x 2 CPU ranks, host 0's link shaped to {args.rate}"
                 f"; 2 replicas x 2 stages (GPT 4 blocks width 192, B = 32, M = {args.micro_batches}, 1F1B, AdamW); "
                 f"median step time of steps {SKIPPED_STEPS + 1}..{args.steps}, median of "
                 f"{args.repeats} runs per configuration, configurations alternating",
        "rows": rows,
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
