#!/usr/bin/env python3
"""The Python front's ZeRO stages against PyTorch FSDP2 (fully_shard) and DDP: step time and memory.

The zoo's GPT (bench/gpt_torch.py, 826k parameters), AdamW, 3 CPU ranks as real processes, the
global batch split evenly, one intra-op thread per process, the same synthetic token sequences and
learning-rate schedule on both sides (issue 40, item 2):

  py-0 .. py-3   bench/python_zero_worker.py under `build/chorus run --devices cpu,cpu,cpu`:
                 chorus.DataParallel(zero=0|1|2|3, shards="even", balance="fixed"), chorus.step
  torch-fsdp     bench/zero_torch.py's worker, FSDP2 fully_shard per layer and on the root, Gloo
  torch-ddp      the same with DistributedDataParallel, Gloo

(PyTorch's side is bench/zero_torch.py's as it is, run by python_zero_worker.py with one optimizer
pre-hook added for the tally of held bytes.) Every job gets the same glibc malloc settings, the
ones `chorus run` gives its workers (freed memory kept: hetero_dp.CHORUS_MALLOC).

A round runs every configuration once, in an order rotated from round to round; ratios are taken
within a round (a drift of the host's load touches a round's runs alike), and the summary gives
their min and median over rounds, never the best one. Per run: rank 0's median step time after
--warmup steps; per rank the RSS before the first step (VmRSS), the peak RSS (ru_maxrss) and the
bytes held for parameters, gradients, master slices and optimizer state at the second optimizer
step and, for chorus, right after its backward (python_zero_worker.held_bytes); the load average
before and after.

The chorus binary and the build tree's `chorus` package are copied once, before the first round,
and every round runs the copies (a rebuild of the shared build tree meanwhile changes nothing).
Writes bench/results/python_zero_<date>.json.

    python3 bench/python_zero.py [--rounds 4] [--steps 30] [--warmup 5]   # ~8 min on 2 cores
"""
import argparse
import datetime
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hetero_dp import CHORUS_MALLOC  # noqa: E402  (the malloc settings of `chorus run`'s workers)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "bench", "python_zero_worker.py")
PY_RUNS = ["py-0", "py-1", "py-2", "py-3"]
TORCH_RUNS = ["torch-fsdp", "torch-ddp"]
WORLD = 3


def common(args):
    return ["--global-batch", str(args.global_batch), "--steps", str(args.steps),
            "--lr", str(args.lr), "--seed", str(args.seed)]


def command_of(args, run, out):
    if run in PY_RUNS:
        return [args.chorus, "run", "--devices", ",".join(["cpu"] * WORLD), "--", args.python,
                WORKER, "chorus", out, "--zero", run.split("-")[1]] + common(args)
    return [args.python, WORKER, "torch", out, "--mode", run.split("-")[1],
            "--world", str(WORLD)] + common(args)


def wait_for_quiet():
    while os.path.exists("/work/QUIET"):
        time.sleep(5)


