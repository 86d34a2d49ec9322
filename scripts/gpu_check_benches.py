"""gpu-check's benchmark checks (issue 38's GPU criteria): chorus on one GPU against a plain
PyTorch loop (bench/single_device.py), and a CPU beside the GPU against the GPU alone
(bench/weak_device.py). Each runs the benchmark script as a user would, reads its JSON and judges
it by the targets below; the figures go into gpu-check's report either way.

Targets: chorus / PyTorch >= 0.95 on the small CNN and >= 0.98 on the large CNN and the GPT in bf16
(median of the pairs); `cuda:0,cpu` >= 0.98 of `cuda:0` alone. One pair per row on the GPU machine
(its time is short; each row is a paired run in one process tree, so the ratio still compares like
with like).
"""

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (model, dtype) -> the least chorus / PyTorch that passes.
SINGLE_DEVICE_TARGETS = {("cnn-small", "fp32"): 0.95, ("cnn-small", "bf16"): 0.95,
                         ("cnn-large", "fp32"): 0.98, ("cnn-large", "bf16"): 0.98,
                         ("gpt", "bf16"): 0.98, ("gpt2-small", "bf16"): 0.98}
WEAK_DEVICE_TARGET = 0.98


def _run(command, timeout):
    try:
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                              check=False)
        return done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired:
        return -1, f"(timed out after {timeout} s)"


def single_device(chorus, device, workdir, judge=True, pairs=1, timeout=420):
    """bench/single_device.py on `device`: every model, fp32 and bf16. Not `judge`: the figures
    only (a rehearsal on a CPU, whose ratios the GPU targets do not concern)."""
    out = os.path.join(workdir, "single_device.json")
    code, output = _run([sys.executable, os.path.join(REPO, "bench", "single_device.py"),
                         "--device", device, "--pairs", str(pairs), "--chorus", chorus,
                         "--out", out], timeout)
    if code != 0 or not os.path.exists(out):
        return {"ok": False, "exit": code, "output": output[-3000:]}
    with open(out, encoding="utf-8") as handle:
        data = json.load(handle)
    rows = data if isinstance(data, list) else data.get("rows", [])
    result = {"ok": True, "rows": []}
    for row in rows:
        key = (row.get("model"), row.get("dtype"))
        ratio = row.get("chorus_over_pytorch")
        target = SINGLE_DEVICE_TARGETS.get(key)
        met = not judge or target is None or (ratio is not None and ratio >= target)
        result["rows"].append({"model": key[0], "dtype": key[1], "chorus_over_pytorch": ratio,
                               "chorus_samples_per_s": row.get("chorus_samples_per_s"),
                               "pytorch_samples_per_s": row.get("pytorch_samples_per_s"),
                               "mfu": row.get("mfu"), "target": target, "met": met})
        result["ok"] = result["ok"] and met
    return result


def weak_device(chorus, strong, weak, workdir, batch, judge=True, pairs=2, timeout=300):
    """bench/weak_device.py: `strong` alone against `strong,weak` on synthetic data (judged as
    single_device)."""
    out = os.path.join(workdir, "weak_device.json")
    code, output = _run([sys.executable, os.path.join(REPO, "bench", "weak_device.py"),
                         "--strong", strong, "--weak", weak, "--synthetic", "--batch", str(batch),
                         "--pairs", str(pairs), "--chorus", chorus, "--out", out], timeout)
    if code != 0 or not os.path.exists(out):
        return {"ok": False, "exit": code, "output": output[-3000:]}
    with open(out, encoding="utf-8") as handle:
        data = json.load(handle)
    return {"ok": not judge or data["ratio_median"] >= WEAK_DEVICE_TARGET,
            "target": WEAK_DEVICE_TARGET,
            "ratio_median": round(data["ratio_median"], 3), "ratio_min": round(data["ratio_min"], 3),
            "pairs": data["pairs"]}
