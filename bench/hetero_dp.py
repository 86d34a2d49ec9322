#!/usr/bin/env python3
"""Heterogeneous data parallelism: chorus against equal splits, PyTorch DDP and the ideal.

One run measures, on the same CNN, global batch B and emulated device speeds (default 1.0, 0.5,
0.25, i.e. `cpu@1.0,cpu@0.5,cpu@0.25`):

  adaptive   chorus with the adaptive load balancer (`balance=adaptive`)
  equal      chorus with an equal split (`balance=off`, what DDP does)
  ddp        real PyTorch DDP (bench/ddp_baseline.py under torchrun, Gloo, CPU), B / n per rank,
             padded with sleep exactly as chorus pads its emulated devices
  ideal      the sum of each device's standalone throughput: chorus with that one device alone,
             on the whole global batch (the `alone@S` rows)

Throughput is B * n / sum(step_s) over the timed steps (the first --warmup steps are dropped:
start-up, the balancer's profiling).  efficiency = throughput / ideal.  For an equal split the
expectation is n * min(speed) / sum(speed) (0.43 for the default speeds).  Methodology:
docs/architecture.md, "Emulated heterogeneity" and "Performance method".

Caveat: the ideal runs each device on the whole batch B, the split runs on shares of it, and the
per-sample cost depends on the batch size (caches; and, with --system-malloc, glibc handing big
freed buffers back to the OS and page-faulting them in again every step, which grows with B).
Every job runs with the malloc settings chorus gives its workers unless --system-malloc is given.
Padded (slower) devices run at a lower CPU priority, in chorus and in the DDP baseline alike
(SpeedEmulator::yieldCoreToFasterDevices).

Many mixes (--random-sets N --seed S): N seeded, reproducible speed sets of 2-4 devices, widely
spread (the slowest often under 0.1; bench/speed_sets.py draws them), global batch B = 96 per
device.  Each set's speeds are scaled so that they sum to at most 0.6: a worker of speed s computes
for real a fraction s of its time and sleeps the rest, so the workers together need at most 0.6 of
a core, and the host's 2 cores never compete for them -- the host's contention is not what is
measured.  Besides adaptive, equal, ddp and alone@S (on B), every device also runs alone on a
small batch (--small-batch, 48): the two step times give its cost curve t_i(b) = a_i + c_i * b,
and the balanced optimum is B / min over integer shares (sum B, each >= 1) of max_i t_i(b_i).
Per set: adaptive / ideal, adaptive / optimum, equal / ideal, ddp / ideal; then the min, median
and max of each over the sets (the distribution, never only the best set).  The alone jobs, which
are steady, run --alone-steps steps (default in this mode: --warmup + 20).  --plan-only prints the
sets and the estimated time without running them.

    python3 bench/hetero_dp.py                      # ~3.5 minutes on a 2-core machine
    python3 bench/hetero_dp.py --time-to-accuracy   # also time the default `chorus train` job
    python3 bench/hetero_dp.py --random-sets 8 --seed 1 --steps 50 --repeats 1
"""

import argparse
import copy
import datetime
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

import speed_sets

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_CHORUS = os.path.join(REPO, "build", "chorus")
DDP_SCRIPT = os.path.join(REPO, "bench", "ddp_baseline.py")
DEFAULT_JSON = os.path.join(REPO, "bench", "results", "hetero_dp.json")
DEFAULT_RANDOM_JSON = os.path.join(REPO, "bench", "results", "hetero_dp_random.json")
# --random-sets: every ratio reported per set, and summarised over the sets.
SET_RATIOS = ("adaptive_over_ideal", "adaptive_over_optimum", "equal_over_ideal",
              "ddp_over_ideal", "optimum_over_ideal")
# More would oversubscribe a 2-core machine (docs/architecture.md, "Emulated heterogeneity").
MAX_SPEED_SUM = 1.8
# What `chorus run` gives its workers (runtime::AgentOptions::kRetainFreedMemory): glibc otherwise
# hands freed activation buffers back to the OS and each step page-faults them in again (~30% of
# compute on a small VM, and much of the noise). Every job here gets it, DDP included, so the
# comparison is of the parallelism, not of malloc; --system-malloc runs every job without it.
CHORUS_MALLOC = "glibc.malloc.mmap_threshold=1073741824:glibc.malloc.trim_threshold=4294967296"
TARGET_ADAPTIVE = 0.90  # issue 3: adaptive must reach 90% of the ideal
DDP_STARTUP_S = 8.0  # torchrun and `import torch` per DDP job, for the time estimate
QUIET_CHECK_S = 2.0  # wait_for_quiet's shortest look, once per set
# What the JSON keeps of every run besides the median one.
RUN_KEYS = ("samples_per_s", "final_shares", "mean_compute_s", "overhead_s", "rebalances")


