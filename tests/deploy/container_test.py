#!/usr/bin/env python3
"""A 2-node chorus job as two containers of the chorus image on a Podman network.

The image (default localhost/chorus:test, a tag of its own so that a user's chorus:latest is left
alone) is built or refreshed first with deploy/container/build-image from the binary under test:
about 2 s when it already holds that binary, 10-20 s when only the chorus layer changed, about
1-2 minutes from nothing (debootstrap from Debian's mirror; the root file system is cached under
/var/cache/chorus-image and as an image, so later runs on the machine reuse it).

Then, through deploy/container/podman-run (runc where cgroups are in hybrid mode, ulimits the host
allows): `chorus devices --quick` in a container; an internal Podman network (its own subnet) with
node 0 at the subnet's second address and node 1 at the third (the bridge has the first), each running
`chorus train --nnodes 2 --node-rank R --rdzv-endpoint NODE0:29400 --secret-file
/run/chorus/secret` with devices cpu,cpu (an MLP on synthetic data, 5 steps), the secret a
mode-600 file bind-mounted read-only. Checks: both containers exit 0, world size 4 with ranks 0..1
on node 0 and 2..3 on node 1, 5 steps logged and in node 0's --log-json (4 shares summing to the
global batch), node 1 reached the store at node 0's address, and the 5 losses equal those of the
same job run on the host as one node of four CPU workers (balance off, fixed seed) within 1e-5.

One run at a time on a machine (a lock under /run/lock): concurrent runs from other checkouts
would otherwise rebuild the same tag under each other. Containers and networks are labelled
chorus.test=container and removed at the end, and any a killed run left are removed at the start.

Exit 0 pass, 1 fail, 77 skip (not root, Podman/Buildah/debootstrap or runc missing, or the Debian
mirror unreachable for a first build), with the reason.

Usage: container_test.py --chorus BUILD/chorus [--image NAME] [--keep-logs DIR]
"""
import argparse
import fcntl
import ipaddress
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from script_support import Failure, Skip, exit_code  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
BUILD_IMAGE = os.path.join(REPO, "deploy", "container", "build-image")
PODMAN_RUN = os.path.join(REPO, "deploy", "container", "podman-run")
LABEL = "chorus.test=container"
LOCK = "/run/lock/chorus-container-test.lock"
PORT = 29400
STEPS = 5
GLOBAL_BATCH = 64
JOB = [
    "--set", "devices=cpu,cpu", "--set", "model.kind=mlp", "--set", "model.hidden=[64]",
    "--set", "data.dataset=synthetic", "--set", "data.size=1024",
    "--set", f"train.global_batch={GLOBAL_BATCH}", "--set", "train.log_every=1",
    "--set", "seed=3", "--set", "balance=off", "--steps", str(STEPS),
]
# Training is deterministic given the split (balance off): the two containers must reproduce the
# losses of the same job with four workers in one process tree on the host.
LOSS_RTOL = 1e-5
# Generous for a loaded 2-core machine; not an assertion on speed.
JOB_DEADLINE_S = 240


def run(command, timeout=120, check=True):
    result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            timeout=timeout)
    if check and result.returncode != 0:
        raise Failure(f"{' '.join(command)} exited {result.returncode}:\n{result.stdout[-3000:]}")
    return result


def preconditions():
    if os.geteuid() != 0:
        raise Skip("needs root (Podman's root storage and networks, debootstrap)")
    for tool in ("podman", "buildah", "debootstrap"):
        if not shutil.which(tool):
            raise Skip(f"{tool} is not installed (scripts/setup installs it)")
    try:
        with open("/sys/fs/cgroup/unified/cgroup.controllers") as f:
            hybrid_v2_controllers = f.read().strip()
    except OSError:
        hybrid_v2_controllers = ""
    if hybrid_v2_controllers and not shutil.which("runc") and "CHORUS_PODMAN_RUNTIME" not in os.environ:
        raise Skip(f"cgroups in hybrid mode with {hybrid_v2_controllers} in v2, which crun refuses, "
                   "and runc is not installed (scripts/setup installs it)")


