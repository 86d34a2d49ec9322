#!/usr/bin/env python3
"""A Python program under `chorus run --metrics-port 0`, scraped by Debian's real Prometheus (CTest
python.RunJobScrapedByPrometheus); with --launcher mpirun, the same program started by Open MPI's
`mpirun -np 2` with CHORUS_METRICS_PORT=0 (no chorus agent: rank 0 serves the node's metrics,
runtime/launch/job_observation.h; CTest python.MpirunJobScrapedByPrometheus). The test starts and
stops every server itself.

The job: tests/python/workers/observed.py on `cpu,cpu@0.5/1GiB`, chorus.DataParallel with a
global batch of 48, STEPS steps, its workers holding once done so that the agent still serves
the finished job. Checks through Prometheus's HTTP query API: the target is up; per rank
chorus_steps_total equals the steps run and chorus_step_seconds_count as many observations; the
ranks' devices; the shares sum to the global batch; samples/s > 0; the loss, learning rate,
memory (the budget of the 1 GiB rank) and all-reduce bytes of the job.

Usage: prometheus_run_test.py --chorus BUILD/tools/chorus/chorus [--launcher chorus|mpirun]
Exit: 0 pass, 1 fail.
"""
import argparse
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import script_support  # noqa: E402
from script_support import Failure, free_port  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = 12
GLOBAL_BATCH = 48
LR = 0.05
BUDGET = 1 << 30
# Generous for a loaded 2-core machine; none of them is an assertion on speed.
DEADLINE_S = 120


def get(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


def wait_for(what, predicate):
    return script_support.wait_for(what, predicate, DEADLINE_S)


class Prometheus:
    def __init__(self, workdir, target):
        self.port = free_port()
        config = os.path.join(workdir, "prometheus.yml")
        with open(config, "w") as out:
            out.write(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
                "scrape_configs:\n  - job_name: chorus_run\n    static_configs:\n"
                f"      - targets: ['{target}']\n")
        self.log = open(os.path.join(workdir, "prometheus.log"), "w")
        self.process = subprocess.Popen(
            ["prometheus", f"--config.file={config}",
             f"--storage.tsdb.path={os.path.join(workdir, 'tsdb')}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"

    def query(self, expr):
        answer = json.loads(get(f"{self.url}/api/v1/query?" +
                                urllib.parse.urlencode({"query": expr})))
        if answer["status"] != "success":
            raise Failure(f"query {expr!r}: {answer}")
        return answer["data"]["result"]

    def per_rank(self, expr):
        return {r["metric"]["rank"]: float(r["value"][1]) for r in self.query(expr)}

    def one(self, expr):
        result = self.query(expr)
        if len(result) != 1:
            raise Failure(f"{expr}: {len(result)} series, expected 1: {result}")
        return float(result[0]["value"][1])

    def stop(self):
        self.process.terminate()
        self.process.wait(timeout=30)
        self.log.close()


def start_job(chorus, workdir, hold, launcher):
    log = open(os.path.join(workdir, "run.log"), "w+")
    program = [sys.executable, os.path.join(HERE, "workers", "observed.py"), "--steps", str(STEPS),
               "--global-batch", str(GLOBAL_BATCH), "--lr", str(LR), "--hold", hold,
               "--pause", "0.01"]
    if launcher == "chorus":
        command = [chorus, "run", "--devices", "cpu,cpu@0.5/1GiB", "--metrics-port", "0", "--",
                   *program]
        env = None
    else:
        # As a user starts it: the job's store and secret, the devices by local rank, the port.
        secret = os.path.join(workdir, "job.secret")
        fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(32))
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("CHORUS_", "OMPI_", "PMIX_", "SLURM_"))}
        env.update(CHORUS_RDZV_ENDPOINT=f"127.0.0.1:{free_port()}", CHORUS_SECRET_FILE=secret,
                   CHORUS_DEVICES="cpu,cpu@0.5/1GiB", CHORUS_METRICS_PORT="0")
        command = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
                   "-np", "2"]
        for name in ("CHORUS_RDZV_ENDPOINT", "CHORUS_SECRET_FILE", "CHORUS_DEVICES",
                     "CHORUS_METRICS_PORT", "PYTHONPATH"):
            command += ["-x", name]
        command += program
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                               start_new_session=True)

    def announced_port():
        log.seek(0)
        found = re.search(r"chorus(?: run)?: metrics (?:of node \d+ \(\w+\) )?"
                          r"on http://[^:]+:(\d+)/metrics", log.read())
        if process.poll() is not None:
            log.seek(0)
            raise Failure(f"{launcher} exited with {process.returncode}:\n{log.read()}")
        return int(found.group(1)) if found else None

    port = script_support.wait_for(f"{launcher}'s job to announce its metrics port",
                                   announced_port, DEADLINE_S, give_up_on=(Failure,))
    return process, log, port