def parse_args(argv=None):
    """Command-line options."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--speeds", default="1.0,0.5,0.25",
                        help="emulated device speeds, comma-separated (default: %(default)s)")
    parser.add_argument("--global-batch", type=int, default=192,
                        help="global batch B; must divide evenly for DDP (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=60,
                        help="steps per configuration, warm-up included (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=10,
                        help="first steps left out of the throughput (default: %(default)s)")
    parser.add_argument("--channels", type=int, default=32, help="CNN width (default: 32)")
    parser.add_argument("--blocks", type=int, default=2, help="residual blocks (default: 2)")
    parser.add_argument("--groups", type=int, default=8, help="GroupNorm groups (default: 8)")
    parser.add_argument("--data-size", type=int, default=2048,
                        help="synthetic training samples (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="run every configuration this many times, interleaved, and report "
                             "the median (default: %(default)s)")
    parser.add_argument("--chorus", default=DEFAULT_CHORUS, help="chorus binary (build/chorus)")
    parser.add_argument("--json-out", default=None,
                        help="where to write the results (default: bench/results/hetero_dp.json, "
                             "with --random-sets bench/results/hetero_dp_random.json)")
    parser.add_argument("--alone-steps", type=int, default=None,
                        help="steps of every alone@S job, warm-up included (default: --steps; "
                             "with --random-sets min(--steps, --warmup + 20))")
    parser.add_argument("--time-to-accuracy", action="store_true",
                        help="also run the default `chorus train` job (Fashion-MNIST to its target "
                             "test accuracy) and report its wall time")
    parser.add_argument("--system-malloc", action="store_true",
                        help="run every job, chorus included, with glibc's default malloc instead "
                             "of the settings chorus gives its workers (see CHORUS_MALLOC)")
    parser.add_argument("--max-foreign", type=float, default=0.15,
                        help="rerun a job during which other processes used more than this many "
                             "cores on average (default: %(default)s)")
    parser.add_argument("--retries", type=int, default=2,
                        help="reruns allowed per disturbed job (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=600,
                        help="seconds allowed for any one job (default: %(default)s)")
    add_random_set_args(parser)
    args = parser.parse_args(argv)
    args.speed_list = [float(s) for s in args.speeds.split(",")]
    if not all(0 < s <= 1 for s in args.speed_list):
        parser.error("every speed must lie in (0, 1]")
    if args.global_batch % len(args.speed_list):
        parser.error(f"--global-batch {args.global_batch} must divide by the "
                     f"{len(args.speed_list)} devices (DDP gives every rank the same batch)")
    if not 0 <= args.warmup < args.steps:
        parser.error("need 0 <= --warmup < --steps")
    check_random_set_args(parser, args)
    if not os.access(args.chorus, os.X_OK):
        parser.error(f"{args.chorus} is not an executable; build it with "
                     "`cmake --build build --target chorus`")
    return args


def add_random_set_args(parser):
    """The options of the many-mixes mode (--random-sets)."""
    group = parser.add_argument_group("many mixes (--random-sets; --speeds and --global-batch "
                                      "are then ignored)")
    group.add_argument("--random-sets", type=int, default=0, metavar="N",
                       help="measure N random speed sets instead of --speeds")
    group.add_argument("--seed", type=int, default=1,
                       help="seed of the random speed sets (default: %(default)s)")
    group.add_argument("--batch-per-device", type=int, default=96,
                       help="global batch per device of a set (default: %(default)s)")
    group.add_argument("--small-batch", type=int, default=48,
                       help="the second batch of each device's cost curve; the first is the "
                            "set's B (default: %(default)s)")
    group.add_argument("--max-speed-sum", type=float, default=0.6,
                       help="scale every set's speeds to sum to at most this many cores "
                            "(default: %(default)s)")
    group.add_argument("--plan-only", action="store_true",
                       help="print the sets and the estimated time, run nothing else")


def check_random_set_args(parser, args):
    """Validate the many-mixes options and fill in the mode-dependent defaults."""
    if args.random_sets < 0:
        parser.error("--random-sets must be >= 0")
    if args.random_sets and not 0 < args.small_batch < 2 * args.batch_per_device:
        parser.error("need 0 < --small-batch < 2 * --batch-per-device (the smallest B)")
    if args.alone_steps is None:
        args.alone_steps = min(args.steps, args.warmup + 20) if args.random_sets else args.steps
    if not args.warmup < args.alone_steps:
        parser.error("need --warmup < --alone-steps")
    if args.json_out is None:
        args.json_out = DEFAULT_RANDOM_JSON if args.random_sets else DEFAULT_JSON


def with_settings(args, **changes):
    """A copy of the options with some changed (a job's own speeds, batch or steps)."""
    changed = copy.copy(args)
    for key, value in changes.items():
        setattr(changed, key, value)
    return changed


def job_env(args, **extra):
    """The environment of every job: this one, the malloc settings and `extra`."""
    env = dict(os.environ, **extra)
    # An empty GLIBC_TUNABLES is glibc's default, and chorus leaves a set one alone.
    env["GLIBC_TUNABLES"] = "" if args.system_malloc else CHORUS_MALLOC
    return env


def run_job(command, timeout, env):
    """Run one job to completion; raise with its output's tail if it fails."""
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-3000:]
        raise RuntimeError(f"{' '.join(command)} exited with {proc.returncode}:\n{tail}")
    return proc.stdout + proc.stderr


