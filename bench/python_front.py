#!/usr/bin/env python3
"""The Python front against the C++ trainer and PyTorch DDP, on the same model and devices.

Three ways to train chorus's residual CNN (src/model/cnn.cc; in PyTorch: bench/ddp_baseline.py's
ResidualCNN) on the same synthetic data shape, global batch, SGD and emulated devices:

  cpp      `chorus train` (the C++ trainer), data and loop in C++
  python   bench/python_front_worker.py under `chorus run`: a PyTorch module wrapped in
           chorus.DataParallel, a DataLoader over chorus.ShardSampler, chorus.step
  ddp      real PyTorch DDP (bench/ddp_baseline.py under torchrun, Gloo, CPU), B / n per rank,
           padded with sleep exactly as chorus pads its emulated devices

on two device sets: `cpu@1,cpu@1` with fixed equal shares (what the Python loop costs, with
nothing to balance) and `cpu@1,cpu@0.5` with the adaptive balancer (DDP: its equal split). Each
configuration runs once per seed (--seeds, interleaved); throughput is B x timed steps / their
summed wall time, the first --warmup steps left out (start-up, the balancer's profiling). The
report gives, per configuration, the min and median over the seeds, and the ratios python/cpp
(1 - ratio is the Python front's overhead; target <= 5%) and python/ddp per seed, min and median.

    python3 bench/python_front.py                    # ~8 minutes on the 2-core machine

The timed steps are many (90 by default) because a run's compute moves by a few percent between
runs of one configuration on this host, as much as the overhead being measured; `overhead_ms`
(each step's time beyond its slowest rank's compute) separates what the loop adds from that.
"""

import argparse
import datetime
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hetero_dp  # noqa: E402  (its job runner, summary, machine info)

REPO = hetero_dp.REPO
WORKER = os.path.join(REPO, "bench", "python_front_worker.py")
DEFAULT_JSON = os.path.join(REPO, "bench", "results", "python_front.json")
SETS = (("1,1", "fixed"), ("1,0.5", "adaptive"))


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--global-batch", type=int, default=192)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--seeds", default="1,2,3,4,5,6")
    parser.add_argument("--channels", type=int, default=32)
    parser.add_argument("--blocks", type=int, default=2)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--data-size", type=int, default=2048)
    parser.add_argument("--chorus", default=hetero_dp.DEFAULT_CHORUS)
    parser.add_argument("--pythonpath", default=os.path.join(REPO, "build", "python"),
                        help="where `import chorus` finds the package (default: the build tree)")
    parser.add_argument("--sets", default="fixed,adaptive",
                        help="which device sets to run: fixed (cpu@1,cpu@1, equal fixed shares) "
                             "and/or adaptive (cpu@1,cpu@0.5, with DDP)")
    parser.add_argument("--json-out", default=DEFAULT_JSON)
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    args.system_malloc = False  # hetero_dp.job_env: chorus's malloc settings for every job
    return args


def devices_of(speeds):
    return ",".join(f"cpu@{float(s):g}" for s in speeds.split(","))


def run_cpp(args, workdir, speeds, balance, seed):
    log = os.path.join(workdir, f"cpp-{speeds}-{seed}.jsonl")
    settings = {"devices": devices_of(speeds), "balance": "off" if balance == "fixed" else balance,
                "seed": seed, "train.global_batch": args.global_batch, "train.eval_every": 0,
                "train.target_accuracy": 0, "train.log_every": args.steps,
                "data.dataset": "synthetic", "data.size": args.data_size, "model.kind": "cnn",
                "model.channels": args.channels, "model.blocks": args.blocks,
                "model.groups": args.groups, "optimizer.warmup_steps": 0}
    command = [args.chorus, "train", "--steps", str(args.steps), "--log-json", log]
    for key, value in settings.items():
        command += ["--set", f"{key}={value}"]
    hetero_dp.run_job(command, args.timeout, hetero_dp.job_env(args))
    return hetero_dp.summarize(hetero_dp.read_json_lines(log), args.global_batch, args.warmup)


def run_python(args, workdir, speeds, balance, seed):
    log = os.path.join(workdir, f"python-{speeds}-{seed}.jsonl")
    command = [args.chorus, "run", "--devices", devices_of(speeds), "--", sys.executable, WORKER,
               log, "--global-batch", str(args.global_batch), "--steps", str(args.steps),
               "--balance", balance, "--channels", str(args.channels), "--blocks",
               str(args.blocks), "--groups", str(args.groups), "--data-size",
               str(args.data_size), "--seed", str(seed)]
    env = hetero_dp.job_env(args, PYTHONPATH=args.pythonpath, PYTHONWARNINGS="ignore")
    hetero_dp.run_job(command, args.timeout, env)
    return hetero_dp.summarize(hetero_dp.read_json_lines(log), args.global_batch, args.warmup)