def run_once(args, run, workdir, round_index):
    out = os.path.join(workdir, f"{run}_{round_index}")
    os.makedirs(out)
    env = dict(os.environ, GLIBC_TUNABLES=CHORUS_MALLOC, PYTHONWARNINGS="ignore",
               PYTHONPATH=os.pathsep.join(filter(None, [args.pythonpath,
                                                        os.environ.get("PYTHONPATH")])))
    failures = []
    while True:
        wait_for_quiet()
        load_before = os.getloadavg()
        start = time.monotonic()
        done = subprocess.run(command_of(args, run, out), cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=args.timeout)
        wall = time.monotonic() - start
        if done.returncode == 0:
            break
        tail = (done.stdout + done.stderr)[-3000:]
        if len(failures) >= args.retries:
            sys.exit(f"{run} failed ({done.returncode}):\n{tail}")
        # Rerun it, and keep what failed in the results (a Gloo job once aborted under load).
        failures.append({"returncode": done.returncode, "output_tail": tail[-1200:]})
        print(f"{run} failed ({done.returncode}); rerunning it", flush=True)
        shutil.rmtree(out)
        os.makedirs(out)
    ranks = []
    for rank in range(WORLD):
        with open(os.path.join(out, f"tally{rank}.json")) as f:
            held = json.load(f)
        if run in PY_RUNS:
            with open(os.path.join(out, f"rank{rank}.json")) as f:
                mine = json.load(f)
            with open(os.path.join(out, f"tally_backward{rank}.json")) as f:
                after_backward = json.load(f)
            ranks.append({"rss_before_kib": mine["rss_before_kib"],
                          "peak_rss_kib": mine["peak_rss_kib"], "held_bytes": held,
                          "held_bytes_after_backward": after_backward})
            timed = mine["parts"][args.warmup:]
            ranks[-1]["median_parts_ms"] = {
                key[:-2]: statistics.median(part[key] for part in timed) * 1000
                for key in ("data_s", "forward_backward_s", "chorus_step_s")}
            if rank == 0:
                times, losses = mine["step_s"], mine["loss"]
        else:
            ranks.append({"held_bytes": held, "held_bytes_after_backward": held})
    if run in TORCH_RUNS:
        with open(os.path.join(out, "torch.json")) as f:
            torch_run = json.load(f)
        times, losses = torch_run["step_s"], torch_run["loss"]
        for mine, theirs in zip(ranks, torch_run["ranks"]):
            mine["rss_before_kib"] = theirs["rss_before_kib"]
            mine["peak_rss_kib"] = theirs["peak_rss_kib"]
    measured = times[args.warmup:]
    return {"median_step_s": statistics.median(measured), "step_s": measured, "loss": losses,
            "ranks": ranks, "max_peak_rss_kib": max(r["peak_rss_kib"] for r in ranks),
            "max_rss_before_kib": max(r["rss_before_kib"] for r in ranks),
            "max_held_bytes": max(r["held_bytes"]["total"] for r in ranks),
            "max_held_bytes_after_backward": max(r["held_bytes_after_backward"]["total"]
                                                 for r in ranks),
            "wall_s": round(wall, 2), "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(), "failed_tries": failures}


def spread(values):
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def ratios(measured):
    """Within one round. Throughput ratios (above 1: the first is faster) and memory ratios
    (below 1: the first holds less)."""
    time_of = {run: m["median_step_s"] for run, m in measured.items()}
    out = {f"{run}_throughput_over_py-0": time_of["py-0"] / time_of[run] for run in PY_RUNS}
    out["py-3_throughput_over_fsdp"] = time_of["torch-fsdp"] / time_of["py-3"]
    out["py-0_throughput_over_ddp"] = time_of["torch-ddp"] / time_of["py-0"]
    for run in PY_RUNS:
        out[f"{run}_throughput_over_fsdp"] = time_of["torch-fsdp"] / time_of[run]
    for key in ("max_peak_rss_kib", "max_held_bytes", "max_held_bytes_after_backward"):
        out[f"py-3_{key}_over_fsdp"] = measured["py-3"][key] / measured["torch-fsdp"][key]
        out[f"py-0_{key}_over_ddp"] = measured["py-0"][key] / measured["torch-ddp"][key]
    # Same model, data and schedule: the losses agree up to the order of float sums.
    reference = measured["torch-ddp"]["loss"]
    out["max_abs_loss_difference_vs_ddp"] = max(
        max(abs(a - b) for a, b in zip(m["loss"], reference)) for m in measured.values())
    return out


def file_digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]


def snapshot_of(args):
    """The copied binary's version and digests of what the workers import."""
    version = subprocess.run([args.chorus, "--version"], capture_output=True, text=True)
    package = os.path.join(args.pythonpath, "chorus")
    return {"version": (version.stdout or version.stderr).strip(),
            "binary_sha256_16": file_digest(args.chorus),
            "python_package_sha256_16": {name: file_digest(os.path.join(package, name))
                                         for name in sorted(os.listdir(package))
                                         if os.path.isfile(os.path.join(package, name))}}


