#!/usr/bin/env python3
"""Planner validation: predicted against measured step time on this machine.

One run:
  1. describes this node with `chorus devices --cluster-toml` for each device set (matmul GFLOP/s
     and copy bandwidth measured now, scaled by each worker's emulated speed);
  2. calibrates, per model, from separate single-worker runs (`devices = "cpu@0.5"`) on the
     whole batch and on a quarter of it ("profiles measured on real runs", issue 7, never one of
     the runs validated below): the fraction of that matmul rate the model's layers reach (from
     the compute difference between the two batches), the fixed compute per layer and pass (what
     the line leaves at zero samples), and the host's work outside compute per step and per
     sample (step_s - compute_s at the two batches, less the optimizer step the cost model prices
     itself). At half speed the emulator's sleep absorbs the worker being descheduled by other
     processes (its compute is counted in thread CPU time), so step_s - compute_s is host work,
     not the load;
  2b. calibrates, per model and per number of workers in the device sets, how that many workers
     on this host slow each other: workers of equal speed (together about one core, like the
     validated sets) on equal shares. Their compute against step 2's prediction gives the node's
     core contention (the cluster file's [[node]] core_contention: a worker computes
     1 + c x min(1, the others' core fraction) times slower). And the link latency from
     `chorus bench comm` (2 shm ranks, 1 KiB all-reduce: 2 latencies of the ring), for the
     [[link_type]]'s latency_us. None of these is one of the validated runs. Every prediction
     takes the model's rate from step 2 (efficiency times the calibration cluster's matmul rate),
     whatever matmul rate a later `chorus devices` measured;
  3. runs `chorus train --log-json` for every (model, device set) case with the shares fixed in
     proportion to the speeds (`balancer.shares`), and takes the median step_s after warm-up;
  4. asks the cost model (`chorus plan --shares ... --json`) and the simulator (`chorus simulate`)
     for the same plan's step time, uncalibrated (the measured rates as they are) and calibrated
     (step 2's efficiency and host work), and contended (plus step 2b's contention and latency
     written into the cluster file); and plan = "auto"'s own pricing ("auto": `chorus plan
     --calibrate`, the job's model timed on this host as plan = "auto" times it, none of the runs
     above);
  5. the 2-stage pipeline: runs bench/pipeline_bench's heterogeneous case (cuts auto and even,
     1F1B, M = 8, B = 32) when the binary is built, else reads bench/results/pipeline.json, and
     predicts it with `chorus plan --cuts`.
Prints a table and writes bench/results/plan_validation.json (predicted, measured, error %).

    python3 bench/plan_validation.py --chorus build/chorus      # ~5 minutes on 2 cores
    python3 bench/plan_validation.py --repeats 3                # the median of 3 runs per job
"""

import argparse
import datetime
import importlib.util
import json
import os
import platform
import re
import statistics
import subprocess
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_JSON = os.path.join(REPO, "bench", "results", "plan_validation.json")
TARGET = 0.15  # issue 7: within 15%
TEXT = "/var/lib/chorus/data/mobydick.txt"
# The figures calibrate() measures and every calibrated prediction uses.
CALIBRATED = ("efficiency", "host_s", "host_per_sample_s", "layer_overhead_s")
# Contention calibration: per worker count, workers of this equal speed (together about the core
# that the validated sets of that size keep busy).
CONTENTION_SPEEDS = {2: 0.5, 3: 0.35}
# Emulated speed of the calibration runs (step 2): padding absorbs descheduling by the host's load.
CALIBRATION_SPEED = 0.5

# The zoo's models on their data sets (examples/*.toml sizes), each with its global batch.
MODELS = {
    "cnn": ({"kind": "cnn", "channels": 32, "blocks": 2, "groups": 8},
            {"dataset": "fashion-mnist"}, 64),
    "mlp": ({"kind": "mlp", "hidden": [256, 128]}, {"dataset": "fashion-mnist"}, 256),
    "gpt": ({"kind": "gpt", "layers": 4, "width": 128, "heads": 4, "context": 64},
            {"dataset": "text", "path": TEXT}, 16),
}
DEVICE_SETS = [[1.0, 0.5], [0.6, 0.3, 0.15]]
# bench/pipeline_bench.cc's heterogeneous case.
PIPELINE_MODEL = {"kind": "gpt", "layers": 8, "width": 128, "heads": 4, "context": 64, "vocab": 64}
PIPELINE_SPEEDS = [1.0, 0.4]
PIPELINE_SCALE = 0.25


