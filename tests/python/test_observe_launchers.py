"""CHORUS_METRICS_PORT and CHORUS_TRACE for a Python job that mpirun or torchrun starts, with no
chorus agent (CTest python_observe_launchers; runtime/launch/job_observation.h).

A 2-rank chorus.DataParallel job (workers/observed.py) under a real Open MPI `mpirun`: the first
rank serves /metrics (a plain HTTP GET, Prometheus's text format) with chorus train's series for
both ranks and the job's values; after the job, rank 0 has merged both ranks' trace parts into
the trace and no part is left. The same over two hosts as mpirun lays them out (`-H
localhost:2,fakehost2:2`, a stand-in for ssh starting the second host's daemon here, each host
given its own CHORUS_HOST_ID): each host's first rank serves its own two ranks under its own node
index, and the trace holds all four ranks and both nodes. Under torchrun (which names the node)
the same on one node; and a process started by hand (with DataLoader worker processes) serves
its own. Refused: a busy port (on every rank of the node, at once), the agent's
socket variable without an agent, CHORUS_METRICS_PORT under `chorus run`.
"""

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time

import pytest

import chorus
from metrics_text import by_rank, get, parse_metrics, series

pytestmark = pytest.mark.multiproc

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "workers", "observed.py")
STEPS = 8
GLOBAL_BATCH = 48
LR = 0.05
DEADLINE_S = 120
ANNOUNCED = r"chorus: metrics of node (\d+) \((\w+)\) on http://[^:]+:(\d+)/metrics"
# Sets each rank's host id as the host mpirun placed it on (-H localhost:2,fakehost2:2 maps ranks
# 0, 1 to the first host and 2, 3 to the second): both "hosts" are this machine, whose host name
# would otherwise name them both.
HOST_ID_WRAPPER = """#!/bin/sh
CHORUS_HOST_ID=host$((OMPI_COMM_WORLD_RANK / 2)) exec "$@"
"""
FAKE_SSH = """#!/bin/sh
shift
exec sh -c "$*"
"""


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def clean_environment(tmp_path, **variables):
    """The test's environment without any launcher's or chorus's variables, plus the job's store
    and secret (as a user sets them for mpirun) and `variables`."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CHORUS_", "OMPI_", "PMIX_", "SLURM_", "TORCHELASTIC_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    secret = tmp_path / "job.secret"
    secret.write_text(secrets.token_hex(32))
    secret.chmod(0o600)
    env.update(CHORUS_RDZV_ENDPOINT=f"127.0.0.1:{free_port()}", CHORUS_SECRET_FILE=str(secret),
               OMP_NUM_THREADS="1", PYTHONPATH=os.environ.get("PYTHONPATH", ""))
    env.update(variables)
    return env


def mpirun(np, env, program, options=()):
    """`mpirun -np NP` of `program`, every variable of `env` that chorus reads exported."""
    command = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
               "-np", str(np), *options]
    for name in sorted(env):
        if name.startswith("CHORUS_") or name in ("PYTHONPATH", "OMP_NUM_THREADS"):
            command += ["-x", name]
    return command + list(program)


def observed(hold, steps=STEPS):
    return [sys.executable, WORKER, "--steps", str(steps), "--global-batch", str(GLOBAL_BATCH),
            "--lr", str(LR), "--hold", str(hold), "--pause", "0.01"]


class Job:
    """A launcher's job, its output in a file; killed (its whole session) if still running."""

    def __init__(self, tmp_path, command, env):
        self.log = open(tmp_path / "job.log", "w+")
        self.process = subprocess.Popen(command, env=env, cwd=tmp_path, stdout=self.log,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True)

    def output(self):
        if self.log.closed:
            return self.text
        self.log.seek(0)
        return self.log.read()

    def wait_for(self, what, predicate, deadline_s=DEADLINE_S):
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            assert self.process.poll() is None, (
                f"the job exited {self.process.returncode} before {what}:\n{self.output()}")
            value = predicate()
            if value:
                return value
            time.sleep(0.2)
        pytest.fail(f"gave up after {deadline_s} s waiting for {what}:\n{self.output()}")

    def announced(self, nodes):
        """{node: (launcher, port)} once `nodes` nodes announced their metrics."""
        def found():
            ports = {int(n): (launcher, int(p))
                     for n, launcher, p in re.findall(ANNOUNCED, self.output())}
            return ports if len(ports) == nodes else None
        return self.wait_for(f"{nodes} nodes' metrics ports", found)

    def finish(self):
        try:
            self.process.wait(timeout=DEADLINE_S)
        finally:
            if self.process.poll() is None:
                os.killpg(self.process.pid, 9)
                self.process.wait()
        return self.process.returncode

    def close(self):
        if self.process.poll() is None:
            os.killpg(self.process.pid, 9)
            self.process.wait()
        self.text = self.output()
        self.log.close()


def scrape_finished(job, port, ranks):
    """The node's samples once every rank of `ranks` reported all STEPS steps."""
    url = f"http://127.0.0.1:{port}/metrics"

    def finished():
        samples = parse_metrics(get(url))
        steps = by_rank(samples, "chorus_steps_total")
        return samples if steps == {r: STEPS for r in ranks} else None
    return job.wait_for(f"chorus_steps_total at {STEPS} for ranks {ranks} on port {port}",
                        finished)


