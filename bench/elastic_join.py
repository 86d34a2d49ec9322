#!/usr/bin/env python3
"""A new node joining a running elastic `chorus train` job: how soon it takes a share.

Each trial launches an elastic job on `--devices` (fixed shares, MLP, rank 0 padded to
--step-ms a step so that the steps are of a known length) with a secret file on a loopback
endpoint, waits until its log shows a seeded random number of steps, then runs
`chorus train --join` with `--join-devices`. Per trial, from the launch's --log-json and the
joining node's output:

  first_step_s   from starting `chorus train --join` to the end of the first step with the new
                 worker among the shares (process start-up, admission, agreement, rebuild, step)
  steps_before   steps the job completed between the join command's start and that step
  steps_after_asking  the same from the moment its worker, started and ready, asked to join
  admitted_s     the joining worker's own figure: from asking to join to taking part

Reported as min / median / max over the trials, with the machine and date, into --json-out.

    python3 bench/elastic_join.py --trials 8 --seed 1     # ~2 minutes on the 2-core machine
"""

import argparse
import datetime
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hetero_dp  # noqa: E402  (the machine description)

REPO = hetero_dp.REPO
DEFAULT_JSON = os.path.join(REPO, "bench", "results", "elastic_join.json")


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--chorus", default=hetero_dp.DEFAULT_CHORUS)
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--devices", default="cpu,cpu")
    parser.add_argument("--join-devices", default="cpu")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--step-ms", type=int, default=100)
    parser.add_argument("--port", type=int, default=31700)
    parser.add_argument("--json-out", default=DEFAULT_JSON)
    return parser.parse_args()


def read_log(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return [json.loads(line) for line in handle if line.strip()]
    except (FileNotFoundError, json.JSONDecodeError):
        return []


def asked_at(output, near):
    """When the joining worker logged that it asks to join ("I HH:MM:SS.mmm elastic: rank N asks
    to join"), as a Unix time: the log line has the local time of day, on the day of `near`."""
    found = re.search(r"I (\d\d):(\d\d):(\d\d\.\d+) elastic: rank \d+ asks to join", output)
    day = datetime.datetime.fromtimestamp(near).replace(hour=0, minute=0, second=0, microsecond=0)
    return day.timestamp() + int(found.group(1)) * 3600 + int(found.group(2)) * 60 + float(
        found.group(3))


def trial(args, workdir, number, wait_steps):
    log = os.path.join(workdir, f"trial{number}.jsonl")
    secret = os.path.join(workdir, "secret")
    endpoint = f"127.0.0.1:{args.port + number}"
    launch = [args.chorus, "train", "--rdzv-endpoint", endpoint, "--secret-file", secret,
              "--log-json", log]
    for setting in ("devices=" + args.devices, "balance=off", "model.kind=mlp",
                    "data.dataset=synthetic", "data.size=4096", f"train.steps={args.steps}",
                    "train.eval_every=0", "train.target_accuracy=0", "elastic.enabled=true"):
        launch += ["--set", setting]
    env = dict(os.environ, CHORUS_FAULT=f"0:forward:0:SLOW{args.step_ms}")
    job = subprocess.Popen(launch, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    while len([s for s in read_log(log) if "step" in s]) < wait_steps:
        if job.poll() is not None:
            raise RuntimeError(f"trial {number}: the job ended before it could be joined")
        time.sleep(0.02)
    started = time.time()
    joined = subprocess.run([args.chorus, "train", "--join", "--rdzv-endpoint", endpoint,
                             "--secret-file", secret, "--set", "devices=" + args.join_devices],
                            cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    if job.wait(timeout=300) != 0 or joined.returncode != 0:
        raise RuntimeError(f"trial {number}: exit codes {job.returncode}, {joined.returncode}:\n"
                           + joined.stdout[-2000:] + joined.stderr[-2000:])
    steps = [s for s in read_log(log) if "step" in s and "event" not in s]
    ranks = len(args.devices.split(","))
    first = next(s for s in steps if len(s["shares"]) > ranks)
    output = joined.stdout + joined.stderr
    admitted = re.search(r"joined generation \d+ .* after ([0-9.e+-]+) s", output)
    asked = asked_at(output, started)
    return {"wait_steps": wait_steps, "first_step_s": first["time"] - started,
            "steps_before": sum(1 for s in steps if started < s["time"] < first["time"]),
            "steps_after_asking": sum(1 for s in steps if asked < s["time"] < first["time"]),
            "admitted_s": float(admitted.group(1)) if admitted else None,
            "shares": first["shares"], "steps_logged": len(steps)}


def spread(values):
    values = [v for v in values if v is not None]
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def main():
    args = parse_args()
    rng = random.Random(args.seed)
    runs = []
    with tempfile.TemporaryDirectory() as workdir:
        with open(os.path.join(workdir, "secret"), "w", encoding="utf-8") as handle:
            handle.write(f"elastic-join-bench-{rng.getrandbits(64):016x}\n")
        os.chmod(os.path.join(workdir, "secret"), 0o600)
        for number in range(args.trials):
            runs.append(trial(args, workdir, number, rng.randint(3, 10)))
            r = runs[-1]
            print(f"trial {number}: joined after {r['wait_steps']} steps; first step with it "
                  f"{r['first_step_s']:.3f} s after the join command, {r['steps_before']} steps "
                  f"before it ({r['steps_after_asking']} after asking), admitted {r['admitted_s']:.3f} s after asking; shares {r['shares']}",
                  flush=True)
    summary = {key: spread([r[key] for r in runs])
               for key in ("first_step_s", "steps_before", "steps_after_asking", "admitted_s")}
    if any(r["steps_logged"] != args.steps for r in runs):
        print("WARNING: a trial did not log every step once", flush=True)
    document = {"benchmark": "elastic_join", "date": datetime.datetime.now(
        datetime.timezone.utc).isoformat(timespec="seconds"), "machine": hetero_dp.machine_info(),
        "settings": {k: getattr(args, k) for k in ("trials", "seed", "devices", "join_devices",
                                                    "steps", "step_ms")},
        "summary": summary, "runs": runs}
    for key, value in summary.items():
        print(f"{key:>18}: min {value['min']:.3f}, median {value['median']:.3f}, "
              f"max {value['max']:.3f}")
    hetero_dp.write_json(args.json_out, document)
    print(f"wrote {args.json_out}")


if __name__ == "__main__":
    main()
