#!/usr/bin/env python3
"""chorus started by a real Open MPI `mpirun` (docs/deploy.md, "mpirun"): one job, the same
training as `chorus train` started on its own, and bad starts refused at once.

Checks:
  1. `mpirun -np 3 chorus train` (MLP, synthetic data, 20 steps, devices cpu,cpu@0.5,cpu@0.25,
     balance=off, --log-json) exits 0; its log has every step once, 3 ranks whose shares sum to
     the global batch; its losses equal, step by step within 1e-5 relative, those of the same job
     started by `chorus train` itself (its own agent); the output says "3 ranks started by mpirun"
     exactly once (one job, not three).
  2. A device list with one device per rank of a host: `mpirun -np 4` over two hosts as mpirun sees
     them (`-H localhost:2,fakehost2:2`; a stand-in for ssh starts the second host's daemon here)
     with devices cpu@0.5,cpu@0.25 and CHORUS_DEVICES agreeing trains on
     cpu@0.5,cpu@0.25,cpu@0.5,cpu@0.25; CHORUS_DEVICES that disagree with the job's devices are
     refused on every rank (ConfigError, exit 2).
  3. `mpirun -np 2 chorus bench comm` (small sizes, few iterations) exits 0, reports 2 ranks and
     no wrong element.
  4. Bad starts: no CHORUS_RDZV_ENDPOINT, no CHORUS_SECRET_FILE, a secret file that does not exist,
     one that others can read, and `chorus train --metrics-port 0`: every rank exits 2 with the
     documented ConfigError text, well before a deadline (no rank waits for another); a plain
     mpirun of a bad start exits 2.
Every run has a deadline; ports are picked free; the temporary directory is removed; at the end no
process started by the test is left (each carries a marker in its environment, looked for in
/proc/*/environ).

Usage: mpirun_test.py --chorus BUILD/tools/chorus/chorus
Exit: 0 pass, 1 fail, 77 skipped (no mpirun, or an mpirun that is not Open MPI's).
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from script_support import Failure, free_port  # noqa: E402

GLOBAL_BATCH = 48
STEPS = 20
DEVICES = "cpu,cpu@0.5,cpu@0.25"
JOB = [
    "--set", "model.kind=mlp", "--set", "data.dataset=synthetic", "--set", "data.size=1024",
    "--set", f"train.global_batch={GLOBAL_BATCH}", "--set", "balance=off",
    "--set", "train.eval_every=0",
]
BENCH = ["bench", "comm", "--ops", "all_reduce", "-b", "1K", "-e", "16K", "-f", "4", "-w", "1",
         "-n", "3"]
# Generous deadlines for a loaded 2-core machine. A training run takes a few seconds; a refused
# start about two (mpirun's own start); a rank left waiting for another would wait for the
# communication timeout (60 s), so the refusals' deadline is below it.
TRAIN_DEADLINE_S = 120
REFUSAL_DEADLINE_S = 45
RELATIVE_TOLERANCE = 1e-5
MARK_VARIABLE = "CHORUS_MPIRUN_TEST_MARK"
CONFIG_ERROR_EXIT = 2

# Writes one rank's output and exit code to files of its own and exits 0, so that mpirun does not
# stop the other ranks when one fails and every rank's own exit code can be checked.
RANK_WRAPPER = """#!/bin/sh
out="$CHORUS_MPIRUN_TEST_OUT/rank$OMPI_COMM_WORLD_RANK"
"$@" >"$out.log" 2>&1
echo $? >"$out.rc"
exit 0
"""
# A stand-in for ssh (mpirun's plm_rsh_agent): starts the "remote" host's daemon here, so that
# mpirun lays the ranks out over two hosts (its own local ranks and sizes) on one machine.
FAKE_SSH = """#!/bin/sh
shift
exec sh -c "$*"
"""


def marked_pids(mark):
    """Processes whose environment carries this run's marker (the test's own children)."""
    pids = []
    needle = f"{MARK_VARIABLE}={mark}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    pids.append(int(entry))
        except OSError:  # gone meanwhile, or not ours to read
            pass
    return pids


def kill_marked(mark):
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = marked_pids(mark)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        if pids:
            time.sleep(2)


class Runner:
    def __init__(self, chorus, workdir):
        self.chorus = chorus
        self.workdir = workdir
        self.mark = uuid.uuid4().hex
        self.runs = 0
        self.outputs = 0
        # A clean environment: no launcher or chorus variables of whoever started the test.
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("CHORUS_", "OMPI_", "PMIX_", "SLURM_", "TORCHELASTIC_"))
                    and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
        self.env[MARK_VARIABLE] = self.mark
        self.secret = os.path.join(workdir, "secret")
        fd = os.open(self.secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(os.urandom(32).hex() + "\n")
        self.wrapper = self.script("rank.sh", RANK_WRAPPER)
        self.fake_ssh = self.script("fake_ssh.sh", FAKE_SSH)

    def script(self, name, text):
        path = os.path.join(self.workdir, name)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, 0o700)
        return path

    def mpirun(self, np, variables, args, per_rank=False, mpirun_options=(),
               deadline_s=TRAIN_DEADLINE_S):
        """Runs `mpirun -np NP [-x NAME=VALUE]... chorus ARGS`. Returns (exit code, output, wall s,
        rank outputs and exit codes when per_rank)."""
        self.runs += 1
        rank_dir = os.path.join(self.workdir, f"ranks{self.runs}")
        os.mkdir(rank_dir)
        command = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
                   "-np", str(np), *mpirun_options]
        for name, value in variables.items():
            command += ["-x", f"{name}={value}"]
        if per_rank:
            command += ["-x", f"CHORUS_MPIRUN_TEST_OUT={rank_dir}", self.wrapper]
        command += [self.chorus, *args]
        code, output, wall = self.run(command, deadline_s)
        ranks = {}
        if per_rank:
            for rank in range(np):
                log = os.path.join(rank_dir, f"rank{rank}.log")
                rc = os.path.join(rank_dir, f"rank{rank}.rc")
                text = open(log).read() if os.path.exists(log) else None
                status = int(open(rc).read()) if os.path.exists(rc) else None
                ranks[rank] = (status, text)
        return code, output, wall, ranks

    def train_alone(self, args, deadline_s=TRAIN_DEADLINE_S):
        """`chorus train ARGS` started by itself: its own agent and workers."""
        return self.run([self.chorus, "train", *args], deadline_s)

    def run(self, command, deadline_s):
        self.outputs += 1
        out_path = os.path.join(self.workdir, f"output{self.outputs}")
        with open(out_path, "w+") as out:
            start = time.monotonic()
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, env=self.env, cwd=self.workdir,
                                       start_new_session=True)
            try:
                code = process.wait(timeout=deadline_s)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                kill_marked(self.mark)
                out.seek(0)
                raise Failure(f"`{' '.join(command)}` did not end within {deadline_s} s (a hang); "
                              f"its output:\n{out.read()[-4000:]}")
            wall = time.monotonic() - start
            out.seek(0)
            output = out.read()
        self.check_no_processes_left(" ".join(command[:8]) + " ...")
        return code, output, wall

    def check_no_processes_left(self, what):
        deadline = time.monotonic() + 15
        while marked_pids(self.mark) and time.monotonic() < deadline:
            time.sleep(0.25)
        left = marked_pids(self.mark)
        if left:
            described = []
            for pid in left:
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
                    described.append(f"{pid}: {cmdline}")
                except OSError:
                    described.append(str(pid))
            kill_marked(self.mark)
            raise Failure(f"processes left after `{what}` ended:\n  " + "\n  ".join(described))

    def store(self):
        return {"CHORUS_RDZV_ENDPOINT": f"127.0.0.1:{free_port()}",
                "CHORUS_SECRET_FILE": self.secret}


def read_log(path, what):
    if not os.path.exists(path):
        raise Failure(f"{what}: no --log-json file {path}")
    with open(path) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    steps = [line for line in lines if "step" in line and "loss" in line]
    return steps


def expect(condition, message):
    if not condition:
        raise Failure(message)


def check_steps(steps, what, ranks, count):
    numbers = [s["step"] for s in steps]
    expect(numbers == list(range(1, count + 1)),
           f"{what}: the log's steps are {numbers}, expected 1..{count} once each "
           "(several jobs writing one log would repeat them)")
    for s in steps:
        expect(len(s["shares"]) == ranks and len(s["compute_s"]) == ranks,
               f"{what}: step {s['step']} has shares {s['shares']}, expected {ranks} ranks")
        expect(sum(s["shares"]) == GLOBAL_BATCH,
               f"{what}: step {s['step']}: shares {s['shares']} sum to {sum(s['shares'])}, "
               f"not the global batch {GLOBAL_BATCH}")


def check_train_equals_chorus(runner):
    log = os.path.join(runner.workdir, "mpirun.jsonl")
    args = ["train", "--set", f"devices={DEVICES}", *JOB, "--steps", str(STEPS), "--log-json", log]
    code, output, wall, _ = runner.mpirun(3, runner.store(), args)
    expect(code == 0, f"mpirun -np 3 chorus train exited {code}:\n{output[-4000:]}")
    announced = output.count("3 ranks started by mpirun")
    expect(announced == 1, f"the output says '3 ranks started by mpirun' {announced} times, expected "
                           f"once (one job):\n{output[-4000:]}")
    expect("chorus run:" not in output, f"an agent ran under mpirun:\n{output[-4000:]}")
    steps = read_log(log, "mpirun -np 3 chorus train")
    check_steps(steps, "mpirun -np 3 chorus train", 3, STEPS)

    reference_log = os.path.join(runner.workdir, "alone.jsonl")
    code, alone_output, alone_wall = runner.train_alone(
        ["--set", f"devices={DEVICES}", *JOB, "--steps", str(STEPS), "--log-json", reference_log])
    expect(code == 0, f"chorus train (its own agent) exited {code}:\n{alone_output[-4000:]}")
    expect("started by" not in alone_output,
           f"chorus train alone thought a launcher started it:\n{alone_output[-4000:]}")
    reference = read_log(reference_log, "chorus train (its own agent)")
    check_steps(reference, "chorus train (its own agent)", 3, STEPS)
    worst = 0.0
    for ours, theirs in zip(steps, reference):
        difference = abs(ours["loss"] - theirs["loss"]) / max(abs(theirs["loss"]), 1e-12)
        worst = max(worst, difference)
        expect(difference <= RELATIVE_TOLERANCE,
               f"step {ours['step']}: loss {ours['loss']!r} under mpirun, {theirs['loss']!r} under "
               f"chorus train's own agent (relative difference {difference:.3g} > "
               f"{RELATIVE_TOLERANCE})")
    print(f"train: mpirun -np 3 ({wall:.1f} s) and chorus train alone ({alone_wall:.1f} s): "
          f"{STEPS} steps, shares {steps[0]['shares']}, losses {steps[0]['loss']:.4f} -> "
          f"{steps[-1]['loss']:.4f}, largest relative difference {worst:.2g}")


def check_devices_per_host(runner):
    log = os.path.join(runner.workdir, "hosts.jsonl")
    variables = {**runner.store(), "CHORUS_DEVICES": "cpu@0.5,cpu@0.25"}
    options = ["-H", "localhost:2,fakehost2:2", "--mca", "plm_rsh_agent", runner.fake_ssh]
    args = ["train", "--set", "devices=cpu@0.5,cpu@0.25", *JOB, "--steps", "3", "--log-json", log]
    code, output, wall, _ = runner.mpirun(4, variables, args, mpirun_options=options)
    expect(code == 0, f"mpirun -np 4 over two hosts exited {code}:\n{output[-4000:]}")
    plan = "4 ranks started by mpirun; plan: data parallel on cpu@0.5, cpu@0.25, cpu@0.5, cpu@0.25"
    expect(output.count(plan) == 1, f"expected the line '{plan}' once:\n{output[-4000:]}")
    check_steps(read_log(log, "mpirun -np 4 over two hosts"), "mpirun -np 4 over two hosts", 4, 3)
    print(f"devices per host: -np 4 on 2 hosts (-H localhost:2,fakehost2:2) trained on "
          f"cpu@0.5, cpu@0.25, cpu@0.5, cpu@0.25 ({wall:.1f} s)")

    variables = {**runner.store(), "CHORUS_DEVICES": "cpu@0.25,cpu@0.5"}
    args = ["train", "--set", "devices=cpu@0.5,cpu@0.25", *JOB, "--steps", "3"]
    check_refused(runner, "CHORUS_DEVICES disagreeing with the job's devices", variables, args, {
        0: "ConfigError: rank 0: the environment names device cpu@0.25 (CHORUS_DEVICE/"
           "CHORUS_DEVICES) but the job's devices give it cpu@0.5; chorus train takes the job's",
        1: "ConfigError: rank 1: the environment names device cpu@0.5 (CHORUS_DEVICE/"
           "CHORUS_DEVICES) but the job's devices give it cpu@0.25; chorus train takes the job's",
    })


def check_bench(runner):
    code, output, wall, _ = runner.mpirun(2, runner.store(), BENCH)
    expect(code == 0, f"mpirun -np 2 chorus bench comm exited {code}:\n{output[-4000:]}")
    expect(output.count("# chorus bench comm: 2 ranks") == 1,
           f"chorus bench comm did not report 2 ranks once:\n{output[-4000:]}")
    rows = [line.split() for line in output.splitlines() if re.match(r"\s+(gloo|shm)\s", line)]
    expect(len(rows) == 6, f"expected 6 rows (gloo and shm, 3 sizes), got {len(rows)}:\n{output}")
    wrong = [row for row in rows if row[-1] != "0"]
    expect(not wrong, f"rows with wrong elements: {wrong}")
    print(f"bench: mpirun -np 2 chorus bench comm: 2 ranks, {len(rows)} rows, none wrong "
          f"({wall:.1f} s)")


def check_refused(runner, what, variables, args, expected, np=2):
    """Every rank of `mpirun -np NP chorus ARGS` exits 2 with its expected text (one for all ranks,
    or a dict rank -> text), within the refusals' deadline."""
    code, output, wall, ranks = runner.mpirun(np, variables, args, per_rank=True,
                                              deadline_s=REFUSAL_DEADLINE_S)
    expect(code == 0, f"{what}: mpirun exited {code} although the rank wrapper exits 0:\n{output}")
    for rank, (status, text) in ranks.items():
        want = expected[rank] if isinstance(expected, dict) else expected
        expect(status == CONFIG_ERROR_EXIT,
               f"{what}: rank {rank} exited {status}, expected {CONFIG_ERROR_EXIT} (ConfigError); "
               f"its output:\n{text}")
        expect(want in text, f"{what}: rank {rank} did not say '{want}'; its output:\n{text}")
    print(f"refused: {what}: all {np} ranks exit {CONFIG_ERROR_EXIT} in {wall:.1f} s")


