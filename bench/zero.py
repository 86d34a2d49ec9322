#!/usr/bin/env python3
"""ZeRO stages 1, 2 and 3 against replicated data parallelism (stage 0), and against PyTorch.

Runs `chorus train` on the zoo's GPT with AdamW on three CPU workers (real processes, the shm
transport, balance = off), with zero.stage = 0, 1, 2 and 3 (stages 1 to 3 with --shards), and
stage 3 once more with even shards; then the same job in PyTorch (bench/zero_torch.py: same
model, ranks, global batch split evenly, optimizer, learning-rate schedule, steps, one intra-op
thread per process, Gloo) with FSDP2's `fully_shard` and with DDP. Each run's figure is the median
of rank 0's step times after the first --warmup steps (chorus: its per-step log, --log-json).

A round runs every configuration once, in an order rotated from round to round; the figures are
ratios within a round (a drift of the host's load touches a round's runs alike): each chorus
stage's throughput against stage 0's, chorus's stage 3 with even shards against FSDP's full
sharding, chorus's stage 0 against DDP. The summary gives the min and the median over rounds
(never the best one). Also recorded per run: the peak RSS of the process tree (chorus: wait4 on
`chorus train`, whose workers are its children; PyTorch: each rank's ru_maxrss, and its RSS
before the first step).

Writes bench/results/zero.json.

    bench/zero.py [--chorus build/chorus [--chorus-commit C] | --build build] [--steps 30]
                  [--warmup 5] [--rounds 4] [--global-batch 24] [--shards 0.5,0.3,0.2]
                  [--no-torch] [--python python3] [--out bench/results/zero.json]
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
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHORUS_RUNS = ["0", "1", "2", "3", "3-even"]  # zero.stage, with --shards or "even"
TORCH_RUNS = ["torch-ddp", "torch-fsdp"]


def chorus_command(args, run, log):
    stage = run.split("-")[0]
    settings = {
        "devices": "cpu,cpu,cpu", "balance": "off", "seed": "1",
        "train.steps": str(args.steps), "train.global_batch": str(args.global_batch),
        "train.eval_every": "0", "train.eval_samples": "32", "train.log_every": "1000",
        "train.target_accuracy": "0", "model.kind": "gpt", "data.dataset": "synthetic",
        "data.size": "4096", "optimizer.name": "adamw", "optimizer.lr": str(args.lr),
        "zero.stage": stage,
    }
    if stage != "0":
        settings["zero.shards"] = "even" if run.endswith("even") else "[" + args.shards + "]"
    command = [args.chorus, "train", "--log-json", log]
    for key, value in settings.items():
        command += ["--set", f"{key}={value}"]
    return command


def torch_command(args, run, out):
    return [args.python, os.path.join(ROOT, "bench", "zero_torch.py"),
            "--mode", run.split("-")[1], "--world", "3", "--global-batch", str(args.global_batch),
            "--steps", str(args.steps), "--lr", str(args.lr), "--out", out]


def wait_for_quiet():
    while os.path.exists("/work/QUIET"):
        time.sleep(5)


def launch(command):
    """Runs `command`; returns its output and the peak RSS (KiB) of it and its waited children."""
    wait_for_quiet()
    with tempfile.TemporaryFile("w+") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, text=True)
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        output.seek(0)
        text = output.read()
    if process.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({process.returncode}):\n{text}")
    return usage.ru_maxrss


def run_once(args, run, workdir, round_index):
    path = os.path.join(workdir, f"{run}_{round_index}.json")
    if run in CHORUS_RUNS:
        tree_peak = launch(chorus_command(args, run, path))
        with open(path) as lines:
            steps = [json.loads(line) for line in lines if line.strip()]
        times = [step["step_s"] for step in steps]
        result = {"final_loss": steps[-1]["loss"], "peak_rss_kib_tree": tree_peak}
    else:
        launch(torch_command(args, run, path))
        with open(path) as f:
            torch_run = json.load(f)
        times = torch_run["step_s"]
        result = {"final_loss": torch_run["loss"][-1], "torch": torch_run["torch"],
                  "peak_rss_kib_per_rank": [r["peak_rss_kib"] for r in torch_run["ranks"]],
                  "rss_before_training_kib_per_rank": [r["rss_before_kib"]
                                                       for r in torch_run["ranks"]]}
    measured = times[args.warmup:]
    result.update({"median_step_s": statistics.median(measured), "steps": len(measured),
                   "step_s": measured})
    return result


def summarize(values):
    return {"min": min(values), "median": statistics.median(values)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", default="build", help="the build directory holding chorus")
    parser.add_argument("--chorus", default=None, help="the chorus binary (default: BUILD/chorus)")
    parser.add_argument("--chorus-commit", default=None,
                        help="the commit the binary was built from (default: this checkout's)")
    parser.add_argument("--python", default=sys.executable, help="runs bench/zero_torch.py")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--global-batch", type=int, default=24)
    parser.add_argument("--lr", type=float, default=0.001)
    parser.add_argument("--shards", default="0.5,0.3,0.2")
    parser.add_argument("--no-torch", action="store_true", help="chorus's stages only")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "zero.json"))
    args = parser.parse_args()
    if args.chorus is None:
        args.chorus = os.path.join(ROOT, args.build, "chorus")
    args.chorus = os.path.abspath(args.chorus)
    if args.global_batch % 3 != 0:
        parser.error("--global-batch must split evenly over the 3 ranks")
    runs = CHORUS_RUNS + ([] if args.no_torch else TORCH_RUNS)
    started = datetime.datetime.now(datetime.timezone.utc)
    load_before = os.getloadavg()
    rounds = []
    with tempfile.TemporaryDirectory() as workdir:
        for index in range(args.rounds):
            order = runs[index % len(runs):] + runs[:index % len(runs)]
            measured = {run: run_once(args, run, workdir, index) for run in order}
            base = measured["0"]["median_step_s"]
            for run in CHORUS_RUNS:
                measured[run]["vs_stage0"] = base / measured[run]["median_step_s"]
            if not args.no_torch:
                # Throughput ratios, chorus over PyTorch: above 1, chorus is faster.
                measured["torch-fsdp"]["chorus_stage3_even_over_this"] = (
                    measured["torch-fsdp"]["median_step_s"] / measured["3-even"]["median_step_s"])
                measured["torch-ddp"]["chorus_stage0_over_this"] = (
                    measured["torch-ddp"]["median_step_s"] / base)
            rounds.append({"order": order, "runs": {run: measured[run] for run in runs},
                           "loadavg_after": os.getloadavg()})
            print(f"round {index + 1} ({' '.join(order)}): " + ", ".join(
                f"{run} {m['median_step_s'] * 1000:.1f} ms" for run, m in measured.items()),
                flush=True)
    summary = {}
    for run in CHORUS_RUNS:
        summary[run] = {"throughput_vs_stage0": summarize(
                            [r["runs"][run]["vs_stage0"] for r in rounds]),
                        "median_step_ms": statistics.median(
                            r["runs"][run]["median_step_s"] * 1000 for r in rounds)}
    if not args.no_torch:
        summary["torch-fsdp"] = {
            "chorus_stage3_even_throughput_over_fsdp": summarize(
                [r["runs"]["torch-fsdp"]["chorus_stage3_even_over_this"] for r in rounds]),
            "median_step_ms": statistics.median(
                r["runs"]["torch-fsdp"]["median_step_s"] * 1000 for r in rounds)}
        summary["torch-ddp"] = {
            "chorus_stage0_throughput_over_ddp": summarize(
                [r["runs"]["torch-ddp"]["chorus_stage0_over_this"] for r in rounds]),
            "median_step_ms": statistics.median(
                r["runs"]["torch-ddp"]["median_step_s"] * 1000 for r in rounds)}
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    version = subprocess.run([args.chorus, "--version"], capture_output=True, text=True)
    result = {
        "benchmark": "zero", "date": started.isoformat(timespec="seconds"),
        "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"nproc": os.cpu_count(), "platform": platform.platform(),
                    "cpu": cpu_model(), "python": platform.python_version(),
                    "bench_git_commit": commit, "loadavg_before": load_before,
                    "loadavg_after": os.getloadavg()},
        "chorus": {"binary": args.chorus, "commit": args.chorus_commit or commit,
                   "version": (version.stdout or version.stderr).strip()},
        "settings": vars(args),
        "model": "zoo gpt defaults: vocab 96, 4 layers, width 128, 4 heads, context 64 (826k)",
        "rounds": rounds, "summary": summary,
    }
    with open(args.out, "w") as out:
        json.dump(result, out, indent=2)
        out.write("\n")
    print(json.dumps(summary, indent=2))


def cpu_model():
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    main()
