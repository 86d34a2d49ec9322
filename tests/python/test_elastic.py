"""Elastic training from Python (CTest python_elastic, labels python and multiproc).

tests/python/workers/elastic_train.py runs on three CPU workers under `chorus run --elastic` with
fixed shares {10, 20, 34} of a global batch of 64, SGD with momentum, through
chorus.elastic_steps. One worker injects its own fault at the start of a step (SIGKILL, or SIGSTOP
until the survivors are done). The job must finish with exit code 0, every step logged exactly
once by rank 0 of its generation, the lost rank's samples spread over the survivors (shares
[15, 49] without member 1, [24, 40] without member 0, [21, 43] without member 2), and the
survivors' parameters and momentum identical to each other and within 1e-6 (relative) of a job
that lost nobody, and of single-process PyTorch on the same global batches.
"""

import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

from conftest import WORKERS, _chorus_cli
from test_multirank import max_relative_error, reference_parameters

pytestmark = pytest.mark.multiproc

STEPS = 20
COMMON = ("--steps", STEPS, "--global-batch", 64, "--shares", "10,20,34", "--lr", 0.1,
          "--momentum", 0.9)
_uninterrupted = {}


def command(out, *args, devices="cpu,cpu,cpu", launcher_args=()):
    return [_chorus_cli(), "run", "--elastic", "--devices", devices, *map(str, launcher_args),
            "--", sys.executable, os.path.join(WORKERS, "elastic_train.py"), str(out),
            *map(str, args)]


def run(out, *args, **kwargs):
    done = subprocess.run(command(out, *args, **kwargs), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=180)
    return done.returncode, done.stdout


def load(out, member):
    return torch.load(os.path.join(out, f"member{member}.pt"))


def logged_steps(output):
    """(step, generation) of every STEP line, in the order written."""
    return [(int(s), int(g)) for s, g in re.findall(r"STEP (\d+) generation (\d+)", output)]


def uninterrupted(tmp_path_factory):
    """The same job, no fault: its member 0's record (run once)."""
    if "record" not in _uninterrupted:
        out = tmp_path_factory.mktemp("uninterrupted")
        code, output = run(out, *COMMON)
        assert code == 0, output
        assert logged_steps(output) == [(s, 0) for s in range(STEPS)], output
        _uninterrupted["record"] = load(out, 0)
    return _uninterrupted["record"]


def check_survivors(out, output, survivors, fault_step, shares_after, tmp_path_factory):
    # Every step once, by rank 0 of the generation that completed it.
    assert logged_steps(output) == [(s, 0 if s < fault_step else 1) for s in range(STEPS)], output
    expected, _ = reference_parameters(STEPS, 64, lr=0.1, momentum=0.9)
    baseline = uninterrupted(tmp_path_factory)
    records = [load(out, member) for member in survivors]
    for rank, record in enumerate(records):
        assert record["steps"] == list(range(STEPS))  # each member too: none skipped or redone
        assert record["shares"] == [[10, 20, 34]] * fault_step + \
            [shares_after] * (STEPS - fault_step)
        assert (record["rank"], record["world_size"]) == (rank, 2)
        [recovery] = record["recoveries"]
        assert recovery["members"] == survivors and recovery["step"] == fault_step
        assert recovery["shares"] == shares_after
        assert max_relative_error(record["parameters"], expected) < 1e-6
        assert max_relative_error(record["parameters"], baseline["parameters"]) < 1e-6
        assert max_relative_error(record["momentum"], baseline["momentum"]) < 1e-6
    for name in ("parameters", "momentum"):
        for a, b in zip(records[0][name], records[1][name]):
            assert torch.equal(a, b), name
    return records


@pytest.mark.parametrize("member,shares_after", [(1, [15, 49]), (0, [24, 40])])
def test_a_killed_worker_leaves_the_survivors_to_finish_every_step_once(
        member, shares_after, tmp_path, tmp_path_factory):
    # Member 0 is rank 0: the log's writer and, until then, the source of every generation. When
    # member 1 dies, member 2 holds its backward until the loss aborted its world, so that its
    # buckets' all-reduces fail inside autograd (torch's RuntimeError from backward()), while
    # member 0 meets the loss at the end of the reduction (chorus.PeerFailure or CommError).
    hold = 2 if member == 1 else -1
    code, output = run(tmp_path, *COMMON, "--fault-member", member, "--fault-step", 8,
                       "--hold-member", hold)
    assert code == 0, output
    survivors = [m for m in range(3) if m != member]
    records = check_survivors(tmp_path, output, survivors, 8, shares_after, tmp_path_factory)
    assert records[0]["recoveries"][0]["lost"] == [member]
    assert f"generation 1: lost rank {member} " in output
    assert not os.path.exists(tmp_path / f"member{member}.pt")
    if hold >= 0:
        assert f"HELD member {hold}: backward raised RuntimeError" in output, output