def toml_value(value):
    """A Python value as TOML."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return repr(value)


def write_job(path, devices, model, data, batch, steps, shares):
    """A `chorus train` job file; the planner reads the same file for the model."""
    lines = [f"devices = {toml_value(devices)}", "seed = 1", "", "[train]",
             f"steps = {steps}", f"global_batch = {batch}", "eval_every = 0",
             "eval_samples = 64", f"log_every = {steps}", "", "[model]"]
    lines += [f"{k} = {toml_value(v)}" for k, v in model.items()]
    lines += ["", "[data]"] + [f"{k} = {toml_value(v)}" for k, v in data.items()]
    if shares:
        lines += ["", "[balancer]", f"shares = {toml_value(shares)}"]
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")


def run(command, timeout=900):
    """Run a command; raise with its output's tail when it fails; return stdout."""
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {proc.returncode}:\n"
                           f"{(proc.stdout + proc.stderr)[-3000:]}")
    return proc.stdout


def balanced_shares(speeds, batch):
    """Shares in proportion to the speeds, summing to `batch` (largest remainders)."""
    exact = [batch * s / sum(speeds) for s in speeds]
    shares = [max(1, int(e)) for e in exact]
    order = sorted(range(len(speeds)), key=lambda i: exact[i] - shares[i], reverse=True)
    for i in order[:batch - sum(shares)]:
        shares[i] += 1
    return shares


def train(args, job, warmup):
    """Runs a job --repeats times; per run the median step_s, slowest compute_s and step - slowest
    compute over the steps after warm-up; returns the median of each over the runs."""
    log = job.replace(".toml", ".jsonl")
    runs = []
    for _ in range(args.repeats):
        run([args.chorus, "train", job, "--log-json", log])
        with open(log, encoding="utf-8") as handle:
            steps = [json.loads(line) for line in handle if line.strip()]
        timed = [s for s in steps if s["step"] >= warmup]
        runs.append({"step_s": statistics.median(s["step_s"] for s in timed),
                     "max_compute_s": statistics.median(max(s["compute_s"]) for s in timed),
                     "host_s": statistics.median(s["step_s"] - max(s["compute_s"])
                                                 for s in timed)})
    result = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    result["steps"] = len(timed)
    result["runs"] = len(runs)
    return result


def predict(args, cluster, job, batch, fixed, calibration):
    """The cost model's and the simulator's step time of the fixed plan; `calibration` is None
    (the cost model's defaults) or a dict of the figures calibrate() measured: efficiency,
    host_s (per step), host_per_sample_s, layer_overhead_s."""
    extra = []
    if calibration:
        extra = [f"--calibration=*={calibration['efficiency']:.4f}",
                 f"--step-overhead-ms={1e3 * calibration['host_s']:.4f}",
                 f"--host-us-per-sample={1e6 * calibration.get('host_per_sample_s', 0):.4f}",
                 f"--layer-overhead-us={1e6 * calibration.get('layer_overhead_s', 30e-6):.4f}"]
    plan_file = job.replace(".toml", f"-plan{'-cal' if calibration else ''}.json")
    answer = json.loads(run([args.chorus, "plan", "--cluster", cluster, "--model", job,
                             "--global-batch", str(batch), "--precision", "fp32", "--json",
                             "--out", plan_file] + fixed + extra))
    predicted = answer["plans"][0]["predicted"]
    simulated = json.loads(run([args.chorus, "simulate", "--cluster", cluster, "--plan",
                                plan_file, "--json"] + extra))
    return {"cost_model_s": predicted["step_seconds"], "compute_s": predicted["compute_seconds"],
            "exposed_comm_s": predicted["exposed_comm_seconds"],
            "optimizer_s": predicted["optimizer_seconds"],
            "simulated_s": simulated["simulated_step_seconds"]}


def predict_auto(args, cluster, job, batch, fixed):
    """The cost model's step time calibrated from the job's model timed on this host alone
    (`chorus plan --calibrate`, runtime/job/compute_calibration.h), nothing from the runs above."""
    answer = json.loads(run([args.chorus, "plan", "--cluster", cluster, "--model", job,
                             "--global-batch", str(batch), "--precision", "fp32", "--json",
                             "--calibrate", "--threads", "1"] + fixed))
    return {"cost_model_s": answer["plans"][0]["predicted"]["step_seconds"],
            "compute_s": answer["plans"][0]["predicted"]["compute_seconds"]}


