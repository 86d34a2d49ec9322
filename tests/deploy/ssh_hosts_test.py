#!/usr/bin/env python3
"""`chorus train -H` and `chorus run -H` start a job on two hosts over real ssh.

The two hosts are network namespaces joined by a bridge (scripts/netns_hosts, each with its own
hostname), each running Debian's OpenSSH server, which this test starts with its own host key,
authorized key and configuration, and stops at the end. The launcher runs inside host 0, as on a
login node that is also the first compute node, and reaches both hosts by address.

Checks:
- `chorus train -H 10.77.0.1:2,10.77.0.2:2` (MLP, synthetic data, balance=off) exits 0 with four
  ranks on two nodes, and its per-step losses equal those of the same job run by one `chorus
  train` with four local workers (1e-5 relative): the launch path does not change the math;
- while a job runs, the remote agents were started with --secret-stdin and no process on the
  machine has a job secret (64 hex digits) on its command line;
- SIGINT to the launcher stops every node: it exits 130 and no process of the job is left;
- a host that cannot be reached fails the job quickly (exit 3, the host named), nothing left;
- `chorus run -H 10.77.0.1:1,10.77.0.2:2 -- sh -c ...` runs three workers on the two hosts with
  the right ranks and host names.

Exits 77 (skipped) when not root or without ip netns, sshd or ssh-keygen.
Usage: ssh_hosts_test.py --chorus BUILD/chorus
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from script_support import (  # noqa: E402
    NETNS, Failure, chorus_argument, in_netns_host, netns_skip_reason, skip_if)

PREFIX = f"cssh{os.getpid() % 100000}"
HOSTS = ["10.77.0.1", "10.77.0.2"]
JOB = [
    "--set", "model.kind=mlp", "--set", "data.dataset=synthetic", "--set", "data.size=1024",
    "--set", "train.global_batch=48", "--set", "balance=off", "--set", "train.eval_every=0",
    "--set", "seed=7",
]
STEPS = 8
# Generous for a loaded 2-core machine; none of them is an assertion on speed.
DEADLINE_S = 120


def skip_reason():
    return netns_skip_reason(needs="network namespaces, sshd",
                             tools=("ip", "/usr/sbin/sshd", "ssh", "ssh-keygen"))


def in_host(index, command):
    return in_netns_host(PREFIX, index, command)


class SshHosts:
    """Two namespaces, each with an sshd of this test's own; removed by close()."""

    def __init__(self, work):
        self.work = work
        self.sshd = []
        self.config = os.path.join(work, "ssh_config")

    def start(self):
        subprocess.run([NETNS, "create", "2", "--prefix", PREFIX, "--shaped", "none"], check=True,
                       capture_output=True)
        for key in ("host_key", "client_key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                            os.path.join(self.work, key)], check=True)
        shutil.copy(os.path.join(self.work, "client_key.pub"),
                    os.path.join(self.work, "authorized_keys"))
        sshd_config = os.path.join(self.work, "sshd_config")
        with open(sshd_config, "w") as f:
            f.write(f"""Port 22
ListenAddress 0.0.0.0
HostKey {self.work}/host_key
PidFile none
AuthorizedKeysFile {self.work}/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
LogLevel ERROR
""")
        with open(self.config, "w") as f:
            f.write(f"""Host *
  IdentityFile {self.work}/client_key
  IdentitiesOnly yes
  UserKnownHostsFile /dev/null
  StrictHostKeyChecking no
  LogLevel ERROR
  User root
  ConnectTimeout 10
""")
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege separation directory
        for index in range(len(HOSTS)):
            log = open(os.path.join(self.work, f"sshd{index}.log"), "w")
            self.sshd.append(subprocess.Popen(
                in_host(index, ["/usr/sbin/sshd", "-D", "-e", "-f", sshd_config]),
                stdout=log, stderr=subprocess.STDOUT))
        for index, address in enumerate(HOSTS):
            self.wait_for_login(address, index)

    def wait_for_login(self, address, index):
        end = time.monotonic() + 30
        while True:
            done = subprocess.run(
                in_host(0, ["ssh", "-F", self.config, "-o", "BatchMode=yes", address, "hostname"]),
                capture_output=True, text=True)
            if done.returncode == 0:
                if done.stdout.strip() != f"{PREFIX}-h{index}":
                    raise Failure(f"ssh {address} reached {done.stdout.strip()!r}")
                return
            if time.monotonic() > end:
                raise Failure(f"cannot log in to {address} over ssh: {done.stderr.strip()}")
            time.sleep(0.2)

    def close(self):
        for process in self.sshd:
            process.terminate()
        for process in self.sshd:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
        subprocess.run([NETNS, "destroy", "--prefix", PREFIX], capture_output=True)


def losses(path):
    with open(path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    steps = [r for r in records if "loss" in r and "step" in r]
    return {r["step"]: r["loss"] for r in steps}


def processes_with(tag):
    """(pid, command line) of every process whose command line contains `tag`."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                line = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if tag in line:
            found.append((int(pid), line))
    return found


def wait_gone(tag, deadline_s=20):
    end = time.monotonic() + deadline_s
    while processes_with(tag):
        if time.monotonic() > end:
            raise Failure(f"processes left behind: {processes_with(tag)}")
        time.sleep(0.2)


def compare_with_one_host(chorus, hosts, work):
    """The -H job and the same job on one host give the same losses step by step."""
    spread = os.path.join(work, "spread.jsonl")
    command = [chorus, "train", "-H", f"{HOSTS[0]}:2,{HOSTS[1]}:2", "--ssh-config", hosts.config,
               "--set", "devices=cpu,cpu@0.5,cpu,cpu@0.5", *JOB, "--steps", str(STEPS),
               "--log-json", spread]
    done = subprocess.run(in_host(0, command), capture_output=True, text=True, timeout=DEADLINE_S)
    output = done.stdout + done.stderr
    if done.returncode != 0:
        raise Failure(f"chorus train -H exited {done.returncode}:\n{output}")
    for node, ranks in (("0", "0..1"), ("1", "2..3")):
        if f"node {node}/2: ranks {ranks} of 4" not in output:
            raise Failure(f"node {node} did not run ranks {ranks} of 4:\n{output}")
    local = os.path.join(work, "local.jsonl")
    command = [chorus, "train", "--set", "devices=cpu,cpu@0.5,cpu,cpu@0.5", *JOB, "--steps",
               str(STEPS), "--log-json", local]
    done = subprocess.run(command, capture_output=True, text=True, timeout=DEADLINE_S)
    if done.returncode != 0:
        raise Failure(f"the one-host job exited {done.returncode}:\n{done.stdout}{done.stderr}")
    a, b = losses(spread), losses(local)
    if sorted(a) != list(range(1, STEPS + 1)) or sorted(a) != sorted(b):
        raise Failure(f"steps differ: -H {sorted(a)}, one host {sorted(b)}")
    for step in a:
        if abs(a[step] - b[step]) > 1e-5 * max(abs(b[step]), 1e-12):
            raise Failure(f"step {step}: loss {a[step]} over ssh, {b[step]} on one host")
    print(f"ok: {STEPS} steps on 2 hosts over ssh match one host (last loss {a[STEPS]:.6f})")


def long_job(chorus, hosts, work, tag):
    log = open(os.path.join(work, f"{tag}.out"), "w")
    command = [chorus, "train", "-H", f"{HOSTS[0]}:1,{HOSTS[1]}:1", "--ssh-config", hosts.config,
               "--set", "devices=cpu", *JOB, "--set", "train.log_every=1000", "--steps", "1000000",
               "--log-json", os.path.join(work, f"{tag}.jsonl")]
    return subprocess.Popen(in_host(0, command), stdout=log, stderr=subprocess.STDOUT), log.name


def wait_for_steps(path, process, output):
    end = time.monotonic() + DEADLINE_S
    while not (os.path.exists(path) and os.path.getsize(path) > 0):
        if process.poll() is not None or time.monotonic() > end:
            raise Failure(f"the long job did not start training:\n{open(output).read()}")
        time.sleep(0.2)


def interrupt_stops_every_node(chorus, hosts, work):
    tag = "interrupted"
    process, output = long_job(chorus, hosts, work, tag)
    wait_for_steps(os.path.join(work, f"{tag}.jsonl"), process, output)
    running = processes_with(os.path.join(work, f"{tag}.jsonl"))
    agents = [line for _, line in running if " train " in line and "--secret-stdin" in line]
    if len(agents) != 2:
        raise Failure(f"expected 2 remote agents with --secret-stdin, found: {running}")
    # Every process of the job (launcher, ssh, remote agents, workers) names the chorus binary.
    secrets = [line for _, line in processes_with(chorus) if re.search(r"[0-9a-f]{64}", line)]
    if secrets:
        raise Failure(f"a job secret is on a command line: {secrets}")
    process.send_signal(signal.SIGINT)
    try:
        code = process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        raise Failure(f"the launcher did not stop after SIGINT:\n{open(output).read()}")
    if code != 130:
        raise Failure(f"the interrupted launcher exited {code}, not 130:\n{open(output).read()}")
    wait_gone(os.path.join(work, f"{tag}.jsonl"))
    print("ok: SIGINT to the launcher stopped both nodes; no secret on any command line")


def unreachable_host_fails(chorus, hosts, work):
    tag = os.path.join(work, "unreachable.jsonl")
    command = [chorus, "train", "-H", f"{HOSTS[0]}:1,10.77.0.9:1", "--ssh-config", hosts.config,
               "--set", "devices=cpu", *JOB, "--steps", "5", "--log-json", tag]
    start = time.monotonic()
    done = subprocess.run(in_host(0, command), capture_output=True, text=True, timeout=DEADLINE_S)
    output = done.stdout + done.stderr
    if done.returncode != 3 or "node 1 (10.77.0.9): ssh exited with 255" not in output:
        raise Failure(f"an unreachable host: exit {done.returncode}:\n{output}")
    wait_gone(tag)
    print(f"ok: an unreachable host failed the job in {time.monotonic() - start:.1f} s")


def run_places_ranks(chorus, hosts):
    script = 'echo "rank $CHORUS_RANK of $CHORUS_WORLD_SIZE on $(hostname)"'
    command = [chorus, "run", "-H", f"{HOSTS[0]}:1,{HOSTS[1]}:2", "--ssh-config", hosts.config,
               "--devices", "cpu", "--", "sh", "-c", script]
    done = subprocess.run(in_host(0, command), capture_output=True, text=True, timeout=DEADLINE_S)
    seen = sorted(re.findall(r"rank (\d) of (\d) on (\S+)", done.stdout))
    expected = [("0", "3", f"{PREFIX}-h0"), ("1", "3", f"{PREFIX}-h1"), ("2", "3", f"{PREFIX}-h1")]
    if done.returncode != 0 or seen != expected:
        raise Failure(f"chorus run -H: exit {done.returncode}, ranks {seen}:\n"
                      f"{done.stdout}{done.stderr}")
    print("ok: chorus run -H placed ranks 0 | 1, 2 on the two hosts")


def main():
    chorus = chorus_argument(__doc__.splitlines()[0])
    skip_if(skip_reason())
    work = tempfile.mkdtemp(prefix="chorus-ssh-")
    hosts = SshHosts(work)
    try:
        hosts.start()
        compare_with_one_host(chorus, hosts, work)
        interrupt_stops_every_node(chorus, hosts, work)
        unreachable_host_fails(chorus, hosts, work)
        run_places_ranks(chorus, hosts)
        return 0
    except (Failure, subprocess.TimeoutExpired) as error:
        print(f"FAILED: {error}")
        return 1
    finally:
        hosts.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
