#!/usr/bin/env python3
"""Overlap of the gradient all-reduce with backward, on the GPT across a shaped link.

Creates two hosts as network namespaces (scripts/netns_hosts; host 0's link shaped by tc tbf),
runs `chorus train` on each (one CPU worker per host, so the ranks talk over Gloo/TCP through the
shaped link) on the zoo's GPT, alternately with comm.overlap = false and true, and reads rank 0's
per-step log (--log-json). For each setting: the median step time and the median time rank 0
blocked on the all-reduce after backward (wait_s). With overlap off every bucket is launched after
backward, so its wait_s is the whole all-reduce; the time hidden is

    hidden = step(overlap off) - step(overlap on),  and hidden / all-reduce(overlap off).

The first steps of each run (warm-up) are dropped. Writes bench/results/overlap.json.

    sudo bench/overlap.py [--build build] [--rate 300mbit] [--steps 30] [--warmup 5]
                          [--rounds 2] [--global-batch 16] [--device cpu]
                          [--out bench/results/overlap.json]

With an emulated device (--device cpu@0.5) the compute is padded as it goes (after forward,
before each bucket's launch), so backward lasts as long as on the slower device and there is
more of it to hide the all-reduce behind.

Needs root (network namespaces). Both settings are measured in the same run, alternating, so a
drift of the host's load touches both alike.
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "netns_hosts")
PREFIX = "cov"
PORT = 29433
CORPUS = "/var/lib/chorus/data/mobydick.txt"


def hosts(*args):
    subprocess.run([SCRIPT, *args, "--prefix", PREFIX], check=True, stdout=subprocess.DEVNULL)


def in_host(host, command, output):
    line = [SCRIPT, "exec", str(host), "--prefix", PREFIX, "--", *command]
    with open(output, "w") as out:
        return subprocess.run(line, stdout=out, stderr=subprocess.STDOUT, timeout=900).returncode


def job_settings(args, overlap):
    """The GPT job (the zoo's default GPT: 4 layers, width 128, context 64) as --set options."""
    settings = {
        "devices": args.device, "balance": "off", "seed": "1",
        "cpu_threads": "1",  # both emulated hosts share this machine's cores
        "train.steps": str(args.steps), "train.global_batch": str(args.global_batch),
        "train.eval_every": "0", "train.eval_samples": "32", "train.log_every": "1000",
        "model.kind": "gpt", "data.dataset": "text", "data.path": CORPUS,
        "optimizer.name": "adamw", "optimizer.lr": "0.001", "comm.overlap": str(overlap).lower(),
        "comm.timeout_s": "300",
    }
    return [item for key, value in settings.items() for item in ("--set", f"{key}={value}")]


def run_job(args, work, overlap, tag):
    """One 2-host training run; returns rank 0's per-step records."""
    secret = os.path.join(work, "secret")
    with open(secret, "w") as f:
        f.write("overlap-bench-secret-0123456789")
    os.chmod(secret, 0o600)
    log = os.path.join(work, f"{tag}.jsonl")
    chorus = os.path.join(args.build, "chorus")

    def agent(node):
        command = [chorus, "train", *job_settings(args, overlap), "--nnodes", "2",
                   "--node-rank", str(node), "--rdzv-endpoint", f"10.77.0.1:{PORT}",
                   "--secret-file", secret]
        return command + (["--log-json", log] if node == 0 else [])

    codes = {}
    second = threading.Thread(
        target=lambda: codes.__setitem__(1, in_host(1, agent(1), os.path.join(work, "n1"))))
    second.start()
    codes[0] = in_host(0, agent(0), os.path.join(work, "n0"))
    second.join()
    for node in (0, 1):
        if codes[node] != 0:
            sys.exit(f"node {node} failed ({codes[node]}):\n" +
                     open(os.path.join(work, f"n{node}")).read())
    with open(log) as f:
        return [json.loads(line) for line in f if line.strip()]


def summarize(records, warmup):
    kept = [r for r in records if r["step"] > warmup]  # steps count from 1
    return {
        "steps": len(kept),
        "step_s": statistics.median(r["step_s"] for r in kept),
        "compute_s": statistics.median(r["compute_s"][0] for r in kept),
        "wait_s": statistics.median(r["wait_s"][0] for r in kept),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--rate", default="300mbit", help="host 0's link (tbf rate)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5, help="first steps dropped")
    parser.add_argument("--rounds", type=int, default=2, help="off/on pairs, alternating")
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--device", default="cpu",
                        help="each host's device spec, e.g. cpu@0.5 (padded as it computes)")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "overlap.json"))
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("overlap.py: needs root (network namespaces)")
    runs = []
    hosts("create", "2", "--rate", args.rate, "--shaped", "0")
    try:
        with tempfile.TemporaryDirectory() as work:
            for round_index in range(args.rounds):
                for overlap in (False, True):
                    records = run_job(args, work, overlap, f"r{round_index}-{overlap}")
                    run = {"round": round_index, "overlap": overlap,
                           **summarize(records, args.warmup)}
                    print(json.dumps(run), flush=True)
                    runs.append(run)
    finally:
        hosts("destroy")

    def median_of(overlap, key):
        return statistics.median(r[key] for r in runs if r["overlap"] == overlap)

    step_off, step_on = median_of(False, "step_s"), median_of(True, "step_s")
    allreduce = median_of(False, "wait_s")
    hidden = step_off - step_on
    summary = {
        "step_s_overlap_off": step_off, "step_s_overlap_on": step_on,
        "wait_s_overlap_off": allreduce, "wait_s_overlap_on": median_of(True, "wait_s"),
        "compute_s_overlap_off": median_of(False, "compute_s"),
        "compute_s_overlap_on": median_of(True, "compute_s"),
        "hidden_s": hidden, "hidden_fraction_of_allreduce": hidden / allreduce if allreduce else 0,
    }
    print(f"{'overlap':>8} {'step ms':>9} {'wait ms':>9} {'compute ms':>11}")
    for overlap in (False, True):
        print(f"{str(overlap).lower():>8} {1e3 * median_of(overlap, 'step_s'):9.1f}"
              f" {1e3 * median_of(overlap, 'wait_s'):9.1f}"
              f" {1e3 * median_of(overlap, 'compute_s'):11.1f}")
    print(f"hidden: {1e3 * hidden:.1f} ms per step, "
          f"{100 * summary['hidden_fraction_of_allreduce']:.0f}% of the all-reduce")
    result = {
        "machine": f"{os.cpu_count()} vCPU, {platform.machine()}, Linux {platform.release()}",
        "date": datetime.datetime.now().isoformat(timespec="minutes"),
        "setup": f"2 hosts (network namespaces, scripts/netns_hosts) x 1 CPU rank, host 0's link "
                 f"shaped to {args.rate} (tc tbf); device {args.device} per host; chorus train, zoo GPT (4 layers, width 128, "
                 f"context 64), global batch {args.global_batch}, {args.steps} steps per run, "
                 f"first {args.warmup} dropped, medians of rank 0's --log-json",
        "command": "sudo bench/overlap.py " + " ".join(sys.argv[1:]),
        "runs": runs,
        "summary": summary,
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