def describe(args, workdir, speeds):
    """`chorus devices --cluster-toml` for workers of these speeds (once per run); the file."""
    specs = ",".join(f"cpu@{s:g}" for s in speeds)
    path = os.path.join(workdir, "cluster-" + "-".join(f"{s:g}" for s in speeds) + ".toml")
    if not os.path.exists(path):
        run([args.chorus, "devices", "--cluster-toml", path, "--devices", specs])
        with open(path, encoding="utf-8") as handle:
            args.clusters[specs] = handle.read()
    return path


def base_rate(path):
    """The host's fp32 matmul rate (TFLOP/s) in a cluster file of `chorus devices`: the first
    type's rate over its emulated speed (its name, cpu@S)."""
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    name = re.search(r'^name = "(cpu[^"]*)"$', text[text.index("[[device_type]]"):], re.M).group(1)
    speed = float(re.match(r"cpu(?:@([\d.]+))?", name).group(1) or 1)
    return float(re.search(r"^fp32_tflops = ([\d.e+-]+)", text, re.M).group(1)) / speed


def scaled(calibration, cluster, reference, **override):
    """`calibration` for `cluster`: the efficiency against its own measured rate, so that the
    model's rate stays the one calibrated against `reference`; `override` replaces figures."""
    if not calibration:
        return None
    figures = {key: calibration[key] for key in CALIBRATED}
    figures["efficiency"] *= base_rate(reference) / base_rate(cluster)
    figures.update(override)
    return figures


def link_latency_us(args):
    """The shared-memory transport's latency: half a 1 KiB all-reduce of 2 ranks (median of 3)."""
    times = []
    for _ in range(3):
        rows = json.loads(run([args.chorus, "bench", "comm", "--ranks", "2", "--transports", "shm",
                               "--ops", "all_reduce", "-b", "1K", "-e", "1K", "-w", "20", "-n",
                               "200", "--json"]))
        times.append(rows[0]["time_s"])
    return statistics.median(times) / 2 * 1e6


def with_contention(text, contention, latency_us):
    """A cluster file of `chorus devices` with a measured core contention and link latency."""
    lines = []
    for line in text.splitlines():
        if line.startswith("latency_us = ") and latency_us is not None:
            line = f"latency_us = {latency_us:.3f}  # measured (bench/plan_validation.py)"
        lines.append(line)
        if line.startswith("intra_node_link = "):
            lines.append(f"core_contention = {contention:.4f}  # measured (bench/plan_validation.py)")
    return "\n".join(lines) + "\n"


def contended_cluster(args, workdir, speeds, name, calibration, latency=True):
    """The cluster file of `speeds` with `name`'s contention measured for as many workers (and
    the measured link latency)."""
    path = describe(args, workdir, speeds)
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    out = path.replace(".toml", f"-{name}{'' if latency else '-nolat'}.toml")
    with open(out, "w", encoding="utf-8") as handle:
        handle.write(with_contention(text, calibration["core_contention"][str(len(speeds))],
                                     calibration["latency_us"] if latency else None))
    return out


def calibrate_group(args, workdir, name, model, data, batch, single, workers):
    """`workers` workers of equal speed (together about one core, like the validated sets) on
    equal shares: how much this host slows each one's compute when that many share its cores
    (more workers than cores also means switching between them, and their caches with them)."""
    speed = CONTENTION_SPEEDS[workers]
    job = os.path.join(workdir, f"group{workers}-{name}.toml")
    shares = balanced_shares([speed] * workers, batch)
    write_job(job, ",".join([f"cpu@{speed:g}"] * workers), model, data, batch,
              args.warmup + args.steps, shares)
    group = train(args, job, args.warmup)
    cluster = describe(args, workdir, [speed] * workers)
    plan = predict(args, cluster, job, batch, ["--shares", ",".join(map(str, shares))],
                   scaled(single, cluster, args.reference))
    # Each worker computes 1 + c x min(1, the others' core fractions) times slower than alone.
    others = min(1.0, (workers - 1) * speed)
    contention = max(0.0, group["max_compute_s"] / plan["compute_s"] - 1) / others
    return {"step_s": group["step_s"], "max_compute_s": group["max_compute_s"],
            "host_s": group["host_s"], "predicted_compute_s": plan["compute_s"],
            "speed": speed, "core_contention": contention}


