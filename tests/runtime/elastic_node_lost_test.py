#!/usr/bin/env python3
"""An elastic job loses a whole node when that node's link goes down, and the survivors finish.

Two hosts are two network namespaces on a bridge (scripts/netns_hosts). Node 0 (host 0, which
hosts the store) and node 1 each run `chorus train --nnodes 2` with two emulated CPU workers and
`elastic.enabled = true`. Once rank 0 has logged some steps, the test takes host 1's eth0 down:
node 1's agent and workers are alive but cut off, as when a switch port or a cable fails.

Checks:
- the survivors on host 0 detect the lost ranks 2 and 3 (heartbeat), regroup and go on: rank 0's
  log holds every step 1..STEPS exactly once and one recovery event that lost ranks 2 and 3;
- they go on before the communication deadline (comm.timeout_s = 30): the heartbeat's verdict
  (3 s) aborts the Gloo collective they were blocked in, rather than its deadline ending it;
- the trajectory is that of the uninterrupted job (balance = off, the same global batches): each
  step's loss equals that of the same job run by four workers on one host, within 1e-5 relative
  (of at least 1e-3: near a loss of 0, as this MLP gets by step 30, the reduction order alone,
  Gloo between the hosts against shared memory on one, moves the loss by 1e-4 of itself);
- node 0's agent exits 0 and does not wait for node 1 forever: it gives node 1 up once node 1
  has neither reported done nor beaten for its lease (10 s) and says so;
- node 1's agent ends by itself (non-zero) within the deadline, and no process of the job is left
  on either host.

Exits 77 (skipped) when not root or without ip netns.
Usage: elastic_node_lost_test.py --chorus BUILD/chorus
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from script_support import (  # noqa: E402
    NETNS, Failure, chorus_argument, in_netns_host, netns_skip_reason, skip_if)

PREFIX = f"cnl{os.getpid() % 100000}"
PORT = 29500 + os.getpid() % 400
STEPS = 60
CUT_AFTER_STEP = 15
# The communication deadline: far above the heartbeat's 3 s, so that going on before it shows the
# heartbeat ended the survivors' wait.
TIMEOUT_S = 30
# Emulated at 1/50 speed, so that a step takes tens of milliseconds and the cut falls mid-run.
DEVICES = "cpu@0.02,cpu@0.02"
JOB = [
    "--set", "model.kind=mlp", "--set", "data.dataset=synthetic", "--set", "data.size=2048",
    "--set", "train.global_batch=48", "--set", "balance=off", "--set", "train.eval_every=0",
    "--set", "seed=11", "--set", "elastic.enabled=true", "--set", f"comm.timeout_s={TIMEOUT_S}",
    "--steps", str(STEPS),
]
# Generous for a loaded 2-core machine; none of them is an assertion on speed.
DEADLINE_S = 180


def in_host(index, command):
    return in_netns_host(PREFIX, index, command)


def read_log(path):
    steps, recoveries = [], []
    if not os.path.exists(path):
        return steps, recoveries
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            record = json.loads(line)
            if record.get("event") == "recovery":
                recoveries.append(record)
            elif "step" in record and "loss" in record:
                steps.append(record)
    return steps, recoveries


def start_node(chorus, node, work, secret, log_json=None):
    command = [chorus, "train", "--set", f"devices={DEVICES}", *JOB, "--nnodes", "2",
               "--node-rank", str(node), "--rdzv-endpoint", f"10.77.0.1:{PORT}",
               "--secret-file", secret]
    if log_json:
        command += ["--log-json", log_json]
    output = open(os.path.join(work, f"node{node}.out"), "w")
    return subprocess.Popen(in_host(node, command), stdout=output, stderr=subprocess.STDOUT)


def wait(process, name, work, node):
    try:
        return process.wait(timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:
        process.kill()
        raise Failure(f"{name} did not end within {DEADLINE_S} s:\n{output_of(work, node)}")


def output_of(work, node):
    with open(os.path.join(work, f"node{node}.out")) as f:
        return f.read()[-6000:]


def run_cut_job(chorus, work, secret):
    log = os.path.join(work, "cut.jsonl")
    node1 = start_node(chorus, 1, work, secret)
    node0 = start_node(chorus, 0, work, secret, log)
    end = time.monotonic() + DEADLINE_S
    while len(read_log(log)[0]) < CUT_AFTER_STEP:
        if node0.poll() is not None or time.monotonic() > end:
            node1.kill()
            raise Failure(f"the job did not reach step {CUT_AFTER_STEP}:\n{output_of(work, 0)}")
        time.sleep(0.05)
    subprocess.run(["ip", "netns", "exec", f"{PREFIX}-h1", "ip", "link", "set", "eth0", "down"],
                   check=True)
    cut = time.time()
    logged = len(read_log(log)[0])
    print(f"host 1's link taken down after step {logged}")
    while len(read_log(log)[0]) <= logged and node0.poll() is None:
        time.sleep(0.05)
    going_on = time.time() - cut
    print(f"the survivors logged step {logged + 1} {going_on:.1f} s after the cut")
    if going_on >= TIMEOUT_S:
        node1.kill()
        raise Failure(f"the survivors went on only {going_on:.1f} s after the cut, at the "
                      f"communication deadline ({TIMEOUT_S} s), not at the heartbeat's")
    code0 = wait(node0, "node 0's agent", work, 0)
    print(f"node 0's agent exited {code0}, {time.time() - cut:.1f} s after the cut")
    code1 = wait(node1, "node 1's agent", work, 1)
    print(f"node 1's agent exited {code1}, {time.time() - cut:.1f} s after the cut")
    return log, code0, code1, cut


def run_reference(chorus, work):
    log = os.path.join(work, "reference.jsonl")
    done = subprocess.run([chorus, "train", "--set", f"devices={DEVICES},{DEVICES}", *JOB,
                           "--log-json", log], capture_output=True, text=True, timeout=DEADLINE_S)
    if done.returncode != 0:
        raise Failure(f"the one-host reference exited {done.returncode}:\n{done.stdout}{done.stderr}")
    return {r["step"]: r["loss"] for r in read_log(log)[0]}


def check(log, code0, code1, cut, reference, work):
    steps, recoveries = read_log(log)
    numbers = [r["step"] for r in steps]
    if numbers != list(range(1, STEPS + 1)):
        raise Failure(f"steps logged {numbers}, expected 1..{STEPS} once each")
    if len(recoveries) != 1 or sorted(recoveries[0].get("lost", [])) != [2, 3]:
        raise Failure(f"expected one recovery that lost ranks 2 and 3, got {recoveries}")
    for record in steps:
        expected = reference[record["step"]]
        if abs(record["loss"] - expected) > 1e-5 * max(abs(expected), 1e-3):
            raise Failure(f"step {record['step']}: loss {record['loss']} after the cut, "
                          f"{expected} uninterrupted")
    output0 = output_of(work, 0)
    if code0 != 0:
        raise Failure(f"node 0's agent exited {code0}:\n{output0}")
    if "node 1 is neither done nor heard from" not in output0:
        raise Failure(f"node 0 did not say it gave node 1 up:\n{output0}")
    if code1 == 0:
        raise Failure(f"node 1's agent, cut off, exited 0:\n{output_of(work, 1)}")
    print(f"ok: steps 1..{STEPS} once each; ranks 2 and 3 found lost "
          f"{recoveries[0]['time'] - cut:.1f} s after the cut, step {recoveries[0]['redo_step']} "
          f"redone ({recoveries[0].get('reason')}); losses as uninterrupted")


def no_process_left():
    """Agents name the endpoint on their command line, workers in their environment."""
    tag = f"10.77.0.1:{PORT}".encode()
    end = time.monotonic() + 20
    while True:
        left = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmdline = f.read()
                with open(f"/proc/{pid}/environ", "rb") as f:
                    environ = f.read()
            except OSError:
                continue
            if int(pid) != os.getpid() and (tag in cmdline or tag in environ):
                left.append(cmdline.replace(b"\0", b" ").decode(errors="replace"))
        if not left:
            return
        if time.monotonic() > end:
            raise Failure(f"processes of the job left: {left}")
        time.sleep(0.2)


def main():
    chorus = chorus_argument(__doc__.splitlines()[0])
    skip_if(netns_skip_reason())
    work = tempfile.mkdtemp(prefix="chorus-node-lost-")
    secret = os.path.join(work, "job.secret")
    with open(os.open(secret, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write(os.urandom(32).hex())
    try:
        subprocess.run([NETNS, "create", "2", "--prefix", PREFIX, "--shaped", "none"], check=True,
                       capture_output=True)
        log, code0, code1, cut = run_cut_job(chorus, work, secret)
        reference = run_reference(chorus, work)
        check(log, code0, code1, cut, reference, work)
        no_process_left()
        return 0
    except (Failure, subprocess.TimeoutExpired) as error:
        print(f"FAILED: {error}")
        return 1
    finally:
        subprocess.run([NETNS, "destroy", "--prefix", PREFIX], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