def check(prometheus):
    wait_for("the target to be up", lambda: prometheus.query('up{job="chorus_run"} == 1'))
    steps = wait_for(f"chorus_steps_total at {STEPS} on both ranks",
                     lambda: (lambda s: s if s == {"0": STEPS, "1": STEPS} else None)(
                         prometheus.per_rank("chorus_steps_total")))
    observations = prometheus.per_rank("chorus_step_seconds_count")
    devices = {r["metric"]["rank"]: r["metric"]["device"]
               for r in prometheus.query("chorus_rank_info")}
    shares = prometheus.one("sum(chorus_share_samples)")
    samples_per_s = prometheus.one("chorus_samples_per_second")
    loss = prometheus.one("chorus_loss")
    lr = prometheus.one("chorus_learning_rate")
    budget = prometheus.per_rank("chorus_memory_budget_bytes")
    used = prometheus.per_rank("chorus_memory_used_bytes")
    reduced = prometheus.per_rank('chorus_collective_bytes_total{op="all_reduce"}')
    print(f"prometheus: steps {steps}, step observations {observations}, devices {devices}, "
          f"sum of shares {shares:g}, samples/s {samples_per_s:.1f}, loss {loss:.4f}, lr {lr:g}, "
          f"memory used {used}, budget {budget}, all_reduce bytes {reduced}")
    if observations != {"0": STEPS, "1": STEPS}:
        raise Failure(f"chorus_step_seconds_count {observations}, expected {STEPS} per rank")
    if devices != {"0": "cpu", "1": "cpu@0.5/1G"}:  # as DeviceSpec writes it
        raise Failure(f"devices {devices}")
    if shares != GLOBAL_BATCH:
        raise Failure(f"the shares sum to {shares}, not the global batch {GLOBAL_BATCH}")
    if not samples_per_s > 0:
        raise Failure(f"samples/s is {samples_per_s}")
    if not 0.5 < loss < 5:
        raise Failure(f"loss {loss}: not a cross entropy over 5 classes")
    if lr != LR:
        raise Failure(f"learning rate {lr}, expected {LR}")
    if budget != {"1": BUDGET}:
        raise Failure(f"memory budgets {budget}, expected 1 GiB on rank 1 only")
    if sorted(used) != ["0", "1"] or min(used.values()) <= 0:
        raise Failure(f"memory used {used}")
    if sorted(reduced) != ["0", "1"] or min(reduced.values()) <= 0:
        raise Failure(f"all_reduce bytes {reduced}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--chorus", required=True)
    parser.add_argument("--launcher", choices=["chorus", "mpirun"], default="chorus")
    args = parser.parse_args()
    if not shutil.which("prometheus"):
        print("FAIL: prometheus is not installed (scripts/setup installs it)")
        return 1
    workdir = tempfile.mkdtemp(prefix="chorus-run-prometheus-")
    hold = os.path.join(workdir, "hold")
    job = log = prometheus = None
    try:
        if args.launcher == "mpirun" and not shutil.which("mpirun"):
            raise Failure("mpirun is not installed (scripts/setup installs Open MPI)")
        job, log, port = start_job(args.chorus, workdir, hold, args.launcher)
        prometheus = Prometheus(workdir, f"127.0.0.1:{port}")
        check(prometheus)
        open(hold, "w").close()
        code = job.wait(timeout=DEADLINE_S)
        if code != 0:
            raise Failure(f"{args.launcher} exited with {code}")
        print("PASS")
        return 0
    except Failure as failure:
        print(f"FAIL: {failure}")
        if log:
            log.seek(0)
            print(f"{args.launcher}'s output (end):\n" + log.read()[-3000:])
        return 1
    finally:
        open(hold, "w").close()
        if prometheus:
            prometheus.stop()
        if job and job.poll() is None:
            os.killpg(job.pid, signal.SIGTERM)
            try:
                job.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait()
        if log:
            log.close()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
