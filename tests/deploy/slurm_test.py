#!/usr/bin/env python3
"""A real local Slurm (Debian's slurm-wlm) runs examples/slurm/train.sbatch: `sbatch` submits it,
its `srun` starts one `chorus train` per task, and `scancel` stops a running job cleanly. The test
starts its own munged (its own key and socket), slurmctld and slurmd (a slurm.conf it writes for
this host, on free ports, state in a temporary dir) and stops them again, whatever happens.

Checks, job 1 (3 tasks on one node, devices cpu/1G, cpu@0.5/768M, cpu@0.25/512M, 30 steps of an
MLP on synthetic data): the job completes; srun started exactly 3 ranks: task N (srun's label,
SLURM_PROCID N) logs "[rank N] memory budget" of the N-th device, and rank 0 says "3 ranks started
by srun" with a plan on the three devices in rank order; rank 0's --log-json log has 30 steps, 3
shares per step summing to the global batch, every loss finite and the last one below half the
first; the job's secret file is gone afterwards.

Job 2 (the same job, endless, with checkpoint.dir): while it runs, the job's processes are exactly
3 `chorus train`, SLURM_PROCID 0, 1, 2, each a child of the step's slurmstepd (no agent, no
workers of their own). A plain `scancel` then stops it: Slurm's SIGTERM reaches every rank, every
rank exits 0 (srun reports none ended otherwise), rank 0 reports "stopped on request after step
S" and a checkpoint of step S (MANIFEST of world size 3, one rank-N.pt per rank, `latest` naming
it), the job left the queue well before Slurm's KillWait would have sent SIGKILL, and no process
of the job survives.

Exit codes: 0 pass, 1 fail, 77 skip (not root, Slurm or munge missing, the host name does not
resolve).

Usage: slurm_test.py --chorus BUILD/tools/chorus/chorus [--keep]   (--keep: keep the temporary dir)
"""
import argparse
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import script_support  # noqa: E402
from script_support import Failure, Skip  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(REPO, "examples", "slurm", "train.sbatch")
TOOLS = ["munged", "slurmctld", "slurmd", "slurmstepd", "sbatch", "srun", "squeue", "scancel",
         "sinfo", "scontrol"]

TASKS = 3
# Unlike budgets, so that each rank's log line tells which device it took.
DEVICES = ["cpu/1G", "cpu@0.5/768M", "cpu@0.25/512M"]  # as chorus writes them back
BUDGETS = ["1 GiB", "768 MiB", "512 MiB"]
GLOBAL_BATCH = 48
STEPS = 30
JOB = [
    "--set", "model.kind=mlp", "--set", "data.dataset=synthetic", "--set", "data.size=2048",
    "--set", f"train.global_batch={GLOBAL_BATCH}", "--set", "train.eval_every=0",
    "--set", "train.log_every=10",
]
# Slurm's SIGTERM-to-SIGKILL interval on scancel: the ranks must be done well within it.
KILL_WAIT_S = 30
# Generous deadlines for a loaded 2-core machine; none of them is an assertion on speed.
DEADLINE_S = 90


def free_port():
    return script_support.free_port(host="")


# A Failure of the predicate's own ends the wait; any other exception is a daemon still starting.
def wait_for(what, predicate, deadline_s=DEADLINE_S, interval=0.25):
    return script_support.wait_for(what, predicate, deadline_s, interval, give_up_on=(Failure,))


