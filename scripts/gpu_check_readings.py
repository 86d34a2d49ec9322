"""Readers for scripts/gpu-check of what its tools and runs leave: the tests ctest did not run,
NVML's figures through nvidia-smi (once, or sampled while a job runs), and a precision run's
held-out figures from its JSON step log. No side effects beyond running nvidia-smi."""

import os
import re
import subprocess
import threading
import xml.etree.ElementTree as ElementTree

NVIDIA_SMI_FIELDS = ["index", "name", "pci.bus_id", "utilization.gpu", "memory.used",
                     "memory.total", "power.draw", "power.limit", "temperature.gpu",
                     "clocks.sm", "driver_version"]


def skipped_tests(junit, output):
    """The names of the tests ctest did not run (a GTEST_SKIP, a skip return code), with why:
    from its JUnit file when there is one (ctest 3.21+), else its "did not run" lines."""
    skipped = []
    if os.path.exists(junit):
        for case in ElementTree.parse(junit).getroot().iter("testcase"):
            marker = case.find("skipped")
            if case.get("status") in ("notrun", "disabled") or marker is not None:
                lines = (case.findtext("system-out") or "").splitlines()
                why = [line.strip() for i, line in enumerate(lines)
                       if i > 0 and lines[i - 1].rstrip().endswith(": Skipped")]
                skipped.append({"name": case.get("name"), "why": why[0] if why else
                                (marker.get("message") if marker is not None else "not run")})
        return skipped
    for match in re.finditer(r"^\s*\d+ - (\S+) \((Skipped|Not Run|Disabled)\)", output, re.M):
        skipped.append({"name": match.group(1), "why": match.group(2)})
    return skipped


def held_out(code, output, steps):
    """A precision run's figures: its first training loss, the held-out loss and accuracy of its
    last evaluation, whether every logged loss was finite, steps skipped on overflow."""
    result = {"ok": code == 0 and len(steps) > 0, "exit": code}
    losses = [s.get("loss") for s in steps]
    result["finite"] = bool(losses) and all(isinstance(x, (int, float)) for x in losses)
    evaluated = [s for s in steps if isinstance(s.get("test_loss"), (int, float))]
    if steps and result["finite"]:
        result["first_loss"] = round(losses[0], 4)
        result["last_loss"] = round(losses[-1], 4)
    if evaluated:
        result["held_out_loss"] = round(evaluated[-1]["test_loss"], 4)
        result["held_out_accuracy"] = round(evaluated[-1].get("test_accuracy") or 0, 4)
    result["skipped_steps"] = sum(1 for s in steps if s.get("skipped"))
    if not result["ok"]:
        result["output"] = output[-3000:]
    return result


def nvidia_smi():
    """One reading of every GPU by `nvidia-smi --query-gpu` (NVML): a dict per GPU, figures as
    numbers where they are; None without nvidia-smi or when it fails."""
    try:
        done = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(NVIDIA_SMI_FIELDS)}",
                               "--format=csv,noheader,nounits"], capture_output=True, text=True,
                              timeout=30, check=False)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    output = done.stdout
    gpus = []
    for line in output.strip().splitlines():
        values = [v.strip() for v in line.split(",")]
        if len(values) != len(NVIDIA_SMI_FIELDS):
            continue
        gpu = {}
        for field, value in zip(NVIDIA_SMI_FIELDS, values):
            try:
                gpu[field] = float(value) if field not in ("name", "pci.bus_id",
                                                           "driver_version") else value
            except ValueError:  # "[N/A]", "[Not Supported]"
                gpu[field] = None
        gpus.append(gpu)
    return gpus


class NvmlSampler:
    """Samples nvidia-smi every second on a thread while a `with` block runs; peaks() gives, per
    GPU index, the highest utilization (%), memory used (MiB) and power (W) seen."""

    FIGURES = ("utilization.gpu", "memory.used", "power.draw")

    def __init__(self):
        self.samples = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def loop(self):
        while not self.stop.is_set():
            reading = nvidia_smi()
            if reading is None:
                return
            self.samples.append(reading)
            self.stop.wait(1.0)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *unused):
        self.stop.set()
        self.thread.join()

    def peaks(self):
        peaks = {}
        for reading in self.samples:
            for gpu in reading:
                mine = peaks.setdefault(str(int(gpu["index"])), {"samples": 0})
                mine["samples"] += 1
                for figure in self.FIGURES:
                    if gpu.get(figure) is not None:
                        mine[figure] = max(mine.get(figure, 0), gpu[figure])
        return peaks
