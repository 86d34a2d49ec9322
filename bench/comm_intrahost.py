#!/usr/bin/env python3
"""Intra-host CPU all-reduce: chorus over Gloo, chorus over shared memory, OpenMPI's MPI_Allreduce.

One run measures 2-process all-reduce of float32 (sum, in place) at 1, 4, 16 and 64 MiB with

  gloo   `chorus bench comm --transports gloo` (c10d's ProcessGroupGloo over loopback TCP)
  shm    `chorus bench comm --transports shm`  (chorus's shared-memory transport)
  mpi    bench/mpi_allreduce.c under `mpirun --allow-run-as-root -np 2 --bind-to none`
         (Debian's OpenMPI; the script records which point-to-point layer it used)

Each measurement is the slowest rank's mean over the timed iterations (after warm-up), the way
nccl-tests time; the whole set is repeated --repeats times, interleaved, and the median is kept,
because this machine is shared (the load average before each repetition is recorded too).
Every run also checks its result against the known answer.
Writes bench/results/comm_intrahost.json and prints a table with ratios (target: shm >= mpi).

    python3 bench/comm_intrahost.py                  # ~1 minute on a 2-core machine
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
DEFAULT_CHORUS = os.path.join(REPO, "build", "chorus")
MPI_SOURCE = os.path.join(REPO, "bench", "mpi_allreduce.c")
DEFAULT_JSON = os.path.join(REPO, "bench", "results", "comm_intrahost.json")
SIZES = [1 << 20, 4 << 20, 16 << 20, 64 << 20]
BACKENDS = ["gloo", "shm", "mpi"]


def parse_args(argv=None):
    """Command-line options."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--chorus", default=DEFAULT_CHORUS, help="chorus binary (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed iterations (default: %(default)s)")
    parser.add_argument("--iters", type=int, default=20, help="timed iterations (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="interleaved repetitions of the whole set; the median is kept (default: %(default)s)")
    parser.add_argument("--shm-chunk", default="", help="chorus shm chunk size (default: chorus's)")
    parser.add_argument("--json", default=DEFAULT_JSON, help="output file (default: %(default)s)")
    return parser.parse_args(argv)


def build_mpi(workdir):
    """Compiles the MPI baseline with mpicc; returns the executable's path."""
    exe = os.path.join(workdir, "mpi_allreduce")
    subprocess.run(["mpicc", "-O3", "-o", exe, MPI_SOURCE], check=True)
    return exe


def run_chorus(args, transport):
    """Rows of one `chorus bench comm` run over `transport`."""
    command = [args.chorus, "--log-level", "warn", "bench", "comm", "--ranks", "2",
               "--ops", "all_reduce", "--transports", transport, "-d", "float32",
               "-b", "1M", "-e", "64M", "-f", "4", "-w", str(args.warmup), "-n", str(args.iters),
               "--json"]
    if args.shm_chunk:
        command += ["--shm-chunk", args.shm_chunk]
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(output[output.index("["):]), " ".join(command)


def mpi_command(exe, args, verbose=False):
    command = ["mpirun", "--allow-run-as-root", "-np", "2", "--bind-to", "none"]
    if verbose:
        command += ["--mca", "pml_base_verbose", "10", "--mca", "btl_base_verbose", "10"]
    return command + [exe, "-w", str(args.warmup), "-n", str(args.iters)] + [str(s) for s in SIZES]


def run_mpi(exe, args):
    """Rows of one MPI_Allreduce run."""
    command = mpi_command(exe, args)
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    rows = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    return rows, " ".join(command)


def mpi_transport(exe, args):
    """Which PML and BTLs OpenMPI selected, from its own verbose output."""
    quick = argparse.Namespace(warmup=0, iters=1)
    result = subprocess.run(mpi_command(exe, quick, verbose=True)[:-3] + [str(1 << 10)],
                            capture_output=True, text=True)
    text = result.stdout + result.stderr
    pml = sorted(set(re.findall(r"select: component (\w+) selected", text)))
    btls = sorted(set(re.findall(r"select: init of component (\w+) returned success", text)))
    version = subprocess.run(["mpirun", "--version"], capture_output=True, text=True).stdout
    return {"pml": pml, "btl_initialized": btls,
            "on_host_btl": "vader" if "vader" in btls else ("sm" if "sm" in btls else "?"),
            "version": version.splitlines()[0] if version else "?"}


def machine():
    """The CPU as the docs quote it: model, family/model/stepping (a VM's model name is often
    just the vendor's), how the vCPUs share cores (SMT siblings share a core's caches, which
    decides what shared memory can reach), and the cache sizes."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if not line.strip():
                    break  # the first processor is enough
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    lscpu = {}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            key, _, value = line.partition(":")
            lscpu[key.strip()] = value.strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return {"cpu": fields.get("model name", "?"),
            "cpu_family_model_stepping": [fields.get("cpu family"), fields.get("model"),
                                          fields.get("stepping")],
            "threads_per_core": lscpu.get("Thread(s) per core", "?"),
            "caches": {name: lscpu.get(name, "?") for name in
                       ("L1d cache", "L2 cache", "L3 cache")},
            "hypervisor": lscpu.get("Hypervisor vendor", "none"),
            "vcpus": os.cpu_count(), "kernel": platform.release(),
            "load_average_at_start": os.getloadavg()}


def main(argv=None):
    args = parse_args(argv)
    samples = {(b, s): [] for b in BACKENDS for s in SIZES}
    wrong = {(b, s): 0 for b in BACKENDS for s in SIZES}
    commands = {}
    loads = []  # 1-minute load average before each repetition
    host = machine()  # before the runs: the load average says how busy the machine was
    with tempfile.TemporaryDirectory() as workdir:
        exe = build_mpi(workdir)
        transport = mpi_transport(exe, args)
        for repeat in range(args.repeats):
            loads.append(os.getloadavg()[0])
            for backend in BACKENDS:
                if backend == "mpi":
                    rows, commands[backend] = run_mpi(exe, args)
                else:
                    rows, commands[backend] = run_chorus(args, backend)
                for row in rows:
                    key = (backend, row["size"])
                    if key in samples:
                        samples[key].append(row["time_s"])
                        wrong[key] += row["wrong"]
            print(f"repeat {repeat + 1}/{args.repeats} done", file=sys.stderr)
    results = []
    for size in SIZES:
        entry = {"size": size}
        for backend in BACKENDS:
            time_s = statistics.median(samples[(backend, size)])
            entry[backend] = {"time_s": time_s, "algbw": size / time_s / 1e9,
                              "busbw": size / time_s / 1e9, "wrong": wrong[(backend, size)],
                              "samples_s": samples[(backend, size)]}
        entry["shm_over_mpi"] = entry["shm"]["algbw"] / entry["mpi"]["algbw"]
        entry["shm_over_gloo"] = entry["shm"]["algbw"] / entry["gloo"]["algbw"]
        entry["mpi_over_gloo"] = entry["mpi"]["algbw"] / entry["gloo"]["algbw"]
        results.append(entry)

    print(f"2-process all-reduce, float32 sum, algbw in GB/s (median of {args.repeats}; "
          f"OpenMPI pml {','.join(transport['pml'])}, on-host btl {transport['on_host_btl']}; "
          f"load average {min(loads):.1f}-{max(loads):.1f})")
    print(f"{'size':>6} {'gloo':>8} {'shm':>8} {'mpi':>8} {'shm/mpi':>8} {'shm/gloo':>9} {'#wrong':>7}")
    for entry in results:
        errors = sum(entry[b]["wrong"] for b in BACKENDS)
        print(f"{entry['size'] >> 20:>4}Mi {entry['gloo']['algbw']:8.2f} {entry['shm']['algbw']:8.2f} "
              f"{entry['mpi']['algbw']:8.2f} {entry['shm_over_mpi']:8.2f} "
              f"{entry['shm_over_gloo']:9.2f} {errors:>7}")
    report = {"benchmark": "comm_intrahost", "date": datetime.datetime.now().isoformat(timespec="seconds"),
              "machine": dict(host, load_average_at_end=os.getloadavg(), load_average_per_repeat=loads), "ranks": 2, "type": "float32", "reduction": "sum",
              "warmup": args.warmup, "iters": args.iters, "repeats": args.repeats,
              "mpi_transport": transport, "commands": commands, "results": results,
              "target_met": all(e["shm_over_mpi"] >= 1.0 for e in results)}
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as out:
        json.dump(report, out, indent=1)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