def read_file(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def tail(path, chars=3000):
    return read_file(path)[-chars:]


def check_can_run():
    if os.geteuid() != 0:
        raise Skip("not root: the test runs a munged, slurmctld and slurmd of its own, as root")
    missing = [tool for tool in TOOLS if not shutil.which(tool)]
    if missing:
        raise Skip(f"not installed: {', '.join(missing)} (scripts/setup installs slurm-wlm, munge)")
    host = socket.gethostname().split(".")[0]
    try:
        socket.gethostbyname(host)
    except OSError:
        raise Skip(f"this host's name {host!r} does not resolve; Slurm names nodes by host name")
    return host


# --- processes of the test's own Slurm (told apart from everything else by SLURM_CONF) ---

def environ_of(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            entries = f.read().split(b"\0")
    except OSError:
        return {}
    pairs = (e.decode(errors="replace").split("=", 1) for e in entries if b"=" in e)
    return dict(pairs)


def cmdline_of(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def parent_of(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            # The command may hold spaces and parentheses: the fields follow the last ')'.
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def alive(pid):
    """Running, not a zombie waiting for its parent."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def processes_under(conf):
    """pid -> environment of every live process started under this slurm.conf: slurmstepd (slurmd
    sets SLURM_CONF for it) and everything of the jobs (sbatch passes the submitter's SLURM_CONF)."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            environment = environ_of(int(entry))
            if environment.get("SLURM_CONF") == conf and alive(int(entry)):
                found[int(entry)] = environment
    return found


def stop_process(process, name):
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        print(f"teardown: {name} ignored SIGTERM for 15 s; SIGKILL")
        process.kill()
        process.wait()


# --- munge and Slurm of the test's own ---

class Munge:
    """munged in the foreground with a key and a socket of its own (not /etc/munge)."""

    def __init__(self, workdir):
        key_dir = os.path.join(workdir, "munge-key")  # munged wants the key readable by root only
        run_dir = os.path.join(workdir, "munge-run")  # and the socket's dirs searchable by all
        os.mkdir(key_dir, 0o700)
        os.mkdir(run_dir, 0o755)
        self.key = os.path.join(key_dir, "munge.key")
        with open(os.open(self.key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
            f.write(os.urandom(1024))  # what `mungekey` or `dd if=/dev/urandom` would write
        self.socket = os.path.join(run_dir, "munge.socket")
        self.pid_file = os.path.join(run_dir, "munged.pid")
        self.seed_file = os.path.join(workdir, "munged.seed")
        self.log_path = os.path.join(workdir, "munged.log")
        self.out_path = os.path.join(workdir, "munged.out")  # in the foreground it logs here
        self.out = open(self.out_path, "w")
        self.process = None

    def start(self):
        self.process = subprocess.Popen(
            ["munged", "--foreground", f"--socket={self.socket}", f"--key-file={self.key}",
             f"--pid-file={self.pid_file}", f"--log-file={self.log_path}",
             f"--seed-file={self.seed_file}"],
            stdout=self.out, stderr=subprocess.STDOUT)
        wait_for("munged's socket", self.ready, deadline_s=30)

    def ready(self):
        if self.process.poll() is not None:
            raise Failure(f"munged exited with {self.process.returncode}:\n{tail(self.out_path)}")
        return os.path.exists(self.socket)

    def stop(self):
        if self.process:
            stop_process(self.process, "munged")
        self.out.close()


SLURM_CONF = """\
# Written by tests/deploy/slurm_test.py: one node (this host), no systemd, no cgroups.
ClusterName=choruslocal
SlurmctldHost={host}
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
AuthInfo=socket={munge_socket}
CredType=cred/munge
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
# An empty plug-in stack: nothing of /etc/slurm.
PlugStackConfig={dir}/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
KillWait={kill_wait}
NodeName={host} CPUs={cpus} RealMemory=1000 State=UNKNOWN
PartitionName=local Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


class Slurm:
    """slurmctld and slurmd as child processes (-D), on free ports, with a conf of this test."""

    def __init__(self, workdir, host, munge_socket):
        self.dir = os.path.join(workdir, "slurm")
        for sub in ("", "state", "spool"):
            os.makedirs(os.path.join(self.dir, sub), exist_ok=True)
        open(os.path.join(self.dir, "plugstack.conf"), "w").close()
        self.conf = os.path.join(self.dir, "slurm.conf")
        with open(self.conf, "w") as f:
            f.write(SLURM_CONF.format(host=host, ctld_port=free_port(), slurmd_port=free_port(),
                                      munge_socket=munge_socket, dir=self.dir,
                                      kill_wait=KILL_WAIT_S,
                                      cpus=len(os.sched_getaffinity(0))))  # nproc
        self.host = host
        self.env = dict(os.environ, SLURM_CONF=self.conf)
        self.daemons = []

    def start(self):
        for daemon in ("slurmctld", "slurmd"):
            out = open(os.path.join(self.dir, f"{daemon}.out"), "w")
            process = subprocess.Popen([daemon, "-D", "-f", self.conf], env=self.env, stdout=out,
                                       stderr=subprocess.STDOUT)
            self.daemons.append((daemon, process, out))
        wait_for(f"sinfo to show {self.host} idle", self.node_idle)

    def node_idle(self):
        for name, process, _ in self.daemons:
            if process.poll() is not None:
                raise Failure(f"{name} exited with {process.returncode}:\n{self.logs()}")
        return self.run(["sinfo", "-h", "-n", self.host, "-o", "%T"]).strip() == "idle"

    def run(self, command, **kwargs):
        done = subprocess.run(command, env=kwargs.pop("env", self.env), capture_output=True,
                              text=True, timeout=60, **kwargs)
        if done.returncode != 0:
            raise Failure(f"{' '.join(command)} exited with {done.returncode}: {done.stderr}")
        return done.stdout

    def job_state(self, job):
        found = re.search(r"JobState=(\S+)", self.run(["scontrol", "show", "job", job]))
        return found.group(1) if found else "?"

    def queued(self, job):
        return self.run(["squeue", "-h", "-j", job, "-o", "%i"]).strip() != ""

    def logs(self):
        return "\n".join(f"--- {name}:\n{tail(os.path.join(self.dir, name), 1500)}"
                         for name in ("slurmctld.log", "slurmd.log", "slurmctld.out", "slurmd.out"))

    def stop(self):
        """Cancels what still runs, stops the daemons, and kills whatever of the jobs is left."""
        if self.daemons and self.daemons[0][1].poll() is None:
            self.drain()
        for name, process, out in reversed(self.daemons):
            stop_process(process, name)
            out.close()
        # slurmstepd outlives slurmd by design; nothing of this test may outlive the test.
        for pid in processes_under(self.conf):
            print(f"teardown: killing left-over {' '.join(cmdline_of(pid))[:80]} (pid {pid})")
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def drain(self):
        try:
            for job in self.run(["squeue", "-h", "-o", "%i"]).split():
                self.run(["scancel", job])
            wait_for("the queue to empty", lambda: not self.run(["squeue", "-h"]).strip(),
                     deadline_s=KILL_WAIT_S + 15)
        except Exception as error:
            print(f"teardown: could not drain the queue: {error}")


# --- the jobs ---

def submit(slurm, workdir, chorus, name, train_args):
    """sbatch examples/slurm/train.sbatch with the test's chorus, devices, rendezvous port and
    secret dir; --overcommit because this host may have fewer cores than the job has tasks."""
    env = dict(slurm.env, CHORUS=chorus, DEVICES=",".join(DEVICES),
               CHORUS_RDZV_PORT=str(free_port()),
               CHORUS_SECRET_DIR=os.path.join(workdir, "secrets"))
    output = os.path.join(workdir, f"{name}.out")
    submitted = slurm.run(
        ["sbatch", "--parsable", "--overcommit", f"--ntasks={TASKS}", f"--job-name={name}",
         f"--output={output}", f"--chdir={workdir}", EXAMPLE, *JOB, *train_args], env=env)
    job = submitted.strip().split(";")[0]
    print(f"{name}: submitted as job {job}")
    return job, output


def task_lines(text):
    """srun --label's lines: (task, line)."""
    return [(int(m.group(1)), m.group(2)) for m in re.finditer(r"^\s*(\d+): (.*)$", text, re.M)]


def check_tasks(text):
    """Task N (srun's label, its SLURM_PROCID) trained as rank N of TASKS on the N-th device: it
    logs the memory budget of that device under its rank, and the ranks' gathered plan lists the
    devices in rank order."""
    budgets = {}
    for task, line in task_lines(text):
        found = re.search(r"\[rank (\d+)\] memory budget (\d+ \w+):", line)
        if found:
            budgets.setdefault(task, []).append((int(found.group(1)), found.group(2)))
    expected = {n: [(n, BUDGETS[n])] for n in range(TASKS)}
    if budgets != expected:
        raise Failure(f"tasks' ranks and budgets {budgets}, expected {expected}")
    started = re.search(r"^0: chorus train: (\d+) ranks started by (\w+); plan: data parallel on "
                        r"([^:]+):", text, re.M)
    if not started or started.groups() != (str(TASKS), "srun", ", ".join(DEVICES)):
        raise Failure(f"rank 0's plan line: {started and started.group(0)}, expected {TASKS} "
                      f"ranks started by srun on {', '.join(DEVICES)}")
    if not re.search(rf"world: {TASKS} ranks", text):
        raise Failure(f"no 'world: {TASKS} ranks' in the job's output")


def read_log(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def check_training(log_path):
    steps = read_log(log_path)
    if [s["step"] for s in steps] != list(range(1, STEPS + 1)):
        raise Failure(f"{log_path}: steps {[s['step'] for s in steps]}, expected 1..{STEPS}")
    for s in steps:
        if len(s["shares"]) != TASKS or sum(s["shares"]) != GLOBAL_BATCH:
            raise Failure(f"step {s['step']}: shares {s['shares']}, expected {TASKS} summing to "
                          f"{GLOBAL_BATCH}")
        if not math.isfinite(s["loss"]):
            raise Failure(f"step {s['step']}: loss {s['loss']}")
    first, last = steps[0]["loss"], steps[-1]["loss"]
    if not last < 0.5 * first:
        raise Failure(f"the loss did not fall: {first:.4f} at step 1, {last:.4f} at step {STEPS}")
    print(f"train: {STEPS} steps, loss {first:.4f} -> {last:.4f}, shares at the end "
          f"{steps[-1]['shares']} (sum {GLOBAL_BATCH})")


def run_training_job(slurm, workdir, chorus):
    log_path = os.path.join(workdir, "train.jsonl")
    started = time.monotonic()
    job, output = submit(slurm, workdir, chorus, "train",
                         ["--steps", str(STEPS), "--log-json", log_path])
    wait_for(f"job {job} to finish", lambda: not slurm.queued(job))
    state = slurm.job_state(job)
    text = read_file(output)
    print(f"train: job {job} {state} in {time.monotonic() - started:.1f} s")
    if state != "COMPLETED":
        raise Failure(f"job {job} ended {state} (its output follows)")
    check_tasks(text)
    check_training(log_path)
    left = os.listdir(os.path.join(workdir, "secrets"))
    if left:
        raise Failure(f"the job's secret file was left behind: {left}")


def job_processes(slurm, job):
    """pid -> environment of each `chorus train` process of the job."""
    return {pid: environment for pid, environment in processes_under(slurm.conf).items()
            if environment.get("SLURM_JOB_ID") == job and cmdline_of(pid)[1:2] == ["train"]}


def check_job_processes(slurm, job):
    """srun started TASKS chorus processes, one per SLURM_PROCID, straight under the step's
    slurmstepd (the example's task() execs chorus), none of them an agent's worker, each with the
    bind address task() found."""
    ranks = job_processes(slurm, job)
    procids = sorted(int(e["SLURM_PROCID"]) for e in ranks.values())
    if procids != list(range(TASKS)):
        raise Failure(f"chorus processes of SLURM_PROCID {procids}, expected 0..{TASKS - 1}")
    for pid, environment in ranks.items():
        parent = " ".join(cmdline_of(parent_of(pid)))
        if environment.get("SLURM_NTASKS") != str(TASKS) or f"[{job}.0]" not in parent:
            raise Failure(f"chorus process {pid}: SLURM_NTASKS {environment.get('SLURM_NTASKS')}, "
                          f"parent {parent!r}, expected {TASKS} and slurmstepd [{job}.0]")
        if "--worker" in cmdline_of(pid):
            raise Failure(f"chorus process {pid} is an agent's worker: {cmdline_of(pid)}")
    print(f"scancel: job {job} runs {TASKS} chorus processes (SLURM_PROCID 0..{TASKS - 1}) "
          f"under slurmstepd [{job}.0]")
    return set(ranks)


def check_checkpoint(checkpoint_dir, step):
    name = f"step-{step:08d}"
    latest = read_file(os.path.join(checkpoint_dir, "latest")).strip()
    if latest != name:
        raise Failure(f"{checkpoint_dir}/latest names {latest!r}, expected {name}")
    with open(os.path.join(checkpoint_dir, name, "MANIFEST.json")) as f:
        manifest = json.load(f)
    files = {entry["name"] for entry in manifest["files"]}
    ranks = {f"rank-{rank}.pt" for rank in range(TASKS)}
    if manifest["step"] != step or manifest["world_size"] != TASKS or not ranks <= files:
        raise Failure(f"{name}/MANIFEST.json: step {manifest['step']}, world size "
                      f"{manifest['world_size']}, files {sorted(files)}")


def check_stop(text, job):
    """Every rank exited 0 (srun names each task that ended otherwise: a non-zero exit, or killed
    by a signal), and rank 0 says the ranks stopped on request and where the checkpoint went."""
    unclean = re.findall(r"^srun: error: .*task.*$", text, re.M)
    if unclean:
        raise Failure(f"not every rank of job {job} stopped cleanly: {unclean}")
    stopped = re.search(r"stopped on request after step (\d+)", text)
    written = re.search(r"checkpoint: (\S+)", text)
    if not stopped or not written:
        raise Failure(f"no 'stopped on request' and 'checkpoint:' in the output of job {job}")
    return int(stopped.group(1)), written.group(1)


def run_cancelled_job(slurm, workdir, chorus):
    log_path = os.path.join(workdir, "cancelled.jsonl")
    checkpoint_dir = os.path.join(workdir, "checkpoints")
    job, output = submit(slurm, workdir, chorus, "cancelled",
                         ["--steps", "100000000", "--set", f"checkpoint.dir={checkpoint_dir}",
                          "--log-json", log_path])

    def steps_logged():
        if not slurm.queued(job):
            raise Failure(f"job {job} ended before it was cancelled (its output follows)")
        return len(read_file(log_path).splitlines()) >= 20
    wait_for(f"job {job} to train 20 steps", steps_logged)
    pids = check_job_processes(slurm, job)
    before = len(read_file(log_path).splitlines())
    cancelled = time.monotonic()
    slurm.run(["scancel", job])  # what a user types: SIGTERM to every step, SIGKILL KillWait later
    wait_for(f"job {job} to leave the queue", lambda: not slurm.queued(job),
             deadline_s=KILL_WAIT_S + 30, interval=0.1)
    took = time.monotonic() - cancelled
    text = read_file(output)
    state = slurm.job_state(job)
    print(f"scancel: job {job} {state} and gone from the queue {took:.1f} s after scancel")
    if state != "CANCELLED":
        raise Failure(f"job {job} ended {state}, not CANCELLED (its output follows)")
    if took >= KILL_WAIT_S:
        raise Failure(f"job {job} took {took:.1f} s to stop: Slurm's SIGKILL (KillWait) ended it")
    step, path = check_stop(text, job)
    if path != os.path.join(checkpoint_dir, f"step-{step:08d}") or step < before:
        raise Failure(f"checkpoint {path} of step {step}, after {before} steps logged")
    check_checkpoint(checkpoint_dir, step)
    survivors = {pid for pid in pids if alive(pid)} | set(job_processes(slurm, job))
    if survivors:
        raise Failure(f"processes of job {job} survived: {survivors}")
    print(f"scancel: stopped after step {step}, checkpoint {os.path.basename(path)} of "
          f"{TASKS} ranks, no process left")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chorus", required=True)
    parser.add_argument("--keep", action="store_true", help="keep the temporary dir")
    args = parser.parse_args()
    try:
        host = check_can_run()
    except Skip as reason:
        print(f"SKIP: {reason}")
        return 77
    chorus = os.path.abspath(args.chorus)
    started = time.monotonic()
    # Searchable by all: munged checks every directory above its socket.
    workdir = tempfile.mkdtemp(prefix="chorus-slurm-")
    os.chmod(workdir, 0o755)
    munge = slurm = None
    try:
        munge = Munge(workdir)
        munge.start()
        slurm = Slurm(workdir, host, munge.socket)
        slurm.start()
        print(f"slurm: {host} idle after {time.monotonic() - started:.1f} s ({slurm.conf})")
        run_training_job(slurm, workdir, chorus)
        run_cancelled_job(slurm, workdir, chorus)
        print(f"PASS in {time.monotonic() - started:.1f} s")
        return 0
    except (Failure, subprocess.TimeoutExpired) as failure:
        print(f"FAIL: {failure}")
        for job_output in ("train.out", "cancelled.out"):
            if os.path.exists(os.path.join(workdir, job_output)):
                print(f"--- {job_output} (end):\n{tail(os.path.join(workdir, job_output))}")
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