def trace_spans(trace):
    events = json.loads(trace.read_text())["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    processes = {e["args"]["name"] for e in events
                 if e["ph"] == "M" and e["name"] == "process_name"}
    return spans, processes


def check_spans(spans, ranks, steps):
    for rank in ranks:
        mine = [e for e in spans if e["args"]["rank"] == rank]
        assert {e["args"]["step"] for e in mine} == set(steps), (rank, mine[:3])
        names = {e["name"] for e in mine}
        assert {"forward", "backward", "step figures", "optimizer"} <= names, names
        if len(ranks) > 1:  # a job of one reduces nothing
            assert any(n.startswith("all_reduce bucket") for n in names), names
    assert {e["args"]["rank"] for e in spans} == set(ranks)


needs_mpirun = pytest.mark.skipif(not shutil.which("mpirun"), reason="no mpirun")


@needs_mpirun
def test_an_mpirun_job_serves_its_metrics_and_merges_its_trace(tmp_path):
    hold, trace = tmp_path / "hold", tmp_path / "trace.json"
    env = clean_environment(tmp_path, CHORUS_DEVICES="cpu,cpu@0.25", CHORUS_METRICS_PORT="0",
                            CHORUS_TRACE=str(trace), CHORUS_TRACE_STEPS="0:4")
    job = Job(tmp_path, mpirun(2, env, observed(hold)), env)
    try:
        [(launcher, port)] = job.announced(1).values()
        assert launcher == "mpirun"
        samples = scrape_finished(job, port, ["0", "1"])
        text = get(f"http://127.0.0.1:{port}/metrics")
        assert "# TYPE chorus_steps_total counter" in text
        info = {dict(labels)["rank"]: dict(labels)
                for labels in series(samples, "chorus_rank_info")}
        assert {r: i["device"] for r, i in info.items()} == {"0": "cpu", "1": "cpu@0.25"}
        assert all(i["node"] == "0" for i in info.values())
        assert sum(by_rank(samples, "chorus_share_samples").values()) == GLOBAL_BATCH
        counts = by_rank(samples, "chorus_step_seconds_count")
        assert set(counts) == {"0", "1"} and all(1 <= n <= STEPS for n in counts.values())
        assert list(series(samples, "chorus_learning_rate").values()) == [LR]
        [loss] = series(samples, "chorus_loss").values()
        assert 0.5 < loss < 5
        assert by_rank(samples, "chorus_pad_seconds_total")["1"] > 0
        assert all(v > 0 for v in by_rank(samples, "chorus_memory_used_bytes").values())
        reduced = {dict(labels)["rank"]: value for labels, value
                   in series(samples, "chorus_collective_bytes_total").items()
                   if dict(labels)["op"] == "all_reduce"}
        assert set(reduced) == {"0", "1"} and min(reduced.values()) > 0
        hold.touch()
        assert job.finish() == 0, job.output()
    finally:
        hold.touch()
        job.close()
    out = job.output()
    assert f"chorus: wrote the timeline of 2 ranks to {trace}" in out, out
    assert out.count("chorus: wrote the timeline") == 1, out
    assert not [p for p in os.listdir(tmp_path) if ".rank" in p], os.listdir(tmp_path)
    spans, processes = trace_spans(trace)
    check_spans(spans, [0, 1], range(4))
    assert processes == {"node 0"}


@needs_mpirun
def test_each_host_of_an_mpirun_job_serves_its_own_ranks(tmp_path):
    hold, trace = tmp_path / "hold", tmp_path / "trace.json"
    wrapper, fake_ssh = tmp_path / "host_id.sh", tmp_path / "fake_ssh.sh"
    wrapper.write_text(HOST_ID_WRAPPER)
    fake_ssh.write_text(FAKE_SSH)
    wrapper.chmod(0o700)
    fake_ssh.chmod(0o700)
    env = clean_environment(tmp_path, CHORUS_METRICS_PORT="0", CHORUS_TRACE=str(trace),
                            CHORUS_TRACE_STEPS="1:3")
    options = ["-H", "localhost:2,fakehost2:2", "--mca", "plm_rsh_agent", str(fake_ssh)]
    job = Job(tmp_path, mpirun(4, env, [str(wrapper), *observed(hold)], options), env)
    try:
        ports = job.announced(2)
        assert sorted(ports) == [0, 1] and ports[0][1] != ports[1][1], ports
        for node, ranks in ((0, ["0", "1"]), (1, ["2", "3"])):
            samples = scrape_finished(job, ports[node][1], ranks)
            nodes = {dict(labels)["rank"]: dict(labels)["node"]
                     for labels in series(samples, "chorus_rank_info")}
            assert nodes == {r: str(node) for r in ranks}, (node, nodes)
            shares = by_rank(samples, "chorus_share_samples")
            assert sorted(shares) == ranks and sum(shares.values()) == GLOBAL_BATCH // 2
        hold.touch()
        assert job.finish() == 0, job.output()
    finally:
        hold.touch()
        job.close()
    out = job.output()
    assert f"chorus: wrote the timeline of 4 ranks to {trace}" in out, out
    assert not [p for p in os.listdir(tmp_path) if ".rank" in p], os.listdir(tmp_path)
    spans, processes = trace_spans(trace)
    check_spans(spans, [0, 1, 2, 3], [1, 2])
    assert processes == {"node 0", "node 1"}