def alone_run(args, workdir, name, model, data, batch):
    """One worker at CALIBRATION_SPEED on `batch` samples; train()'s figures."""
    job = os.path.join(workdir, f"calibrate-{name}-{batch}.toml")
    write_job(job, f"cpu@{CALIBRATION_SPEED:g}", model, data, batch, args.warmup + args.steps,
              None)
    return job, train(args, job, args.warmup)


def calibrate(args, workdir, name, model, data, batch):
    """The model on this host, from one worker alone (half speed, no peers) on the whole batch B
    and on a quarter of it, b: two points of a line per figure, none of them a validated run.

    efficiency and layer overhead: the cost model's compute of a one-worker step at core fraction
    f is 3 L o / f + 3 F x / (rate e) for x samples. Its flop term at e = 1 predicts P(B) - P(b)
    for the measured compute difference m(B) - m(b), so e = (P(B) - P(b)) / (m(B) - m(b)); what
    the line leaves at x = 0 is the fixed part, 3 L o / f.
    host: the step outside compute (data, optimizer, bookkeeping) is h0 + h1 x: h1 per sample,
    which every data-parallel rank pays on its own share, and h0 per step."""
    small = max(1, batch // 4)
    job, alone = alone_run(args, workdir, name, model, data, batch)
    _, few = alone_run(args, workdir, name, model, data, small)
    cluster = describe(args, workdir, [CALIBRATION_SPEED])
    args.reference = cluster  # every efficiency is relative to this measured matmul rate
    flops_only = {"efficiency": 1.0, "host_s": 0.0, "layer_overhead_s": 0.0}
    plan = predict(args, cluster, job, batch, ["--shares", str(batch)], flops_only)
    plan_small = predict(args, cluster, job, small, ["--shares", str(small)], flops_only)
    with open(job.replace(".toml", "-plan-cal.json"), encoding="utf-8") as handle:
        layers = json.load(handle)["replicas"][0]["stages"][0]["last_layer"]
    slope = (alone["max_compute_s"] - few["max_compute_s"]) / (batch - small)
    efficiency = (plan["compute_s"] - plan_small["compute_s"]) / (batch - small) / max(1e-12,
                                                                                       slope)
    fixed = max(0.0, few["max_compute_s"] - slope * small)
    host_per_sample = max(0.0, (alone["host_s"] - few["host_s"]) / (batch - small))
    # The step outside compute includes the optimizer step, which the cost model prices itself.
    optimizer = plan["optimizer_s"]
    return {"measured_compute_s": alone["max_compute_s"],
            "measured_compute_small_s": few["max_compute_s"], "small_batch": small,
            "predicted_compute_s": plan["compute_s"],
            "efficiency": min(4.0, max(0.01, efficiency)),
            "layer_overhead_s": fixed * CALIBRATION_SPEED / (3 * layers),
            "host_s": max(0.0, alone["host_s"] - host_per_sample * batch - optimizer),
            "optimizer_s": optimizer,
            "host_per_sample_s": host_per_sample}


def error(predicted, measured):
    """Signed relative error of a prediction, in percent."""
    return 100.0 * (predicted - measured) / measured


def pipeline_case(args, workdir, gpt):
    """bench/pipeline_bench's heterogeneous 2-stage case: measured, predicted both ways."""
    measured_json = os.path.join(workdir, "pipeline.json")
    source = f"bench/pipeline_bench (this run; median of {args.repeats})"
    if os.access(args.pipeline_bench, os.X_OK):
        runs = []
        for _ in range(args.repeats):
            run([args.pipeline_bench, "--only", "hetero", "--speed-scale", str(PIPELINE_SCALE),
                 "--json", measured_json])
            with open(measured_json, encoding="utf-8") as handle:
                runs.append(json.load(handle)["hetero"])
        measured = runs[0]
        for cut in ("auto", "even"):
            measured[cut]["step_seconds"] = statistics.median(r[cut]["step_seconds"]
                                                              for r in runs)
    else:
        source = "bench/results/pipeline.json (committed)"
        with open(os.path.join(REPO, "bench", "results", "pipeline.json"),
                  encoding="utf-8") as handle:
            measured = json.load(handle)["hetero"]
    speeds = [s * PIPELINE_SCALE for s in PIPELINE_SPEEDS]
    cluster = describe(args, workdir, speeds)
    job = os.path.join(workdir, "pipeline-gpt.toml")
    write_job(job, ",".join(f"cpu@{s:g}" for s in speeds), PIPELINE_MODEL,
              {"dataset": "synthetic"}, 32, 1, None)
    rows = []
    for cut in ("auto", "even"):
        cuts = measured[cut]["cuts"]
        fixed = ["--cuts", ",".join(map(str, cuts)), "--micro-batches", "8", "--schedule", "1f1b"]
        raw = predict(args, cluster, job, 32, fixed, None)
        # The bench's threads run no data loader or trainer bookkeeping: efficiency only.
        cal = predict(args, cluster, job, 32, fixed,
                      scaled(gpt, cluster, args.reference, host_s=0.0, host_per_sample_s=0.0))
        # The bench's stages are threads of one process: contention applies, the latency of the
        # trainer's inter-process collectives does not.
        contended = predict(args, contended_cluster(args, workdir, speeds, "gpt", gpt, False),
                            job, 32, fixed,
                            scaled(gpt, cluster, args.reference, host_s=0.0,
                                   host_per_sample_s=0.0))
        rows.append(row(f"pipeline {cut} cuts {cuts}", "gpt (8 layers)", speeds,
                        measured[cut]["step_seconds"], raw, cal, source, contended))
        add_auto(rows[-1], predict_auto(args, cluster, job, 32, fixed))
    return rows


def load_multihost():
    """bench/multihost.py as a module: its network-namespace hosts and all-reduce runs."""
    spec = importlib.util.spec_from_file_location("multihost", os.path.join(REPO, "bench",
                                                                           "multihost.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def two_host_cluster(args, workdir, link):
    """This host's two CPU workers (`chorus devices --cluster-toml`) as two nodes of a cluster
    joined by the measured shaped link: `link` is (latency s, seconds per byte)."""
    with open(describe(args, workdir, [1.0, 1.0]), encoding="utf-8") as handle:
        text = handle.read()
    head = text[:text.index("[[node]]")]
    intra = re.search(r'^intra_node_link = "([^"]+)"', text, re.M).group(1)
    head = re.sub(r'^(name = "[^"]*")$', r'\1\ninter_node_link = "shaped"', head, count=1,
                  flags=re.M)
    latency, per_byte = link
    lines = [head.rstrip(), "", "[[link_type]]", 'name = "shaped"  # measured: 1 rank per host',
             f"bandwidth_gbs = {1e-9 / per_byte:.6f}", "efficiency = 1",
             f"latency_us = {1e6 * latency:.3f}"]
    for node in (0, 1):
        lines += ["", "[[node]]", f'name = "host{node}"', f'intra_node_link = "{intra}"',
                  'devices = [{ type = "cpu", count = 2 }]']
    path = os.path.join(workdir, "two-hosts.toml")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
    return path


def codec_ns_per_byte(args, size):
    """The fp16 codec's own cost on this host: a 2-rank shared-memory all-reduce of `size` with
    the codec minus without (the links are fast here, so the difference is encode + decode)."""
    rows = json.loads(run([args.chorus, "bench", "comm", "--ranks", "2", "--transports", "shm",
                           "--ops", "all_reduce", "--codecs", "none,fp16", "-b", size, "-e", size,
                           "-w", "1", "-n", "5", "--json"]))
    times = {r["codec"]: r["time_s"] for r in rows}
    return max(0.0, times["fp16"] - times["none"]) / rows[0]["size"] * 1e9


def multihost_cases(args, workdir):
    """The shaped two-host all-reduce (bench/multihost.py: 2 hosts x 2 ranks, host 0's link shaped
    to 1 Gbit/s, 64 MiB): measured flat, hierarchical and hierarchical + fp16 against `chorus
    plan --allreduce` on a cluster file whose link was measured separately (one rank per host,
    flat, 64 KiB and 64 MiB: 2 latencies + S per byte) and the codec's cost measured on one host."""
    multihost = load_multihost()
    setup = argparse.Namespace(build=os.path.dirname(os.path.abspath(args.chorus)), iters=3)
    timed = {}
    for size in ("64K", "64M"):
        setup.bytes = size
        rows = multihost.run_allreduce(setup, "1gbit", workdir, ["--modes", "flat"], devices="cpu")
        timed[rows[0]["bytes"]] = rows[0]["time_s"]
    (small, t_small), (big, t_big) = sorted(timed.items())
    per_byte = (t_big - t_small) / (big - small)
    link = (max(0.0, (t_small - small * per_byte) / 2), per_byte)
    codec = codec_ns_per_byte(args, "64M")
    cluster = two_host_cluster(args, workdir, link)
    setup.bytes = "64M"
    measured = multihost.run_allreduce(setup, "1gbit", workdir,
                                       ["--modes", "flat,hierarchical,hierarchical+fp16"])
    rows = []
    for line in measured:
        algorithm = "ring" if line["mode"] == "flat" else "hierarchical"
        compression = "fp16" if line["mode"].endswith("fp16") else "none"
        price = json.loads(run([args.chorus, "plan", "--cluster", cluster, "--allreduce",
                                str(line["bytes"]), "--algorithm", algorithm, "--compression",
                                compression, "--codec-ns-per-byte", f"{codec:.4f}", "--json"]))
        predicted = {"cost_model_s": price["seconds"], "simulated_s": price["seconds"],
                     "compute_s": 0.0}
        # One price for all three predictions: the link and the codec are measured, and the
        # all-reduce has no compute to calibrate.
        rows.append(row(f"2 hosts x 2, 1 Gbit/s: {line['mode']} all-reduce 64 MiB",
                        "all-reduce", [1.0] * 4, line["time_s"], predicted, predicted,
                        "bench/multihost.py's setup (this run)", predicted))
        # plan = "auto" prices the same collective with the same link: no compute to time.
        add_auto(rows[-1], predicted)
        rows[-1]["link"] = {"latency_s": link[0], "bandwidth_gbs": 1e-9 / per_byte,
                            "codec_ns_per_byte": codec}
    return rows


def row(case, model, speeds, measured, raw, cal, source, contended):
    """One line of the table."""
    return {"case": case, "model": model, "speeds": speeds, "measured_s": measured,
            "measured_by": source, "uncalibrated": raw, "calibrated": cal,
            "contended": contended,
            "error_contended_pct": error(contended["cost_model_s"], measured),
            "error_contended_simulated_pct": error(contended["simulated_s"], measured),
            "within_target_contended":
                abs(error(contended["cost_model_s"], measured)) <= 100 * TARGET,
            "error_pct": error(cal["cost_model_s"], measured),
            "error_uncalibrated_pct": error(raw["cost_model_s"], measured),
            "error_simulated_pct": error(cal["simulated_s"], measured),
            "within_target": abs(error(cal["cost_model_s"], measured)) <= 100 * TARGET}


def add_auto(line, auto):
    """plan = "auto"'s own prediction (predict_auto) and its error, into a row."""
    line["auto"] = auto
    line["error_auto_pct"] = error(auto["cost_model_s"], line["measured_s"])
    line["within_target_auto"] = abs(line["error_auto_pct"]) <= 100 * TARGET


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chorus", default=os.path.join(REPO, "build", "chorus"))
    parser.add_argument("--pipeline-bench", default=None,
                        help="default: bench/pipeline_bench next to --chorus")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=5, help="steps dropped first")
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs per job (calibrations and validated cases); the median counts")
    parser.add_argument("--models", default="cnn,mlp,gpt")
    parser.add_argument("--multihost", action="store_true",
                        help="also the shaped two-host all-reduce (needs root: network namespaces)")
    parser.add_argument("--json", default=DEFAULT_JSON)
    args = parser.parse_args()
    if args.pipeline_bench is None:
        args.pipeline_bench = os.path.join(os.path.dirname(args.chorus), "bench", "pipeline_bench")
    rows, calibrations, args.clusters = [], {}, {}
    load_start = os.getloadavg()
    args.latency_us = link_latency_us(args)
    with tempfile.TemporaryDirectory(prefix="plan-validation-") as workdir:
        for name in args.models.split(","):
            model, data, batch = MODELS[name]
            calibrations[name] = calibrate(args, workdir, name, model, data, batch)
            groups = {str(n): calibrate_group(args, workdir, name, model, data, batch,
                                              calibrations[name], n)
                      for n in sorted({len(speeds) for speeds in DEVICE_SETS})}
            calibrations[name]["groups"] = groups
            calibrations[name]["core_contention"] = {n: g["core_contention"]
                                                     for n, g in groups.items()}
            calibrations[name]["latency_us"] = args.latency_us
            calibration = calibrations[name]
            for speeds in DEVICE_SETS:
                cluster = describe(args, workdir, speeds)
                shares = balanced_shares(speeds, batch)
                job = os.path.join(workdir, f"{name}-{len(speeds)}.toml")
                devices = ",".join(f"cpu@{s:g}" for s in speeds)
                write_job(job, devices, model, data, batch, args.warmup + args.steps, shares)
                measured = train(args, job, args.warmup)
                fixed = ["--shares", ",".join(map(str, shares))]
                raw = predict(args, cluster, job, batch, fixed, None)
                cal = predict(args, cluster, job, batch, fixed,
                              scaled(calibration, cluster, args.reference))
                contended = predict(
                    args, contended_cluster(args, workdir, speeds, name, calibrations[name]),
                    job, batch, fixed, scaled(calibration, cluster, args.reference))
                rows.append(row(f"DP {devices} shares {shares}", name, speeds,
                                measured["step_s"], raw, cal, "chorus train --log-json",
                                contended))
                rows[-1]["measured_max_compute_s"] = measured["max_compute_s"]
                rows[-1]["error_contended_compute_pct"] = error(
                    contended["compute_s"], measured["max_compute_s"])
                rows[-1]["error_compute_pct"] = error(cal["compute_s"], measured["max_compute_s"])
                rows[-1]["measured_host_s"] = measured["host_s"]
                add_auto(rows[-1], predict_auto(args, cluster, job, batch, fixed))
                print_row(rows[-1])
        if "gpt" in calibrations:
            for line in pipeline_case(args, workdir, calibrations["gpt"]):
                rows.append(line)
                print_row(line)
        if args.multihost:
            for line in multihost_cases(args, workdir):
                rows.append(line)
                print_row(line)
    result = {"machine": {"cpus": os.cpu_count(), "processor": platform.processor() or "?",
                          "load_average_start": load_start,
                          "load_average": os.getloadavg(),
                          "date": datetime.date.today().isoformat()},
              "target_pct": 100 * TARGET, "steps": args.steps, "warmup": args.warmup,
              "repeats": args.repeats,
              "calibrations": calibrations, "rows": rows, "clusters": args.clusters}
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=1)
    for column, key in (("calibrated", "within_target"), ("contended", "within_target_contended"),
                        ("auto", "within_target_auto")):
        scored = [line for line in rows if key in line]
        print(f"{column}: {sum(line[key] for line in scored)} of {len(scored)} within "
              f"{100 * TARGET:.0f}%")
    print(f"wrote {args.json}; load average {os.getloadavg()}; calibrations:")
    for name, figures in calibrations.items():
        print(f"  {name}: " + describe_calibration(figures))


def describe_calibration(figures):
    """One model's calibrated figures in a line."""
    contention = ", ".join(f"{n} workers {c:.2f}" for n, c in figures["core_contention"].items())
    return (f"efficiency {figures['efficiency']:.2f}, layer overhead "
            f"{1e6 * figures['layer_overhead_s']:.1f} us, host {1e3 * figures['host_s']:.2f} ms "
            f"+ {1e6 * figures['host_per_sample_s']:.2f} us/sample, contention {contention}, "
            f"latency {figures['latency_us']:.2f} us")


def print_row(line):
    """One table row on stdout as soon as it is known."""
    print(f"{line['case']:<48} {line['model']:<14} measured {line['measured_s']:.4f} s  "
          f"predicted {line['calibrated']['cost_model_s']:.4f} s ({line['error_pct']:+.1f}%)  "
          f"sim {line['calibrated']['simulated_s']:.4f} s  "
          f"uncalibrated {line['uncalibrated']['cost_model_s']:.4f} s "
          f"({line['error_uncalibrated_pct']:+.1f}%)  "
          + (f"auto {line['auto']['cost_model_s']:.4f} s ({line['error_auto_pct']:+.1f}%)  "
             if "auto" in line else "")
          + f"contended {line['contended']['cost_model_s']:.4f} s "
          f"({line['error_contended_pct']:+.1f}%; compute "
          f"{line.get('error_contended_compute_pct', float('nan')):+.1f}%)", flush=True)


if __name__ == "__main__":
    main()