def test_a_stopped_worker_is_left_out_after_its_missed_heartbeats(tmp_path, tmp_path_factory):
    # SIGSTOP: the process lives on and its agent reports nothing; only its missed heartbeats
    # (0.5 s x 3) tell the others. Continued once they finished, it finds itself left out.
    job = subprocess.Popen(command(tmp_path, *COMMON, "--fault-member", 2, "--fault-step", 6,
                                   "--fault", "stop", "--heartbeat", 0.5),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    stopped = None
    try:
        deadline = time.monotonic() + 150
        while not all(os.path.exists(tmp_path / f"member{m}.pt") for m in (0, 1)):
            assert job.poll() is None and time.monotonic() < deadline, job.communicate()[0]
            time.sleep(0.2)
        with open(tmp_path / "stopped.pid") as f:
            stopped = int(f.read())
        os.kill(stopped, signal.SIGCONT)
        output, _ = job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            if stopped is not None:
                os.kill(stopped, signal.SIGCONT)
            job.kill()
            job.communicate()
    assert job.returncode == 0, output
    records = check_survivors(tmp_path, output, [0, 1], 6, [21, 43], tmp_path_factory)
    recovery = records[0]["recoveries"][0]
    assert recovery["lost"] == [2]
    assert "rank 2 missed 3 heartbeats" in recovery["reason"], recovery
    assert re.search(r"LEFT OUT member 2: elastic: rank 2 was left out of the job", output), output


def run_snippet(code, launcher=None, timeout=120):
    """Runs `code` in a fresh interpreter (alone, or under `chorus run ...`)."""
    argv = [sys.executable, "-c", code]
    if launcher is not None:
        argv = [_chorus_cli(), "run", *launcher, "--", *argv]
    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)
    return done.returncode, done.stdout


REFUSED = """
import chorus, torch
try:
    {call}
except chorus.ConfigError as error:
    print("REFUSED", error)
"""


def test_elastic_is_refused_where_no_elastic_agent_keeps_the_others_alive():
    call = "chorus.init(elastic=True)"
    for launcher in (None, ("--devices", "cpu")):
        code, output = run_snippet(REFUSED.format(call=call), launcher)
        assert code == 0 and "REFUSED elastic:" in output, output
    code, output = run_snippet("import chorus; print('ELASTIC', chorus.init().elastic)",
                               ("--elastic", "--devices", "cpu"))
    assert code == 0 and "ELASTIC True" in output, output
    code, output = run_snippet("import chorus; print('ELASTIC', chorus.init().elastic)",
                               ("--devices", "cpu"))
    assert code == 0 and "ELASTIC False" in output, output


def test_zero_under_elastic_and_a_loader_without_shard_sampler_are_refused():
    call = "chorus.init(); chorus.DataParallel(torch.nn.Linear(2, 2), 4, zero=1)"
    code, output = run_snippet(REFUSED.format(call=call), ("--elastic", "--devices", "cpu"))
    assert code == 0 and "REFUSED DataParallel(zero=1) in an elastic job" in output, output
    call = ("chorus.init(); m = chorus.DataParallel(torch.nn.Linear(2, 2), 4); "
            "chorus.elastic_steps(torch.utils.data.DataLoader(range(8), batch_size=4), "
            "lambda b: None, torch.optim.SGD(m.parameters(), lr=0.1), 2)")
    code, output = run_snippet(REFUSED.format(call=call))
    assert code == 0 and "REFUSED chorus.elastic_steps needs a DataLoader" in output, output


def test_a_replacement_is_refused_and_the_survivor_finishes(tmp_path):
    # `--max-restarts` starts a replacement that would join the running job: the Python front
    # does not admit joiners, so it stops with a ConfigError, and the survivor trains on alone.
    code, output = run(tmp_path, "--steps", 8, "--global-batch", 64, "--shares", "24,40",
                       "--fault-member", 1, "--fault-step", 3, devices="cpu,cpu",
                       launcher_args=("--max-restarts", 1))
    assert code == 0, output
    assert "the Python front does not admit joining workers" in output, output
    assert logged_steps(output) == [(s, 0 if s < 3 else 1) for s in range(8)], output
    record = load(tmp_path, 0)
    assert record["shares"] == [[24, 40]] * 3 + [[64]] * 5