def run_ddp(args, workdir, speeds, seed):
    prefix = os.path.join(workdir, f"ddp-{speeds}-{seed}")
    world = len(speeds.split(","))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
               str(world), hetero_dp.DDP_SCRIPT, "--speeds", speeds, "--global-batch",
               str(args.global_batch), "--steps", str(args.steps), "--channels",
               str(args.channels), "--blocks", str(args.blocks), "--groups", str(args.groups),
               "--seed", str(seed), "--log-prefix", prefix]
    env = hetero_dp.job_env(args, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    hetero_dp.run_job(command, args.timeout, env)
    steps = hetero_dp.merge_rank_logs(prefix, world)
    for step in steps:
        step["shares"] = [args.global_batch // world] * world
    return hetero_dp.summarize(steps, args.global_batch, args.warmup)


def spread(values):
    return {"min": min(values), "median": statistics.median(values), "max": max(values),
            "runs": values}


def main():
    args = parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    document = {"benchmark": "python_front", "date": datetime.datetime.now(
        datetime.timezone.utc).isoformat(timespec="seconds"), "machine": hetero_dp.machine_info(),
        "settings": {k: getattr(args, k) for k in ("global_batch", "steps", "warmup", "channels",
                                                    "blocks", "groups", "data_size")},
        "seeds": seeds, "sets": []}
    with tempfile.TemporaryDirectory() as workdir:
        for speeds, balance in [entry for entry in SETS if entry[1] in args.sets.split(",")]:
            runs = {"cpp": [], "python": [], "ddp": []}
            for seed in seeds:  # interleaved, so that a slow minute of the host hits all alike
                runs["cpp"].append(run_cpp(args, workdir, speeds, balance, seed))
                runs["python"].append(run_python(args, workdir, speeds, balance, seed))
                if balance == "adaptive":
                    runs["ddp"].append(run_ddp(args, workdir, speeds, seed))
                print(f"{speeds} {balance} seed {seed}: " + ", ".join(
                    f"{name} {r[-1]['samples_per_s']:.0f}/s" for name, r in runs.items() if r),
                    flush=True)
            rates = {name: [r["samples_per_s"] for r in rs] for name, rs in runs.items() if rs}
            entry = {"devices": devices_of(speeds), "balance": balance,
                     "samples_per_s": {name: spread(v) for name, v in rates.items()},
                     # Per run, ms: the mean step, the mean of each step's slowest compute, and
                     # the rest (collectives, optimizer, data, the loop itself).
                     "step_ms": {name: [round(r["mean_step_s"] * 1e3, 3) for r in rs]
                                 for name, rs in runs.items() if rs},
                     "overhead_ms": {name: [round(r["overhead_s"] * 1e3, 3) for r in rs]
                                     for name, rs in runs.items() if rs},
                     "final_shares": {name: [r["final_shares"] for r in rs]
                                      for name, rs in runs.items() if rs},
                     "python_over_cpp": spread([p / c for p, c in zip(rates["python"],
                                                                     rates["cpp"])])}
            if "ddp" in rates:
                entry["python_over_ddp"] = spread([p / d for p, d in zip(rates["python"],
                                                                        rates["ddp"])])
                entry["cpp_over_ddp"] = spread([c / d for c, d in zip(rates["cpp"], rates["ddp"])])
            document["sets"].append(entry)
    print(f"\n{'devices':<16} {'balance':<9} {'cpp /s':>14} {'python /s':>14} {'ddp /s':>14} "
          f"{'python/cpp':>16} {'python/ddp':>16}   (min / median over {len(seeds)} seeds)")
    for entry in document["sets"]:
        rate = entry["samples_per_s"]
        cell = lambda d: f"{d['min']:.0f} / {d['median']:.0f}" if d else "-"  # noqa: E731
        ratio = lambda d: f"{d['min']:.3f} / {d['median']:.3f}" if d else "-"  # noqa: E731
        print(f"{entry['devices']:<16} {entry['balance']:<9} {cell(rate['cpp']):>14} "
              f"{cell(rate['python']):>14} {cell(rate.get('ddp')):>14} "
              f"{ratio(entry['python_over_cpp']):>16} {ratio(entry.get('python_over_ddp')):>16}")
    for entry in document["sets"]:
        print(f"{entry['devices']:<16} {entry['balance']:<9} median step beyond the slowest "
              "compute: " + ", ".join(f"{name} {statistics.median(v):.2f} ms"
                                      for name, v in entry["overhead_ms"].items()))
    hetero_dp.write_json(args.json_out, document)
    print(f"wrote {args.json_out}")


if __name__ == "__main__":
    main()
