#!/usr/bin/env python3
"""All-reduce across emulated hosts over a shaped link, and PowerSGD on the GPT.

Creates two hosts as network namespaces (scripts/netns_hosts; host 0's link shaped by tbf), starts
one `chorus run` agent in each with two CPU workers running bench/multihost_allreduce, and collects
rank 0's rows: time, algbw, busbw, bytes that crossed host 0's link, and the error against the
known answer, for flat / hierarchical / 2d / hierarchical+fp16 / hierarchical+powersgd. Then runs
bench/powersgd_gpt (threads; no namespaces needed). Writes bench/results/multihost.json.

    sudo bench/multihost.py [--build build] [--bytes 64M] [--iters 3] [--rates 1gbit,none]
                            [--gpt-steps 200] [--no-gpt] [--out bench/results/multihost.json]

Needs root (network namespaces). Every ratio in the output is measured in the same run.
"""
import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "netns_hosts")
PREFIX = "cmb"
PORT = 29412


def hosts(*args):
    subprocess.run([SCRIPT, *args, "--prefix", PREFIX], check=True, stdout=subprocess.DEVNULL)


def in_host(host, command, output):
    line = [SCRIPT, "exec", str(host), "--prefix", PREFIX, "--", *command]
    with open(output, "w") as out:
        return subprocess.run(line, stdout=out, stderr=subprocess.STDOUT, timeout=900).returncode


def run_allreduce(args, rate, work, extra, devices="cpu,cpu"):
    """One job of 2 hosts x 2 ranks (or `devices` per host) with host 0's link at `rate`
    ("none": unshaped)."""
    hosts("create", "2", "--rate", rate if rate != "none" else "1gbit",
          "--shaped", "0" if rate != "none" else "none")
    try:
        secret = os.path.join(work, "secret")
        with open(secret, "w") as f:
            f.write("multihost-bench-secret-0123456789")
        os.chmod(secret, 0o600)
        chorus = os.path.join(args.build, "chorus")
        bench = os.path.join(args.build, "bench", "multihost_allreduce")
        rows = os.path.join(work, "rows.json")
        program = [bench, "--bytes", args.bytes, "--iters", str(args.iters), "--out", rows, *extra]

        def agent(node):
            return [chorus, "run", "--devices", devices, "--nnodes", "2", "--node-rank",
                    str(node), "--rdzv-endpoint", f"10.77.0.1:{PORT}", "--secret-file", secret,
                    "--timeout", "600", "--", *program]

        codes = {}
        second = threading.Thread(
            target=lambda: codes.__setitem__(1, in_host(1, agent(1), os.path.join(work, "n1"))))
        second.start()
        codes[0] = in_host(0, agent(0), os.path.join(work, "n0"))
        second.join()
        for node in (0, 1):
            if codes[node] != 0:
                sys.exit(f"node {node} failed ({codes[node]}):\n" +
                         open(os.path.join(work, f"n{node}")).read())
        print(open(os.path.join(work, "n0")).read(), end="")
        with open(rows) as f:
            result = json.load(f)
        for row in result:
            row["link_rate"] = rate
        return result
    finally:
        hosts("destroy")


def run_gpt(args, work):
    out = os.path.join(work, "gpt.json")
    command = [os.path.join(args.build, "bench", "powersgd_gpt"), "--steps", str(args.gpt_steps),
               "--out", out]
    code = subprocess.run(command).returncode
    with open(out) as f:
        result = json.load(f)
    result["meets_targets"] = code == 0
    return result


def table(rows):
    flat = {r["link_rate"]: r["time_s"] for r in rows if r["mode"] == "flat"}
    print(f"{'link':>6} {'mode':<36} {'time s':>8} {'algbw GB/s':>10} {'vs flat':>8}"
          f" {'link MiB (tx+rx)':>17} {'rel err':>9}")
    for r in rows:
        r["speedup_vs_flat"] = flat.get(r["link_rate"], r["time_s"]) / r["time_s"]
        name = r["mode"] + ("" if r["error_feedback"] or "+" not in r["mode"] else " (no EF)")
        crossed = (r["link_tx_bytes"] + r["link_rx_bytes"]) / 2**20
        print(f"{r['link_rate']:>6} {name:<36} {r['time_s']:8.3f} {r['algbw_gbs']:10.3f}"
              f" {r['speedup_vs_flat']:7.2f}x {crossed:17.1f} {r['relative_error']:9.2e}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--bytes", default="64M")
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--rates", default="1gbit")
    parser.add_argument("--gpt-steps", type=int, default=200)
    parser.add_argument("--no-gpt", action="store_true")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "multihost.json"))
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("multihost.py: needs root (network namespaces)")
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for rate in args.rates.split(","):
            rows += run_allreduce(args, rate, work, [])
            # The codecs once more without error feedback (PyTorch's fp16 hook has none): its
            # residual update is a full pass over the buffer per call.
            rows += run_allreduce(args, rate, work, [
                "--modes", "hierarchical+fp16,hierarchical+powersgd", "--error-feedback", "0"])
        table(rows)
        gpt = None if args.no_gpt else run_gpt(args, work)
    result = {
        "machine": f"{os.cpu_count()} vCPU, {platform.machine()}, Linux {platform.release()}",
        "date": datetime.date.today().isoformat(),
        "setup": "2 hosts (network namespaces, scripts/netns_hosts) x 2 CPU ranks; host 0's "
                 "link shaped with tc tbf; link bytes from host 0's eth0 counters per call",
        "allreduce": rows,
    }
    if gpt:
        for series in ("losses_fp32", "losses_powersgd"):
            gpt[series] = [round(x, 5) for x in gpt[series]]
        result["powersgd_gpt"] = gpt
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