def check_bad_starts(runner):
    args = ["train", "--set", "devices=cpu", *JOB, "--steps", "3"]
    secret_only = {"CHORUS_SECRET_FILE": runner.secret}
    endpoint_only = {"CHORUS_RDZV_ENDPOINT": f"127.0.0.1:{free_port()}"}
    check_refused(runner, "no CHORUS_RDZV_ENDPOINT", secret_only, args,
                  "ConfigError: worker identity: a job of 2 workers needs the rendezvous endpoint "
                  "in CHORUS_RDZV_ENDPOINT")
    check_refused(runner, "no CHORUS_SECRET_FILE", endpoint_only, args,
                  "ConfigError: worker identity: the job secret is missing (CHORUS_SECRET_FILE "
                  "names a mode-600 file holding it")
    missing = os.path.join(runner.workdir, "no-such-secret")
    check_refused(runner, "a secret file that does not exist",
                  {**endpoint_only, "CHORUS_SECRET_FILE": missing}, args,
                  f"ConfigError: cannot read the job secret file {missing}: No such file")
    readable = os.path.join(runner.workdir, "readable-secret")
    shutil.copy(runner.secret, readable)
    os.chmod(readable, 0o644)
    check_refused(runner, "a secret file that others can read",
                  {**endpoint_only, "CHORUS_SECRET_FILE": readable}, args,
                  f"ConfigError: the job secret file {readable} is accessible by group or others "
                  "(mode 0644)")
    check_refused(runner, "chorus train --metrics-port 0", runner.store(),
                  [*args, "--metrics-port", "0"],
                  "ConfigError: --metrics-port: the metrics are served by chorus's node agent, "
                  "which does not run here (this rank was started by mpirun)")
    # What a user sees: mpirun itself fails with the ranks' exit code.
    code, output, wall, _ = runner.mpirun(2, secret_only, args, deadline_s=REFUSAL_DEADLINE_S)
    expect(code == CONFIG_ERROR_EXIT and "needs the rendezvous endpoint" in output,
           f"plain mpirun without CHORUS_RDZV_ENDPOINT exited {code}, expected "
           f"{CONFIG_ERROR_EXIT}:\n{output}")
    print(f"refused: plain mpirun without CHORUS_RDZV_ENDPOINT exits {code} in {wall:.1f} s")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--chorus", required=True)
    args = parser.parse_args()
    if not shutil.which("mpirun"):
        print("SKIP: mpirun is not installed (scripts/setup installs Open MPI)")
        return 77
    version = subprocess.run(["mpirun", "--version"], capture_output=True, text=True, timeout=60)
    if "Open MPI" not in version.stdout + version.stderr:
        print("SKIP: this mpirun is not Open MPI's (chorus reads OMPI_COMM_WORLD_*): "
              + (version.stdout + version.stderr).strip().splitlines()[0])
        return 77
    chorus = os.path.abspath(args.chorus)
    start = time.monotonic()
    workdir = tempfile.mkdtemp(prefix="chorus-mpirun-")
    runner = None
    try:
        runner = Runner(chorus, workdir)
        check_train_equals_chorus(runner)
        check_devices_per_host(runner)
        check_bench(runner)
        check_bad_starts(runner)
        runner.check_no_processes_left("the test")
        print(f"PASS ({time.monotonic() - start:.0f} s)")
        return 0
    except Failure as failure:
        print(f"FAIL: {failure}")
        return 1
    finally:
        if runner:
            kill_marked(runner.mark)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
