#!/usr/bin/env python3
"""A Python job started by a real local Slurm's `srun`, with CHORUS_METRICS_PORT and CHORUS_TRACE
and no chorus agent (runtime/launch/job_observation.h): the node's first task serves /metrics with
both tasks' series, and task 0 merges both tasks' trace parts when the job ends. The test starts
its own munged, slurmctld and slurmd (slurm_test.py's) and stops them again, whatever happens.

Checks: `srun --ntasks=2` of tests/python/workers/observed.py (8 steps, CHORUS_DEVICES
cpu,cpu@0.25, CHORUS_TRACE_STEPS 0:4) announces one metrics endpoint, of node 0 under srun; a plain
HTTP GET of its /metrics (Prometheus's text format) has chorus_steps_total 8 for ranks 0 and 1, the
ranks' devices, node 0 on both, shares summing to the global batch; srun exits 0 once the tasks
are released; task 0 says it wrote the timeline of 2 ranks, the trace has both ranks' spans of
steps 0 to 3, and no part is left.

Exit codes: 0 pass, 1 fail, 77 skip (as slurm_test.py: not root, Slurm or munge missing, the host
name does not resolve). Needs the Python package on PYTHONPATH (CTest sets it to the build's).

Usage: slurm_python_observe_test.py [--keep]
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from slurm_test import Munge, Slurm, check_can_run, free_port, tail, wait_for  # noqa: E402
from script_support import Failure, Skip  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(REPO, "tests", "python", "workers", "observed.py")
STEPS = 8
GLOBAL_BATCH = 48
DEADLINE_S = 120
ANNOUNCED = r"chorus: metrics of node (\d+) \((\w+)\) on http://[^:]+:(\d+)/metrics"


def get(url):
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def samples_of(text):
    """[(name, {label: value}, value)] of a Prometheus text exposition."""
    samples = []
    for line in text.splitlines():
        found = re.fullmatch(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)", line)
        if line and not line.startswith("#"):
            if not found:
                raise Failure(f"not a sample line of the text format: {line!r}")
            labels = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"',
                                     found.group(2) or ""))
            samples.append((found.group(1), labels, float(found.group(3))))
    return samples


def by_rank(samples, name):
    return {labels["rank"]: value for n, labels, value in samples if n == name}


def run_job(slurm, workdir):
    hold, trace = os.path.join(workdir, "hold"), os.path.join(workdir, "trace.json")
    secret = os.path.join(workdir, "job.secret")
    with open(os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
        f.write(os.urandom(32).hex())
    env = dict(slurm.env, CHORUS_RDZV_ENDPOINT=f"127.0.0.1:{free_port()}",
               CHORUS_SECRET_FILE=secret, CHORUS_DEVICES="cpu,cpu@0.25",
               CHORUS_METRICS_PORT="0", CHORUS_TRACE=trace, CHORUS_TRACE_STEPS="0:4",
               OMP_NUM_THREADS="1")
    output = os.path.join(workdir, "srun.out")
    out = open(output, "w")
    job = subprocess.Popen(
        ["srun", "--ntasks=2", "--overcommit", "--label", f"--chdir={workdir}", sys.executable,
         WORKER, "--steps", str(STEPS), "--global-batch", str(GLOBAL_BATCH), "--hold", hold,
         "--pause", "0.01"],
        env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        def announced():
            if job.poll() is not None:
                raise Failure(f"srun exited with {job.returncode}:\n{tail(output)}")
            return re.findall(ANNOUNCED, open(output).read())
        ports = wait_for("the job's metrics port", announced, deadline_s=DEADLINE_S)
        if len(ports) != 1 or ports[0][:2] != ("0", "srun"):
            raise Failure(f"announced endpoints {ports}, expected one of node 0 under srun")
        url = f"http://127.0.0.1:{ports[0][2]}/metrics"

        def finished():
            if job.poll() is not None:
                raise Failure(f"srun exited with {job.returncode}:\n{tail(output)}")
            samples = samples_of(get(url))
            return samples if by_rank(samples, "chorus_steps_total") == {
                "0": STEPS, "1": STEPS} else None
        samples = wait_for(f"chorus_steps_total at {STEPS} on both ranks", finished,
                           deadline_s=DEADLINE_S)
        info = {labels["rank"]: labels for n, labels, _ in samples if n == "chorus_rank_info"}
        devices = {rank: labels["device"] for rank, labels in info.items()}
        nodes = {rank: labels["node"] for rank, labels in info.items()}
        shares = by_rank(samples, "chorus_share_samples")
        print(f"srun: metrics of both tasks on port {ports[0][2]}: devices {devices}, nodes "
              f"{nodes}, shares {shares}")
        if devices != {"0": "cpu", "1": "cpu@0.25"} or nodes != {"0": "0", "1": "0"}:
            raise Failure(f"rank info {info}")
        if sum(shares.values()) != GLOBAL_BATCH:
            raise Failure(f"shares {shares} do not sum to {GLOBAL_BATCH}")
        open(hold, "w").close()
        code = job.wait(timeout=DEADLINE_S)
    finally:
        open(hold, "w").close()
        if job.poll() is None:
            job.kill()
            job.wait()
        out.close()
    text = open(output).read()
    if code != 0:
        raise Failure(f"srun exited with {code}:\n{text[-3000:]}")
    if not re.search(rf"^0: chorus: wrote the timeline of 2 ranks to {re.escape(trace)}$", text,
                     re.M):
        raise Failure(f"task 0 did not say it wrote the timeline of 2 ranks:\n{text[-3000:]}")
    left = [name for name in os.listdir(workdir) if ".rank" in name]
    if left:
        raise Failure(f"trace parts left behind: {left}")
    with open(trace) as f:
        spans = [e for e in json.load(f)["traceEvents"] if e["ph"] == "X"]
    for rank in (0, 1):
        steps = {e["args"]["step"] for e in spans if e["args"]["rank"] == rank}
        names = {e["name"] for e in spans if e["args"]["rank"] == rank}
        if steps != {0, 1, 2, 3} or not {"forward", "backward", "optimizer"} <= names:
            raise Failure(f"rank {rank}'s spans: steps {steps}, names {names}")
    print(f"srun: trace of 2 ranks, steps 0-3, {len(spans)} spans")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keep", action="store_true", help="keep the temporary dir")
    args = parser.parse_args()
    try:
        host = check_can_run()
    except Skip as reason:
        print(f"SKIP: {reason}")
        return 77
    started = time.monotonic()
    workdir = tempfile.mkdtemp(prefix="chorus-slurm-python-")
    os.chmod(workdir, 0o755)  # munged checks every directory above its socket
    munge = slurm = None
    try:
        munge = Munge(workdir)
        munge.start()
        slurm = Slurm(workdir, host, munge.socket)
        slurm.start()
        print(f"slurm: {host} idle after {time.monotonic() - started:.1f} s")
        run_job(slurm, workdir)
        print(f"PASS in {time.monotonic() - started:.1f} s")
        return 0
    except (Failure, subprocess.TimeoutExpired) as failure:
        print(f"FAIL: {failure}")
        if slurm:
            print(slurm.logs())
        return 1
    finally:
        if slurm:
            slurm.stop()
        if munge:
            munge.stop()
        if args.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