def remove_leftovers():
    """What a killed run left: its containers first, then its networks."""
    containers = run(["podman", "ps", "-a", "-q", "--filter", f"label={LABEL}"]).stdout.split()
    if containers:
        print(f"removing containers a previous run left: {' '.join(containers)}")
        run(["podman", "rm", "-f", "-t", "0", *containers])
    networks = run(["podman", "network", "ls", "-q", "--filter", f"label={LABEL}"]).stdout.split()
    if networks:
        print(f"removing networks a previous run left: {' '.join(networks)}")
        run(["podman", "network", "rm", "-f", *networks])


def ensure_image(chorus, image):
    started = time.monotonic()
    result = subprocess.run([BUILD_IMAGE, "--chorus", chorus, "--tag", image],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            timeout=480)
    print(result.stdout.rstrip())
    if result.returncode == 75:
        raise Skip("the image's Debian root file system could not be built (mirror unreachable?): "
                   + result.stdout.strip().splitlines()[-1])
    if result.returncode != 0:
        raise Failure(f"build-image exited {result.returncode}")
    print(f"image {image} ready in {time.monotonic() - started:.1f} s")


def check_devices(image):
    result = run([PODMAN_RUN, "--rm", "--label", LABEL, image, "devices", "--quick"], timeout=180)
    print(result.stdout.rstrip())
    if not any(line.split()[1:2] == ["cpu"] for line in result.stdout.splitlines() if line.strip()):
        raise Failure("`chorus devices --quick` in the image listed no cpu device")


def node_addresses(network):
    inspected = json.loads(run(["podman", "network", "inspect", network]).stdout)[0]
    subnet = ipaddress.ip_network(inspected["subnets"][0]["subnet"])
    # The bridge takes the first address (inspect names no gateway for an internal network).
    hosts = [str(h) for h in subnet.hosts()][1:]
    gateway = inspected["subnets"][0].get("gateway")
    hosts = [h for h in hosts if h != gateway]
    return hosts[0], hosts[1]


def start_node(image, name, network, address, rank, node0, workdir):
    command = [
        PODMAN_RUN, "-d", "--name", name, "--label", LABEL, "--hostname", f"node{rank}",
        "--network", network, "--ip", address,
        "-v", f"{workdir}/secret:/run/chorus/secret:ro",
        "-v", f"{workdir}/node{rank}:/out",
        image, "train", *JOB,
        "--nnodes", "2", "--node-rank", str(rank), "--rdzv-endpoint", f"{node0}:{PORT}",
        "--secret-file", "/run/chorus/secret", "--log-json", "/out/log.jsonl",
    ]
    print("$ " + " ".join(command))
    run(command)


def wait_for(names):
    """Exit codes of the containers once all exited, or once one exited non-zero (its peer
    would wait out the rendezvous timeout)."""
    end = time.monotonic() + JOB_DEADLINE_S
    while time.monotonic() < end:
        states = []
        for name in names:
            state = run(["podman", "inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}",
                         name]).stdout.split()
            states.append((state[0], int(state[1])))
        if any(status == "exited" and code != 0 for status, code in states) or \
                all(status == "exited" for status, _ in states):
            return [code if status == "exited" else None for status, code in states]
        time.sleep(0.5)
    raise Failure(f"the containers did not exit within {JOB_DEADLINE_S} s")


def check_job(logs, codes, log_json):
    failed = [f"node {rank}'s container exited {code}" for rank, code in enumerate(codes)
              if code not in (0, None)]
    failed += [f"node {rank}'s container still ran" for rank, code in enumerate(codes) if code is None]
    if failed:
        raise Failure("; ".join(failed))
    expect = [
        (0, "node 0/2: ranks 0..1 of 4"),
        (1, "node 1/2: ranks 2..3 of 4"),
        (0, "world: 4 ranks"),
        (0, f"step {STEPS}/{STEPS}"),
        (0, f"done: {STEPS} steps"),
    ]
    for rank, text in expect:
        if text not in logs[rank]:
            raise Failure(f"node {rank}'s output lacks {text!r}")
    with open(log_json) as f:
        steps = [json.loads(line) for line in f if line.strip()]
    steps = [s for s in steps if "step" in s and "loss" in s]
    if [s["step"] for s in steps] != list(range(1, STEPS + 1)):
        raise Failure(f"--log-json has steps {[s['step'] for s in steps]}, not 1..{STEPS}")
    for s in steps:
        if len(s["shares"]) != 4 or sum(s["shares"]) != GLOBAL_BATCH:
            raise Failure(f"step {s['step']}: shares {s['shares']} (want 4 summing to {GLOBAL_BATCH})")
        if not s["loss"] == s["loss"] or s["loss"] <= 0:
            raise Failure(f"step {s['step']}: loss {s['loss']}")
    print(f"{STEPS} steps of world size 4; losses {[round(s['loss'], 4) for s in steps]}")
    return [s["loss"] for s in steps]


