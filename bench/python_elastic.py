#!/usr/bin/env python3
"""Recovery of a Python job from a killed worker: chorus.elastic_steps against torchrun.

Seeded trials (victim 0..2, kill step in [--first-step, --last-step]); each runs the job of
bench/python_elastic_worker.py twice, the order alternating per trial: `chorus run --elastic`
with --front chorus (the survivors regroup and redo the interrupted step), and `torchrun
--max-restarts 1` with --front torch (DDP, every worker restarted, resuming from the checkpoint
rank 0 writes every --checkpoint-every steps). The victim SIGKILLs itself before its forward of the
kill step. Figures per run: recovery_s, from the kill until the interrupted step completed (its
step line); resumed_from, the first step after the loss (chorus: the interrupted one; torchrun:
the checkpoint's); replayed, steps logged more than once; missing, steps never logged; step_s,
the median time between steps before the kill; and the exit code. min / median / max over trials go to stdout
and, with every run's figures and the machine, to --out.

    bench/python_elastic.py [--chorus build/chorus] [--trials 6] [--seed 1]
                            [--out bench/results/python_elastic_DATE.json]
"""
import argparse
import datetime
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "bench", "python_elastic_worker.py")


def read_lines(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def command(args, front, events, checkpoint, trial):
    common = ["--front", front, "--events", events, "--steps", str(args.steps),
              "--kill-member", str(trial["member"]), "--kill-step", str(trial["step"])]
    if front == "chorus":
        return [args.chorus, "run", "--elastic", "--devices", "cpu,cpu,cpu", "--",
                args.python, WORKER, *common]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return [args.python, "-m", "torch.distributed.run", "--nproc-per-node", "3",
            "--max-restarts", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
            f"localhost:{port}", WORKER, *common, "--checkpoint", checkpoint,
            "--checkpoint-every", str(args.checkpoint_every)]


def figures(events, steps, code):
    records = read_lines(events)
    kill = next(iter(read_lines(events + ".kill")), None)
    lines = [r for r in records if "step" in r and "event" not in r]
    logged = [r["step"] for r in lines]
    result = {"exit_code": code, "missing": sorted(set(range(steps)) - set(logged)),
              "replayed": len(logged) - len(set(logged))}
    if kill is None:
        return {**result, "error": "no kill"}
    before = [r["time"] for r in lines if r["time"] < kill["time"]]
    result["step_s"] = statistics.median(b - a for a, b in zip(before, before[1:]))
    done = next((r for r in lines if r["time"] > kill["time"] and r["step"] >= kill["step"]),
                None)
    result["recovery_s"] = done["time"] - kill["time"] if done else None
    # The first step of the generation (chorus) or attempt (torchrun) after the loss.
    result["resumed_from"] = min((r["step"] for r in lines if r["attempt"] > 0), default=None)
    return result


def run(args, front, trial, workdir):
    events = os.path.join(workdir, f"{front}.jsonl")
    checkpoint = os.path.join(workdir, f"{front}.ckpt")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.path.join(ROOT, "build", "python"))
    done = subprocess.run(command(args, front, events, checkpoint, trial), env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=300)
    result = figures(events, args.steps, done.returncode)
    if done.returncode != 0 or result.get("recovery_s") is None or result["missing"]:
        result["output_tail"] = done.stdout[-3000:]
    return result


def machine(python):
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()[:15]
    torch_version = subprocess.run(
        [python, "-c", "import warnings; warnings.filterwarnings('ignore');"
         "import torch; print(torch.__version__)"], capture_output=True, text=True).stdout.strip()
    load = open("/proc/loadavg").read().split()[:3]
    return {"nproc": os.cpu_count(), "lscpu": lscpu, "torch": torch_version,
            "kernel": os.uname().release, "loadavg_at_start": load}


def summarize(runs, front, key):
    values = [r[key] for r in runs if r["front"] == front and r.get(key) is not None]
    if not values:
        return None
    return {"min": min(values), "median": statistics.median(values), "max": max(values),
            "n": len(values)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chorus", default=os.path.join(ROOT, "build", "chorus"))
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--first-step", type=int, default=10)
    parser.add_argument("--last-step", type=int, default=49)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--out", default=os.path.join(
        ROOT, "bench", "results", f"python_elastic_{datetime.date.today().isoformat()}.json"))
    args = parser.parse_args()
    rng = random.Random(args.seed)
    trials = [{"member": rng.randrange(3), "step": rng.randint(args.first_step, args.last_step)}
              for _ in range(args.trials)]
    runs = []
    for index, trial in enumerate(trials):
        fronts = ["chorus", "torch"] if index % 2 == 0 else ["torch", "chorus"]
        for front in fronts:
            with tempfile.TemporaryDirectory() as workdir:
                result = {"front": front, "trial": index, **trial, **run(args, front, trial,
                                                                          workdir)}
            runs.append(result)
            print(json.dumps({k: v for k, v in result.items() if k != "output_tail"}),
                  flush=True)
    summary = {front: {key: summarize(runs, front, key)
                       for key in ("recovery_s", "replayed", "step_s")}
               for front in ("chorus", "torch")}
    report = {"bench": "python_elastic", "date": datetime.datetime.now().isoformat(timespec="seconds"),
              "command": " ".join(sys.argv), "machine": machine(args.python),
              "settings": vars(args), "summary": summary, "runs": runs}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
