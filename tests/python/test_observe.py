"""`chorus run --metrics-port` and `--trace` for a Python program (CTest python_observe).

A 2-rank chorus.DataParallel job under `chorus run --metrics-port 0 --trace FILE` (workers/
observed.py): its agent's /metrics, read in Prometheus's text format while the finished workers
hold, has chorus train's series for both ranks with the values of the job (steps, shares, device,
loss, learning rate, memory, collective bytes); its merged trace has each rank's forward,
backward, bucket all-reduce, step figures and optimizer spans for the traced steps, and padding
only on the emulated rank; each rank's part is written once its last traced step ended, or at
its exit when the job ends within the range. Bad requests are refused before any worker starts,
and the agent's socket variable is refused in a process another launcher started (where the user's
CHORUS_METRICS_PORT and CHORUS_TRACE are served by the job itself: test_observe_launchers.py).
"""

import json
import math
import os
import re
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


def cli():
    return os.environ.get("CHORUS_CLI") or "chorus"


def wait_for(what, predicate, deadline_s=DEADLINE_S):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    pytest.fail(f"gave up after {deadline_s} s waiting for {what}")


def test_metrics_and_trace_of_a_python_job(tmp_path):
    hold = tmp_path / "hold"
    trace = tmp_path / "trace.json"
    log = open(tmp_path / "run.log", "w+")
    job = subprocess.Popen(
        [cli(), "run", "--devices", "cpu,cpu@0.25", "--metrics-port", "0", "--trace", str(trace),
         "--trace-steps", "0:4", "--", sys.executable, WORKER, "--steps", str(STEPS),
         "--global-batch", str(GLOBAL_BATCH), "--lr", str(LR), "--hold", str(hold),
         "--pause", "0.01"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def output():
        log.seek(0)
        return log.read()

    try:
        def port():
            assert job.poll() is None, f"chorus run exited {job.returncode}:\n{output()}"
            found = re.search(r"chorus run: metrics on http://[^:]+:(\d+)/metrics", output())
            return int(found.group(1)) if found else None

        url = f"http://127.0.0.1:{wait_for('the metrics port', port)}/metrics"

        def finished():
            assert job.poll() is None, f"chorus run exited {job.returncode}:\n{output()}"
            samples = parse_metrics(get(url))
            steps = by_rank(samples, "chorus_steps_total")
            return samples if steps == {"0": STEPS, "1": STEPS} else None

        samples = wait_for(f"both ranks' chorus_steps_total at {STEPS}", finished)
        text = get(url)
        assert "# TYPE chorus_steps_total counter" in text
        assert "# TYPE chorus_step_seconds histogram" in text
        info = {dict(labels)["rank"]: dict(labels) for labels in series(samples,
                                                                        "chorus_rank_info")}
        assert {r: i["device"] for r, i in info.items()} == {"0": "cpu", "1": "cpu@0.25"}
        assert {r: i["emulated"] for r, i in info.items()} == {"0": "false", "1": "true"}
        assert all(i["node"] == "0" for i in info.values())
        shares = by_rank(samples, "chorus_share_samples")
        assert sum(shares.values()) == GLOBAL_BATCH and min(shares.values()) >= 1
        assert list(series(samples, "chorus_global_batch_samples").values()) == [GLOBAL_BATCH]
        # Every step's report reached the agent (a dropped one would lose a histogram point).
        counts = by_rank(samples, "chorus_step_seconds_count")
        assert all(1 <= n <= STEPS for n in counts.values()), counts
        [loss] = series(samples, "chorus_loss").values()
        assert math.isfinite(loss) and 0.5 < loss < 5  # cross entropy over 5 classes
        assert list(series(samples, "chorus_learning_rate").values()) == [LR]
        [samples_per_s] = series(samples, "chorus_samples_per_second").values()
        assert samples_per_s > 0
        assert all(v > 0 for v in by_rank(samples, "chorus_compute_seconds_total").values())
        assert all(v > 0 for v in by_rank(samples, "chorus_memory_used_bytes").values())
        assert by_rank(samples, "chorus_pad_seconds_total")["1"] > 0
        assert by_rank(samples, "chorus_pad_seconds_total")["0"] == 0
        reduced = {dict(labels)["rank"]: value for labels, value
                   in series(samples, "chorus_collective_bytes_total").items()
                   if dict(labels)["op"] == "all_reduce"}
        assert set(reduced) == {"0", "1"} and min(reduced.values()) > 0
        # Each rank wrote its part as soon as its last traced step ended, not at its exit.
        assert sorted(p.name for p in tmp_path.glob("trace.json.rank*")) == [
            "trace.json.rank0", "trace.json.rank1"]
        hold.touch()
        job.wait(timeout=DEADLINE_S)
    finally:
        hold.touch()
        if job.poll() is None:
            job.kill()
            job.wait()
    out = output()
    assert job.returncode == 0, out
    assert f"chorus run: wrote the timeline of 2 ranks to {trace}" in out
    assert not [p for p in os.listdir(tmp_path) if ".rank" in p], os.listdir(tmp_path)
    events = json.loads(trace.read_text())["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    for rank in (0, 1):
        mine = [e for e in spans if e["args"]["rank"] == rank]
        assert {e["args"]["step"] for e in mine} == {0, 1, 2, 3}
        names = {e["name"] for e in mine}
        assert {"forward", "backward", "step figures", "optimizer"} <= names, names
        assert any(n.startswith("all_reduce bucket") for n in names), names
        # Only cpu@0.25 is padded: 3 times its compute, and at least in step 0, whose compute
        # (first calls) is too long for the run delay it is credited with to absorb that.
        assert ("pad" in names) == (rank == 1), names
        assert all(e["dur"] >= 0 for e in mine)
    assert {e["args"]["name"] for e in events if e["ph"] == "M"
            and e["name"] == "process_name"} == {"node 0"}


def test_an_elastic_recovery_shows_in_the_series_of_the_survivors(tmp_path):
    hold = tmp_path / "hold"
    log = open(tmp_path / "run.log", "w+")
    job = subprocess.Popen(
        [cli(), "run", "--elastic", "--devices", "cpu,cpu,cpu", "--metrics-port", "0", "--",
         sys.executable, WORKER, "--steps", str(STEPS), "--global-batch", str(GLOBAL_BATCH),
         "--kill-member", "1", "--kill-step", "3", "--hold", str(hold),
         "--pause", "0.01"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def output():
        log.seek(0)
        return log.read()

    try:
        def port():
            assert job.poll() is None, f"chorus run exited {job.returncode}:\n{output()}"
            found = re.search(r"chorus run: metrics on http://[^:]+:(\d+)/metrics", output())
            return int(found.group(1)) if found else None

        url = f"http://127.0.0.1:{wait_for('the metrics port', port)}/metrics"

        def finished():
            assert job.poll() is None, f"chorus run exited {job.returncode}:\n{output()}"
            samples = parse_metrics(get(url))
            steps = by_rank(samples, "chorus_steps_total")
            return samples if steps == {"0": STEPS, "2": STEPS} else None

        # Launch ranks 0 and 2 finish every step; rank 1's series left with it.
        samples = wait_for(f"the survivors' chorus_steps_total at {STEPS}", finished)
        assert list(series(samples, "chorus_elastic_generation").values()) == [1]
        assert list(series(samples, "chorus_elastic_recoveries_total").values()) == [1]
        assert list(series(samples, "chorus_elastic_lost_ranks").values()) == [1]
        assert sorted(by_rank(samples, "chorus_rank_info")) == ["0", "2"]
        assert sum(by_rank(samples, "chorus_share_samples").values()) == GLOBAL_BATCH
        hold.touch()
        job.wait(timeout=DEADLINE_S)
    finally:
        hold.touch()
        if job.poll() is None:
            job.kill()
            job.wait()
    assert job.returncode == 0, output()


def test_a_trace_the_job_ends_within_is_written_at_exit(tmp_path):
    trace = tmp_path / "trace.json"
    job = subprocess.run(
        [cli(), "run", "--devices", "cpu,cpu", "--trace", str(trace), "--trace-steps", "5:100",
         "--", sys.executable, WORKER, "--steps", "8", "--no-loss"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=DEADLINE_S)
    assert job.returncode == 0, job.stdout
    assert f"wrote the timeline of 2 ranks to {trace}" in job.stdout, job.stdout
    spans = [e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]
    for rank in (0, 1):
        assert {e["args"]["step"] for e in spans if e["args"]["rank"] == rank} == {5, 6, 7}


def run_refused(marker, *options, env=None):
    """`chorus run` of a worker that would leave `marker` behind, were it started."""
    return subprocess.run([cli(), "run", "--devices", "cpu", *options, "--", "touch",
                           str(marker)], capture_output=True, text=True, timeout=60,
                          env=None if env is None else dict(os.environ, **env))


def test_bad_requests_are_refused_before_any_worker(tmp_path):
    marker = tmp_path / "a worker ran"
    missing = run_refused(marker, "--trace", str(tmp_path / "no" / "dir" / "trace.json"))
    assert missing.returncode == 2 and "--trace: cannot write" in missing.stderr, missing.stderr
    backwards = run_refused(marker, "--trace", str(tmp_path / "t.json"), "--trace-steps", "6:2")
    assert backwards.returncode == 2 and "'6:2'" in backwards.stderr, backwards.stderr
    alone = run_refused(marker, "--trace-steps", "0:4")
    assert alone.returncode == 2 and "--trace-steps needs --trace" in alone.stderr, alone.stderr
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        taken = run_refused(marker, "--metrics-port", str(busy.getsockname()[1]))
    assert taken.returncode == 2 and "cannot listen" in taken.stderr, taken.stderr
    # The variables a user sets for mpirun or srun (test_observe_launchers.py) would reach the
    # workers, where no one merges or serves them: chorus run's options say it.
    for name, value in (("CHORUS_TRACE", str(tmp_path / "t.json")), ("CHORUS_METRICS_PORT", "0")):
        exported = run_refused(marker, env={name: value})
        assert exported.returncode == 2, exported.stderr
        assert f"{name}={value} is set in chorus run's environment" in exported.stderr, (
            exported.stderr)
    assert not marker.exists()
    # The same command with a request that can be served does start the worker.
    served = run_refused(marker, "--trace", str(tmp_path / "t.json"))
    assert served.returncode == 0 and marker.exists(), served.stdout + served.stderr
    assert "no worker recorded a step" in served.stdout, served.stdout


def test_the_agents_socket_is_refused_under_another_launcher(tmp_path):
    # CHORUS_TRACE and CHORUS_METRICS_PORT are the user's there (test_observe_launchers.py).
    environment = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1",
                   "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "1",
                   "CHORUS_METRICS_SOCKET": str(tmp_path / "socket")}
    with pytest.raises(chorus.ConfigError, match="started by mpirun: no chorus agent"):
        chorus.init(environment=environment)