def read_json_lines(path):
    """Every JSON object of a JSON-lines file."""
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def summarize(steps, global_batch, warmup):
    """Throughput and per-rank means over the timed steps (the JSON lines after the warm-up)."""
    timed = [s for s in steps if s["step"] > warmup]
    total = sum(s["step_s"] for s in timed)
    result = {
        "timed_steps": len(timed),
        "samples_per_s": global_batch * len(timed) / total,
        "mean_step_s": total / len(timed),
        "median_step_s": statistics.median(s["step_s"] for s in timed),
        "final_shares": steps[-1]["shares"],
    }
    ranks = range(len(timed[0]["compute_s"]))
    result["mean_compute_s"] = [statistics.fmean(s["compute_s"][r] for s in timed) for r in ranks]
    result["mean_wait_s"] = [statistics.fmean(s["wait_s"][r] for s in timed) for r in ranks]
    # Each step waits for its slowest rank: the mean of the per-step maxima is what the step
    # cannot beat (it exceeds the largest per-rank mean by the step-to-step jitter).  The rest,
    # overhead_s, is collectives and the waits in them, optimizer, data, and any time a worker was
    # runnable but had no core (the thread-CPU clock does not count it, and a worker without
    # padding has no slack to hide it).
    result["mean_step_max_compute_s"] = statistics.fmean(max(s["compute_s"]) for s in timed)
    result["overhead_s"] = result["mean_step_s"] - result["mean_step_max_compute_s"]
    return result


def chorus_settings(args, devices, balance):
    """`--set` overrides shared by every chorus benchmark job."""
    return {
        "devices": devices,
        "balance": balance,
        "cpu_threads": 1,  # a device of speed 1 is one core, alone as beside emulated ones
        "train.global_batch": args.global_batch,
        "train.eval_every": 0,
        "train.target_accuracy": 0,
        "train.log_every": args.steps,
        "data.dataset": "synthetic",
        "data.size": args.data_size,
        "model.kind": "cnn",
        "model.channels": args.channels,
        "model.blocks": args.blocks,
        "model.groups": args.groups,
    }


def run_chorus(args, workdir, name, speeds, balance):
    """One `chorus train` job over emulated devices of the given speeds; returns its summary."""
    log = os.path.join(workdir, f"{name}.jsonl")
    devices = ",".join(f"cpu@{s:g}" for s in speeds)
    command = [args.chorus, "train", "--steps", str(args.steps), "--log-json", log]
    for key, value in chorus_settings(args, devices, balance).items():
        command += ["--set", f"{key}={value}"]
    output = run_job(command, args.timeout, job_env(args))
    result = summarize(read_json_lines(log), args.global_batch, args.warmup)
    result["rebalances"] = len(re.findall(r"balancer: step \d+: shares", output))
    return result