def test_a_torchrun_job_serves_its_metrics_and_merges_its_trace(tmp_path):
    hold, trace = tmp_path / "hold", tmp_path / "trace.json"
    env = clean_environment(tmp_path, CHORUS_METRICS_PORT="0", CHORUS_TRACE=str(trace),
                            CHORUS_TRACE_STEPS="0:2")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "2", *observed(hold)[1:]]
    job = Job(tmp_path, command, env)
    try:
        [(launcher, port)] = job.announced(1).values()
        assert launcher == "torchrun"
        samples = scrape_finished(job, port, ["0", "1"])
        assert sum(by_rank(samples, "chorus_share_samples").values()) == GLOBAL_BATCH
        hold.touch()
        assert job.finish() == 0, job.output()
    finally:
        hold.touch()
        job.close()
    assert f"chorus: wrote the timeline of 2 ranks to {trace}" in job.output(), job.output()
    spans, _ = trace_spans(trace)
    check_spans(spans, [0, 1], [0, 1])


BY_HAND = """
import urllib.request
import torch
import chorus
ctx = chorus.init()
data = torch.utils.data.TensorDataset(torch.randn(256, 8), torch.randint(0, 3, (256,)))
model = chorus.DataParallel(torch.nn.Linear(8, 3), global_batch=32)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
sampler = chorus.ShardSampler(data, global_batch=32)
# Forked loader processes: they must keep the parent's monitor, whose threads they lack.
for inputs, targets in torch.utils.data.DataLoader(data, batch_sampler=sampler, num_workers=2):
    loss = torch.nn.functional.cross_entropy(model(inputs), targets, reduction="sum")
    loss.backward()
    chorus.step(optimizer, loss=loss)
url = f"http://127.0.0.1:{ctx._observation.port}/metrics"
print("steps:", [line for line in urllib.request.urlopen(url).read().decode().splitlines()
                 if line.startswith("chorus_steps_total")])
"""


def test_a_process_started_by_hand_serves_its_own_metrics_and_trace(tmp_path):
    trace = tmp_path / "trace.json"
    script = tmp_path / "by_hand.py"
    script.write_text(BY_HAND)
    env = clean_environment(tmp_path, CHORUS_METRICS_PORT="0", CHORUS_TRACE=str(trace),
                            CHORUS_TRACE_STEPS="2:4")
    del env["CHORUS_RDZV_ENDPOINT"], env["CHORUS_SECRET_FILE"]  # a job of one
    done = subprocess.run([sys.executable, str(script)], env=env, cwd=tmp_path,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=DEADLINE_S)
    assert done.returncode == 0, done.stdout
    assert re.search(r"chorus: metrics of node 0 \(no launcher\) on http://", done.stdout)
    assert """steps: ['chorus_steps_total{device="cpu",node="0",rank="0"} 8']""" in done.stdout
    assert f"chorus: wrote the timeline of 1 ranks to {trace}" in done.stdout, done.stdout
    spans, _ = trace_spans(trace)
    check_spans(spans, [0], [2, 3])


@needs_mpirun
def test_a_busy_port_is_refused_on_every_rank_of_the_node(tmp_path):
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        env = clean_environment(tmp_path, CHORUS_METRICS_PORT=str(busy.getsockname()[1]))
        started = time.monotonic()
        done = subprocess.run(mpirun(2, env, observed(tmp_path / "hold")), env=env, cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=DEADLINE_S)
    assert done.returncode != 0, done.stdout
    assert "cannot listen" in done.stdout, done.stdout
    # Rank 1 was told by rank 0, not left waiting for the job's deadline (60 s).
    assert "its first rank refused them" in done.stdout, done.stdout
    assert time.monotonic() - started < 50
    assert "observed:" not in done.stdout


def test_the_agents_socket_and_a_port_under_chorus_run_are_refused(tmp_path):
    launched = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1",
                "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "1"}
    with pytest.raises(chorus.ConfigError, match="started by mpirun: no chorus agent"):
        chorus.init(environment={**launched, "CHORUS_METRICS_SOCKET": str(tmp_path / "s")})
    agent = {"CHORUS_RANK": "0", "CHORUS_WORLD_SIZE": "1", "CHORUS_METRICS_PORT": "9400"}
    with pytest.raises(chorus.ConfigError, match="give `chorus run --metrics-port 9400`"):
        chorus.init(environment=agent)
    with pytest.raises(chorus.ConfigError, match="CHORUS_TRACE_STEPS=0:4 needs CHORUS_TRACE"):
        chorus.init(environment={**launched, "CHORUS_TRACE_STEPS": "0:4"})
