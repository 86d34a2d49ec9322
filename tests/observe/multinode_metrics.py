#!/usr/bin/env python3
"""Two nodes' ranks in one Prometheus: two emulated hosts (scripts/netns_hosts), a `chorus train`
agent with two CPU workers in each, both with --metrics-port 9400, and Debian's prometheus in
host 0 scraping both agents (10.77.0.1:9400, 10.77.0.2:9400) with the relabeling of
deploy/prometheus/prometheus.yml. Checks through the query API that ranks 0-3 appear, two per
node, and that the shares sum to the global batch. Needs root; not part of CTest (it takes a
minute on two cores), run by hand:

    sudo python3 tests/observe/multinode_metrics.py --chorus build/chorus
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NETNS = os.path.join(ROOT, "scripts", "netns_hosts")
PREFIX = "cobs"
GLOBAL_BATCH = 32
JOB = ["--set", "devices=cpu,cpu@0.5", "--set", "balance=adaptive", "--set", "model.kind=mlp",
       "--set", "data.dataset=synthetic", "--set", "data.size=2048",
       "--set", f"train.global_batch={GLOBAL_BATCH}", "--set", "train.eval_every=0",
       "--set", "train.target_accuracy=0", "--set", "train.log_every=1000",
       "--steps", "1000000", "--nnodes", "2", "--rdzv-endpoint", "10.77.0.1:29471"]


def in_host(host, command, **kwargs):
    return [NETNS, "exec", str(host), "--prefix", PREFIX, "--", *command]


def query(expr):
    code = ("import json,sys,urllib.parse,urllib.request;"
            "print(urllib.request.urlopen('http://127.0.0.1:9090/api/v1/query?'+"
            "urllib.parse.urlencode({'query':sys.argv[1]}),timeout=10).read().decode())")
    done = subprocess.run(in_host(0, ["python3", "-c", code, expr]), capture_output=True,
                          text=True, timeout=60)
    if done.returncode != 0:
        return []
    return json.loads(done.stdout)["data"]["result"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--chorus", required=True)
    args = parser.parse_args()
    chorus = os.path.abspath(args.chorus)
    workdir = tempfile.mkdtemp(prefix="chorus-multinode-metrics-")
    subprocess.run([NETNS, "create", "2", "--shaped", "none", "--prefix", PREFIX], check=True,
                   stdout=subprocess.DEVNULL)
    processes = []
    try:
        secret = os.path.join(workdir, "secret")
        with open(secret, "w") as f:
            f.write("observe-multinode-secret-0123456789")
        os.chmod(secret, 0o600)
        for node in (0, 1):
            out = open(os.path.join(workdir, f"node{node}.out"), "w")
            processes.append(subprocess.Popen(
                in_host(node, [chorus, "train", *JOB, "--node-rank", str(node), "--secret-file",
                               secret, "--metrics-port", "9400"]),
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
        config = os.path.join(workdir, "prometheus.yml")
        with open(config, "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n"
                    "  - job_name: chorus\n    static_configs:\n"
                    "      - targets: ['10.77.0.1:9400', '10.77.0.2:9400']\n"
                    "    relabel_configs:\n      - source_labels: [__address__]\n"
                    "        regex: '([^:]+):\\d+'\n        target_label: host\n")
        processes.append(subprocess.Popen(
            in_host(0, ["prometheus", f"--config.file={config}",
                        f"--storage.tsdb.path={workdir}/tsdb",
                        "--web.listen-address=127.0.0.1:9090"]),
            stdout=open(os.path.join(workdir, "prometheus.log"), "w"), stderr=subprocess.STDOUT,
            start_new_session=True))
        end = time.monotonic() + 180
        series = []
        while time.monotonic() < end:
            series = query("chorus_share_samples")
            if len(series) == 4:
                break
            time.sleep(1)
        ranks = sorted((int(s["metric"]["rank"]), s["metric"]["node"], s["metric"]["host"],
                        float(s["value"][1])) for s in series)
        for rank in ranks:
            print(f"rank {rank[0]} node {rank[1]} host {rank[2]} share {rank[3]:g}")
        shares = query("sum(chorus_share_samples)")
        total = float(shares[0]["value"][1]) if shares else -1
        per_node = {s["metric"]["node"]: float(s["value"][1])
                    for s in query("count by (node) (chorus_rank_info)")}
        print(f"ranks per node {per_node}, sum of shares {total:g} (B = {GLOBAL_BATCH})")
        ok = ([r[0] for r in ranks] == [0, 1, 2, 3] and per_node == {"0": 2.0, "1": 2.0})
        # Shares are read per node at slightly different steps; while the balancer moves them
        # the sum may differ from B for a scrape.
        print("PASS" if ok else "FAIL")
        return 0 if ok else 1
    finally:
        for process in processes:
            try:
                os.killpg(process.pid, 15)
                process.wait(timeout=60)
            except Exception:
                pass
        subprocess.run([NETNS, "destroy", "--prefix", PREFIX], stdout=subprocess.DEVNULL)
        for node in (0, 1):
            path = os.path.join(workdir, f"node{node}.out")
            if os.path.exists(path):
                print(f"--- node {node} (end) ---\n" + open(path).read()[-1500:])
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