def cpu_model():
    with open("/proc/cpuinfo") as info:
        for line in info:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chorus", default=os.path.join(ROOT, "build", "chorus"))
    parser.add_argument("--pythonpath", default=os.path.join(ROOT, "build", "python"),
                        help="where `import chorus` finds the package (default: the build tree)")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--global-batch", type=int, default=24)
    parser.add_argument("--lr", type=float, default=0.001)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--retries", type=int, default=1,
                        help="reruns of a job that failed (each failure is kept in the JSON)")
    parser.add_argument("--out", default=None,
                        help="default: bench/results/python_zero_<UTC date>.json")
    args = parser.parse_args()
    if args.global_batch % WORLD != 0:
        parser.error(f"--global-batch must split evenly over the {WORLD} ranks")
    args.chorus = os.path.abspath(args.chorus)
    started = datetime.datetime.now(datetime.timezone.utc)
    if args.out is None:
        args.out = os.path.join(ROOT, "bench", "results",
                                f"python_zero_{started.date().isoformat()}.json")
    runs = PY_RUNS + TORCH_RUNS
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--", "bench",
                            "python"], capture_output=True, text=True).stdout.strip()
    load_before = os.getloadavg()
    rounds = []
    with tempfile.TemporaryDirectory() as workdir:
        # The binary and package every round runs: copies, so that a rebuild of the build tree
        # while the benchmark runs (others share the checkout) changes nothing under it.
        built = {"built_binary": args.chorus, "built_python": args.pythonpath,
                 "built_binary_mtime": datetime.datetime.fromtimestamp(
                     os.path.getmtime(args.chorus), datetime.timezone.utc).isoformat()}
        args.chorus = shutil.copy2(args.chorus, os.path.join(workdir, "chorus"))
        args.pythonpath = os.path.join(workdir, "python")
        shutil.copytree(os.path.join(built["built_python"], "chorus"),
                        os.path.join(args.pythonpath, "chorus"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        snapshot = snapshot_of(args)
        for index in range(args.rounds):
            order = runs[index % len(runs):] + runs[:index % len(runs)]
            measured = {run: run_once(args, run, workdir, index) for run in order}
            rounds.append({"order": order, "ratios": ratios(measured),
                           "runs": {run: measured[run] for run in runs}})
            print(f"round {index + 1} ({' '.join(order)}): " + ", ".join(
                f"{run} {measured[run]['median_step_s'] * 1000:.1f} ms "
                f"(load {measured[run]['loadavg_before'][0]:.1f})" for run in runs), flush=True)
    summary = {"ratios": {key: spread([r["ratios"][key] for r in rounds])
                          for key in rounds[0]["ratios"]}}
    for run in runs:
        of = [r["runs"][run] for r in rounds]
        summary[run] = {
            "median_step_ms": spread([m["median_step_s"] * 1000 for m in of]),
            "max_peak_rss_mib": spread([m["max_peak_rss_kib"] / 1024 for m in of]),
            "max_rss_before_mib": spread([m["max_rss_before_kib"] / 1024 for m in of]),
            "peak_rss_mib_per_rank_median": [
                statistics.median(m["ranks"][k]["peak_rss_kib"] / 1024 for m in of)
                for k in range(WORLD)],
            # What training added to each rank's RSS: peak less the RSS before the first step.
            "max_rss_growth_mib": spread([max(r["peak_rss_kib"] - r["rss_before_kib"]
                                              for r in m["ranks"]) / 1024 for m in of]),
            "held_bytes_per_rank": [of[0]["ranks"][k]["held_bytes"] for k in range(WORLD)],
            "held_bytes_after_backward_per_rank": [
                of[0]["ranks"][k]["held_bytes_after_backward"] for k in range(WORLD)],
            "held_bytes_same_every_round": all(
                m["ranks"][k][key] == of[0]["ranks"][k][key]
                for m in of for k in range(WORLD)
                for key in ("held_bytes", "held_bytes_after_backward")),
            "loadavg_1min_before": spread([m["loadavg_before"][0] for m in of])}
        if "median_parts_ms" in of[0]["ranks"][0]:  # chorus's runs: medians over rounds, per rank
            summary[run]["median_parts_ms_per_rank"] = [
                {key: statistics.median(m["ranks"][k]["median_parts_ms"][key] for m in of)
                 for key in of[0]["ranks"][k]["median_parts_ms"]} for k in range(WORLD)]
    import warnings  # noqa: PLC0415
    warnings.filterwarnings("ignore", message=".*NumPy.*")
    import torch  # noqa: PLC0415  (only its version, after the runs)
    result = {
        "benchmark": "python_zero",
        "date": started.isoformat(timespec="seconds"),
        "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]),
        "machine": {"cpu": cpu_model(), "nproc": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version(), "torch": torch.__version__,
                    "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
                    "note": "2 vCPUs shared with a low-priority build running in the background"},
        "git_commit": commit,
        "uncommitted_in_bench_or_python": dirty.splitlines(),
        "chorus": dict(built, **snapshot),
        "environment": {"GLIBC_TUNABLES": CHORUS_MALLOC,
                        "PYTHONPATH": "a copy of " + built["built_python"],
                        "threads_per_process": 1, "transport": "chorus: shm; torch: gloo"},
        "settings": {k: v for k, v in vars(args).items()
                     if k not in ("out", "chorus", "pythonpath")},
        "model": "zoo gpt defaults (bench/gpt_torch.py): vocab 96, 4 layers, width 128, 4 heads, "
                 "context 64 (826k parameters); AdamW, lr 0.001, warm-up 20, cosine to 0.1",
        "runs": {"py-N": "chorus.DataParallel(zero=N, shards='even', balance='fixed') under "
                         "chorus run --devices cpu,cpu,cpu (bench/python_zero_worker.py)",
                 "torch-fsdp": "bench/zero_torch.py --mode fsdp (fully_shard per layer + root)",
                 "torch-ddp": "bench/zero_torch.py --mode ddp"},
        "held_bytes_note": "bytes of distinct storages for parameters, gradients, master slices "
                           "and optimizer state at the second optimizer step's pre-hook; "
                           "_after_backward: chorus right after that step's backward(), before "
                           "chorus.step (torch: the same as the pre-hook's); reducer buckets "
                           "and FSDP all-gather buffers are not counted",
        "rounds": rounds, "summary": summary,
    }
    with open(args.out, "w") as out:
        json.dump(result, out, indent=1)
        out.write("\n")
    print(json.dumps(summary, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
