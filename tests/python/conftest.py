"""Fixtures of the Python front's tests (docs/python.md).

They import chorus from the build tree (CTest sets PYTHONPATH=build/python) or from an installed
package, and start multi-rank jobs through the `chorus` launcher: CHORUS_CLI (set by CTest) or
`chorus` on PATH (pip install puts it there).
"""

import os
import shutil
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
WORKERS = os.path.join(HERE, "workers")


def _chorus_cli():
    cli = os.environ.get("CHORUS_CLI") or shutil.which("chorus")
    if not cli:
        pytest.fail("the chorus launcher was not found: set CHORUS_CLI or put `chorus` on PATH")
    return cli


class Job:
    def __init__(self, returncode, output, seconds):
        self.returncode = returncode
        self.output = output
        self.seconds = seconds


@pytest.fixture
def run_job():
    """run_job(devices, worker, *args, timeout=..., launcher_args=()) -> Job."""

    def run(devices, worker, *args, timeout=240, launcher_args=()):
        command = [_chorus_cli(), "run", "--devices", devices, *map(str, launcher_args), "--",
                   sys.executable, os.path.join(WORKERS, worker), *map(str, args)]
        start = time.monotonic()
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=timeout)
        return Job(done.returncode, done.stdout, time.monotonic() - start)

    return run