def host_losses(chorus, workdir):
    """The same job on the host, one node with four CPU workers."""
    log_json = os.path.join(workdir, "host.jsonl")
    run([chorus, "train", *JOB, "--set", "devices=cpu,cpu,cpu,cpu", "--log-json", log_json],
        timeout=JOB_DEADLINE_S)
    with open(log_json) as f:
        return [s["loss"] for s in map(json.loads, filter(str.strip, f)) if "loss" in s and "step" in s]


def two_node_job(chorus, image, workdir, keep_logs):
    tag = str(os.getpid())
    network = f"chorus-test-{tag}"
    names = [f"chorus-test-{tag}-node0", f"chorus-test-{tag}-node1"]
    run(["podman", "network", "create", "--internal", "--label", LABEL, network])
    try:
        node0, node1 = node_addresses(network)
        print(f"network {network}: node 0 at {node0}, node 1 at {node1}")
        with open(f"{workdir}/secret", "w") as f:
            f.write(os.urandom(24).hex() + "\n")
        os.chmod(f"{workdir}/secret", 0o600)
        for rank in (0, 1):
            os.makedirs(f"{workdir}/node{rank}")
        started = time.monotonic()
        try:
            for rank, address in enumerate((node0, node1)):
                start_node(image, names[rank], network, address, rank, node0, workdir)
            codes = wait_for(names)
            print(f"containers exited {codes} after {time.monotonic() - started:.1f} s")
        finally:  # the output, whatever happened
            logs = [run(["podman", "logs", name], check=False).stdout for name in names]
            for rank, log in enumerate(logs):
                print(f"--- node {rank} ---\n{log.rstrip()}")
                if keep_logs:
                    os.makedirs(keep_logs, exist_ok=True)
                    with open(os.path.join(keep_logs, f"node{rank}.log"), "w") as f:
                        f.write(log)
        losses = check_job(logs, codes, f"{workdir}/node0/log.jsonl")
        if f"store {node0}:{PORT}" not in logs[1]:
            raise Failure(f"node 1 did not use the store at {node0}:{PORT}")
        expected = host_losses(chorus, workdir)
        for step, (got, want) in enumerate(zip(losses, expected), start=1):
            if abs(got - want) > LOSS_RTOL * abs(want):
                raise Failure(f"step {step}: loss {got} in the containers, {want} on the host")
        if len(expected) != len(losses):
            raise Failure(f"the host run logged {len(expected)} steps")
        print(f"the losses equal those of the same job on the host (4 workers, one node) within {LOSS_RTOL:g}")
    finally:
        run(["podman", "rm", "-f", "-t", "0", *names], check=False)
        run(["podman", "network", "rm", "-f", network], check=False)


def container_checks(args):
    preconditions()
    os.makedirs(os.path.dirname(LOCK), exist_ok=True)
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        remove_leftovers()
        ensure_image(os.path.abspath(args.chorus), args.image)
        check_devices(args.image)
        with tempfile.TemporaryDirectory(prefix="chorus-container-test-") as workdir:
            two_node_job(os.path.abspath(args.chorus), args.image, workdir, args.keep_logs)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chorus", required=True, help="the chorus binary to put in the image")
    parser.add_argument("--image", default="chorus:test")
    parser.add_argument("--keep-logs", help="also write each node's output here")
    args = parser.parse_args()
    return exit_code(lambda: container_checks(args), failures=(Failure, subprocess.TimeoutExpired))


if __name__ == "__main__":
    sys.exit(main())