def merge_rank_logs(prefix, world):
    """DDP's per-rank logs as chorus's per-step records (step time and loss as rank 0 saw them)."""
    ranks = [read_json_lines(f"{prefix}.rank{r}.jsonl") for r in range(world)]
    return [{"step": lines[0]["step"], "step_s": lines[0]["step_s"],
             "loss": statistics.fmean(line["loss"] for line in lines),
             "compute_s": [line["compute_s"] for line in lines],
             "wait_s": [line["wait_s"] for line in lines]} for lines in zip(*ranks)]


def run_ddp(args, workdir, name):
    """The PyTorch DDP baseline under torchrun, one process per speed; returns its summary."""
    prefix = os.path.join(workdir, name)
    world = len(args.speed_list)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", str(world), DDP_SCRIPT,
               "--speeds", args.speeds, "--global-batch", str(args.global_batch),
               "--steps", str(args.steps), "--channels", str(args.channels),
               "--blocks", str(args.blocks), "--groups", str(args.groups), "--log-prefix", prefix]
    run_job(command, args.timeout, job_env(args, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore"))
    steps = merge_rank_logs(prefix, world)
    for step in steps:
        step["shares"] = [args.global_batch // world] * world
    return summarize(steps, args.global_batch, args.warmup)


def busy_cpu_seconds():
    """CPU seconds the whole machine has spent busy since boot (/proc/stat)."""
    with open("/proc/stat", encoding="utf-8") as handle:
        ticks = [int(x) for x in handle.readline().split()[1:]]
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # less idle, iowait


def own_cpu_seconds():
    """CPU seconds used by this process and its finished jobs (their workers included)."""
    return sum(sum(resource.getrusage(who)[:2])
               for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))


def wait_for_quiet(max_foreign, limit_s=180):
    """Wait (at most limit_s) until other work uses less than max_foreign cores, over 2 s."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        busy = busy_cpu_seconds()
        time.sleep(2)
        if (busy_cpu_seconds() - busy) / 2 < max_foreign:
            return
    print(f"  the machine stayed busy for {limit_s} s; going on", flush=True)


def run_undisturbed(args, job, tag):
    """Run a job; if other work took more than --max-foreign cores meanwhile, wait and rerun."""
    for attempt in range(1 + args.retries):
        start, busy, own = time.monotonic(), busy_cpu_seconds(), own_cpu_seconds()
        result = job(f"{tag}-{attempt}")
        wall = time.monotonic() - start
        # CPU the machine spent beyond this job's own processes: other users' work.
        foreign = (busy_cpu_seconds() - busy - (own_cpu_seconds() - own)) / wall
        result.update(job_wall_s=wall, foreign_cores=max(0.0, foreign), attempts=attempt + 1)
        if foreign <= args.max_foreign:
            break
        print(f"  {tag}: other work used {foreign:.2f} cores meanwhile; rerunning", flush=True)
        wait_for_quiet(args.max_foreign)
    return result


def measure(args, workdir):
    """All configurations, `--repeats` times interleaved; the run with median throughput wins."""
    alone_args = with_settings(args, steps=args.alone_steps)
    jobs = {"adaptive": lambda tag: run_chorus(args, workdir, tag, args.speed_list, "adaptive"),
            "equal": lambda tag: run_chorus(args, workdir, tag, args.speed_list, "off"),
            "ddp": lambda tag: run_ddp(args, workdir, tag)}
    for speed in args.speed_list:
        jobs[f"alone@{speed:g}"] = (
            lambda tag, s=speed: run_chorus(alone_args, workdir, tag, [s], "off"))
    return run_repeated(args, jobs)


def run_repeated(args, jobs):
    """Every job `--repeats` times, interleaved; per job, the run with median throughput."""
    runs = {name: [] for name in jobs}
    for repeat in range(args.repeats):
        for name, job in jobs.items():
            result = run_undisturbed(args, job, f"{name}-{repeat}")
            runs[name].append(result)
            print(f"  {name:<12} run {repeat + 1}/{args.repeats}: "
                  f"{result['samples_per_s']:8.1f} samples/s ({result['job_wall_s']:.1f} s, "
                  f"other work {result['foreign_cores']:.2f} cores), shares "
                  f"{result['final_shares']}, compute ms {fmt_ms(result['mean_compute_s'])}",
                  flush=True)
    results = {}
    for name, attempts in runs.items():
        ranked = sorted(attempts, key=lambda r: r["samples_per_s"])
        # Every run's throughput, final shares and compute, so that an outlier can be explained.
        results[name] = dict(ranked[len(ranked) // 2],
                             all_samples_per_s=[r["samples_per_s"] for r in attempts],
                             all_runs=[{key: r.get(key) for key in RUN_KEYS} for r in attempts])
    return results


def time_to_accuracy(args, workdir):
    """Run the built-in default job and report when it reached its target test accuracy."""
    log = os.path.join(workdir, "default-job.jsonl")
    start = time.monotonic()
    output = run_job([args.chorus, "train", "--log-json", log], args.timeout, job_env(args))
    wall = time.monotonic() - start
    steps = read_json_lines(log)
    evals = [s for s in steps if "test_accuracy" in s]
    done = re.search(r"done: (\d+) steps in ([\d.]+) s, (\d+) samples/s, final loss [\d.]+, "
                     r"test accuracy ([\d.]+)", output)
    target = re.search(r"target ([\d.]+) reached at step (\d+)", output)
    result = {"process_wall_s": wall, "target_reached": bool(target),
              "evaluations": [{"step": s["step"], "test_accuracy": s["test_accuracy"]}
                              for s in evals]}
    if done:
        result.update(steps=int(done.group(1)), train_wall_s=float(done.group(2)),
                      samples_per_s=float(done.group(3)),
                      final_test_accuracy=float(done.group(4)))
    if target:
        reached = int(target.group(2))
        result.update(target_accuracy=float(target.group(1)), target_step=reached,
                      step_seconds_to_target=sum(s["step_s"] for s in steps
                                                 if s["step"] <= reached))
    return result


def machine_info():
    """CPU model, core count, OS and library versions: the context every number needs."""
    with open("/proc/cpuinfo", encoding="utf-8") as handle:
        model = next((line.split(":", 1)[1].strip() for line in handle
                      if line.startswith("model name")), "unknown")
    with warnings.catch_warnings():  # torch warns when NumPy is absent
        warnings.simplefilter("ignore")
        import torch  # noqa: PLC0415  (only for its version; the driver itself needs no torch)
    commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True, check=False).stdout.strip()
    return {"cpu": model, "nproc": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "torch": torch.__version__,
            "git_commit": commit or None, "loadavg_before": list(os.getloadavg())}


def fmt_ms(seconds):
    """A list of durations as whole milliseconds, e.g. '[35, 38, 38]'."""
    return "[" + ", ".join(f"{1000 * x:.0f}" for x in seconds) + "]"


def report(args, results):
    """Derived ratios, then the table; returns the ratios."""
    ideal = sum(results[f"alone@{s:g}"]["samples_per_s"] for s in args.speed_list)
    expected_equal = len(args.speed_list) * min(args.speed_list) / sum(args.speed_list)
    adaptive = results["adaptive"]["samples_per_s"]
    ratios = {"ideal_samples_per_s": ideal, "expected_equal_efficiency": expected_equal,
              "adaptive_over_equal": adaptive / results["equal"]["samples_per_s"],
              "adaptive_over_ddp": adaptive / results["ddp"]["samples_per_s"],
              "proportional_shares": [args.global_batch * s / sum(args.speed_list)
                                      for s in args.speed_list]}
    for name, result in results.items():
        result["efficiency"] = result["samples_per_s"] / ideal
    ratios["adaptive_meets_target"] = results["adaptive"]["efficiency"] >= TARGET_ADAPTIVE

    print(f"\nCNN c={args.channels} blocks={args.blocks}, B={args.global_batch}, "
          f"speeds {args.speeds}, {args.steps - args.warmup} timed steps after {args.warmup}")
    print(f"{'config':<14}{'samples/s':>11}{'efficiency':>12}{'step ms':>9}{'max comp':>10}"
          f"{'other':>7}  mean compute ms per rank  final shares")
    rows = ["adaptive", "equal", "ddp"] + [f"alone@{s:g}" for s in args.speed_list]
    for name in rows:
        r = results[name]
        print(f"{name:<14}{r['samples_per_s']:>11.1f}{r['efficiency']:>12.3f}"
              f"{1000 * r['mean_step_s']:>9.1f}{1000 * r['mean_step_max_compute_s']:>10.1f}"
              f"{1000 * r['overhead_s']:>7.1f}  {fmt_ms(r['mean_compute_s']):<25} "
              f"{r['final_shares']}")
    print(f"{'ideal (sum)':<14}{ideal:>11.1f}{1.0:>12.3f}")
    print("ms per step; max comp: mean over steps of the slowest rank's emulated compute; "
          "other: step - max comp")
    shares = ", ".join(f"{x:.1f}" for x in ratios["proportional_shares"])
    print(f"\nadaptive / equal = {ratios['adaptive_over_equal']:.2f}   adaptive / DDP = "
          f"{ratios['adaptive_over_ddp']:.2f}   expected equal-split efficiency n*min/sum = "
          f"{expected_equal:.3f}   speed-proportional shares [{shares}]")
    verdict = "meets" if ratios["adaptive_meets_target"] else "MISSES"
    print(f"adaptive {verdict} the {TARGET_ADAPTIVE:.2f} target "
          f"({results['adaptive']['efficiency']:.3f} of the ideal)")
    return ratios


def set_options(args, speeds):
    """The options of one random set: its speeds, and B = --batch-per-device per device."""
    return with_settings(args, speed_list=speeds, speeds=",".join(f"{s:g}" for s in speeds),
                         global_batch=args.batch_per_device * len(speeds))


def alone_name(index, speed, batch):
    """The name of the job that runs device `index` alone on `batch`, e.g. alone2@0.043-b288."""
    return f"alone{index}@{speed:g}-b{batch}"


def set_jobs(args, workdir):
    """One set's jobs: adaptive, equal, ddp, and every device alone on B and on --small-batch."""
    large = with_settings(args, steps=args.alone_steps)
    small = with_settings(large, global_batch=args.small_batch)
    jobs = {"adaptive": lambda tag: run_chorus(args, workdir, tag, args.speed_list, "adaptive"),
            "equal": lambda tag: run_chorus(args, workdir, tag, args.speed_list, "off"),
            "ddp": lambda tag: run_ddp(args, workdir, tag)}
    for index, speed in enumerate(args.speed_list):
        for options in (large, small):
            jobs[alone_name(index, speed, options.global_batch)] = (
                lambda tag, s=speed, o=options: run_chorus(o, workdir, tag, [s], "off"))
    return jobs


def cost_curves(args, results):
    """Each device's t(b) = a + c * b through its step times alone on --small-batch and on B."""
    curves = []
    for index, speed in enumerate(args.speed_list):
        small = results[alone_name(index, speed, args.small_batch)]["mean_step_s"]
        large = results[alone_name(index, speed, args.global_batch)]["mean_step_s"]
        curves.append(speed_sets.fit_cost_curve(args.small_batch, small, args.global_batch, large))
    return curves


def set_ratios(args, results):
    """One set's ideal, balanced optimum and ratios; also stores every run's efficiency."""
    batch = args.global_batch
    ideal = sum(results[alone_name(i, s, batch)]["samples_per_s"]
                for i, s in enumerate(args.speed_list))
    curves = cost_curves(args, results)
    shares, optimum_step_s = speed_sets.balanced_shares(curves, batch)
    optimum = batch / optimum_step_s
    for result in results.values():
        result["efficiency"] = result["samples_per_s"] / ideal
    throughput = {name: results[name]["samples_per_s"] for name in ("adaptive", "equal", "ddp")}
    return {"adaptive_over_ideal": throughput["adaptive"] / ideal,
            "adaptive_over_optimum": throughput["adaptive"] / optimum,
            "equal_over_ideal": throughput["equal"] / ideal,
            "ddp_over_ideal": throughput["ddp"] / ideal,
            "optimum_over_ideal": optimum / ideal,
            "ideal_samples_per_s": ideal, "optimum_samples_per_s": optimum,
            "optimum_step_s": optimum_step_s, "optimum_shares": shares,
            "adaptive_final_shares": results["adaptive"]["final_shares"],
            "proportional_shares": [round(batch * s / sum(args.speed_list), 1)
                                    for s in args.speed_list],
            "cost_curves": curves}


def measure_set(args, workdir, index, speeds):
    """Every job of one random set, `--repeats` times; returns the set's JSON record."""
    options = set_options(args, speeds)
    set_dir = os.path.join(workdir, f"set{index}")
    os.makedirs(set_dir)
    print(f"\nset {index + 1}/{args.random_sets}: speeds {options.speeds}, "
          f"B={options.global_batch}", flush=True)
    wait_for_quiet(args.max_foreign)
    started = time.monotonic()
    results = run_repeated(options, set_jobs(options, set_dir))
    record = {"set": index, "speeds": speeds, "devices": len(speeds),
              "global_batch": options.global_batch}
    record.update(set_ratios(options, results))
    record.update(wall_s=time.monotonic() - started, results=results)
    print("  " + "  ".join(f"{key} {record[key]:.3f}" for key in SET_RATIOS), flush=True)
    return record


def calibrate(args, workdir):
    """Real seconds per sample and per job start-up: one short unpadded job (cpu@1, B = 96)."""
    probe = with_settings(args, global_batch=args.batch_per_device, steps=8, warmup=3)
    start = time.monotonic()
    result = run_chorus(probe, workdir, "calibration", [1.0], "off")
    wall = time.monotonic() - start
    return {"per_sample_s": result["mean_step_s"] / probe.global_batch,
            "startup_s": max(0.0, wall - probe.steps * result["mean_step_s"])}


def estimate_set_s(args, speeds, calibration):
    """Estimated seconds of one set, every repeat: per job, steps x emulated step + start-up.

    The step of a chorus job is its slowest device's emulated compute: for adaptive, B at the
    summed speed; for an equal split (and DDP, which also starts torchrun and Python), B / n at
    the slowest speed; alone, the batch at the device's speed.  Collectives are left out.
    """
    per_sample, startup = calibration["per_sample_s"], calibration["startup_s"]
    batch = args.batch_per_device * len(speeds)
    equal_step = per_sample * batch / len(speeds) / min(speeds)
    seconds = args.steps * (per_sample * batch / sum(speeds) + 2 * equal_step)
    seconds += 3 * startup + DDP_STARTUP_S
    for speed in speeds:
        seconds += 2 * startup + args.alone_steps * per_sample * (batch + args.small_batch) / speed
    return args.repeats * seconds + QUIET_CHECK_S


def print_plan(args, sets, estimates, calibration):
    """The drawn sets and how long each should take."""
    print(f"calibration: {1e3 * calibration['per_sample_s']:.3f} ms per sample (real, cpu@1), "
          f"{calibration['startup_s']:.1f} s start-up per job")
    for index, (speeds, seconds) in enumerate(zip(sets, estimates)):
        print(f"  set {index + 1}: speeds {','.join(f'{s:g}' for s in speeds)} "
              f"(sum {sum(speeds):.3f}), B={args.batch_per_device * len(speeds)}: "
              f"~{seconds / 60:.1f} min")
    print(f"estimated total for {len(sets)} sets, {args.repeats} repeat(s), {args.steps} steps "
          f"(alone jobs {args.alone_steps}): ~{sum(estimates) / 60:.0f} min, if undisturbed",
          flush=True)


def summarize_sets(records):
    """The distribution of every ratio over the sets."""
    return {key: speed_sets.distribution([r[key] for r in records]) for key in SET_RATIOS}


def print_sets_table(records, summary):
    """One row per set, then min / median / max of every ratio."""
    header = ("adapt/ideal", "adapt/opt", "equal/ideal", "ddp/ideal", "opt/ideal")
    print(f"\n{'set':>3} {'speeds':<26}{'B':>4}" + "".join(f"{h:>12}" for h in header)
          + "  final shares / optimum shares")
    for r in records:
        print(f"{r['set'] + 1:>3} {','.join(f'{s:g}' for s in r['speeds']):<26}"
              f"{r['global_batch']:>4}" + "".join(f"{r[key]:>12.3f}" for key in SET_RATIOS)
              + f"  {r['adaptive_final_shares']} / {r['optimum_shares']}")
    for stat in ("min", "median", "max"):
        values = "".join(f"{summary[key][stat]:>12.3f}" for key in SET_RATIOS)
        print(f"{stat:<34}{values}")
    print("ideal: sum of standalone throughputs on B; opt: the balanced optimum from each "
          "device's cost curve alone (t = a + c*b at b = small batch and B)")


def random_settings(args):
    """What the many-mixes JSON records of the options."""
    keys = ("random_sets", "seed", "batch_per_device", "small_batch", "max_speed_sum", "steps",
            "alone_steps", "warmup", "channels", "blocks", "groups", "data_size", "repeats",
            "system_malloc", "max_foreign", "retries")
    settings = {key: getattr(args, key) for key in keys}
    settings["glibc_tunables"] = "" if args.system_malloc else CHORUS_MALLOC
    settings["chorus_set"] = chorus_settings(args, "<per config>", "<per config>")
    settings["chorus_set"]["train.global_batch"] = "<batch_per_device * devices>"
    return settings


def write_json(path, document):
    """Write a result document (indented JSON) to `path`, creating its folder."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(document, handle, indent=2)
        handle.write("\n")


def main_random(args):
    """--random-sets: draw the sets, estimate, measure each, print the table, write the JSON."""
    machine = machine_info()
    sets = speed_sets.draw_speed_sets(args.random_sets, args.seed, args.max_speed_sum)
    print(f"hetero_dp --random-sets {args.random_sets} --seed {args.seed} on {machine['cpu']} "
          f"({machine['nproc']} cores), load average {machine['loadavg_before'][0]:.2f}",
          flush=True)
    wait_for_quiet(args.max_foreign)
    started = datetime.datetime.now(datetime.timezone.utc)
    document = {"benchmark": "hetero_dp_random", "date": started.isoformat(timespec="seconds"),
                "machine": machine, "settings": random_settings(args), "complete": False}
    with tempfile.TemporaryDirectory(prefix="hetero_dp-") as workdir:
        document["calibration"] = calibrate(args, workdir)
        estimates = [estimate_set_s(args, speeds, document["calibration"]) for speeds in sets]
        document["estimated_s"] = sum(estimates)
        print_plan(args, sets, estimates, document["calibration"])
        if args.plan_only:
            return
        records = document["sets"] = []
        for index, speeds in enumerate(sets):
            records.append(measure_set(args, workdir, index, speeds))
            elapsed = (datetime.datetime.now(datetime.timezone.utc) - started).total_seconds()
            print(f"  {elapsed / 60:.1f} min so far (estimated "
                  f"{sum(estimates[:index + 1]) / 60:.1f})", flush=True)
            write_json(args.json_out, document)  # what is done survives an interruption
    document["summary"] = summarize_sets(records)
    print_sets_table(records, document["summary"])
    machine["loadavg_after"] = list(os.getloadavg())
    document.update(complete=True, wall_s=(datetime.datetime.now(datetime.timezone.utc)
                                           - started).total_seconds())
    write_json(args.json_out, document)
    print(f"\nwrote {args.json_out}")


def main(argv=None):
    """Run every configuration, print the table, write the JSON."""
    args = parse_args(argv)
    if args.random_sets:
        main_random(args)
        return
    if sum(args.speed_list) > MAX_SPEED_SUM:
        print(f"warning: speeds sum to {sum(args.speed_list):g} > {MAX_SPEED_SUM}: workers "
              "compete for cores", file=sys.stderr)
    machine = machine_info()
    malloc_note = ", --system-malloc" if args.system_malloc else ""
    print(f"hetero_dp on {machine['cpu']} ({machine['nproc']} cores), load average "
          f"{machine['loadavg_before'][0]:.2f}{malloc_note}", flush=True)
    wait_for_quiet(args.max_foreign)
    started = datetime.datetime.now(datetime.timezone.utc)
    with tempfile.TemporaryDirectory(prefix="hetero_dp-") as workdir:
        results = measure(args, workdir)
        ratios = report(args, results)
        accuracy = None
        if args.time_to_accuracy:
            print("\ntime to accuracy: the default `chorus train` job ...", flush=True)
            accuracy = time_to_accuracy(args, workdir)
            print(f"target {accuracy.get('target_accuracy', '?')} (on the job's eval subset) "
                  f"reached at step {accuracy.get('target_step', 'NEVER')}: "
                  f"{accuracy['process_wall_s']:.1f} s wall (whole process), "
                  f"{accuracy.get('train_wall_s', 0):.1f} s training; accuracy on the whole "
                  f"test split at the end {accuracy.get('final_test_accuracy', 0):.4f}")
    machine["loadavg_after"] = list(os.getloadavg())
    settings = {key: getattr(args, key) for key in
                ("speeds", "global_batch", "steps", "alone_steps", "warmup", "channels",
                 "blocks", "groups", "data_size", "repeats", "system_malloc", "max_foreign",
                 "retries")}
    settings["glibc_tunables"] = "" if args.system_malloc else CHORUS_MALLOC
    settings["chorus_set"] = chorus_settings(args, "<per config>", "<per config>")
    document = {"benchmark": "hetero_dp", "date": started.isoformat(timespec="seconds"),
                "wall_s": (datetime.datetime.now(datetime.timezone.utc) - started).total_seconds(),
                "machine": machine, "settings": settings, "results": results,
                "ratios": ratios, "time_to_accuracy": accuracy}
    write_json(args.json_out, document)
    print(f"\nwrote {args.json_out}")


if __name__ == "__main__":
    main()
