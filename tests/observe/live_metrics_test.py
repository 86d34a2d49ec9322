#!/usr/bin/env python3
"""A running `chorus train --metrics-port 0` scraped by Debian's real Prometheus, every panel of the
Grafana dashboard evaluated against it, and the live page loaded in headless Chromium (a
screenshot and a DOM check). The test starts and stops every server itself.

Checks through Prometheus's HTTP query API, after at least two scrapes: one series per rank,
samples/s > 0, the shares sum to the global batch, the bytes counters increase; every panel query
of deploy/grafana/chorus.json returns data; the page's charts have a line with points for every
rank. Fails when the metrics endpoint returns nothing.

Usage: live_metrics_test.py --chorus BUILD/tools/chorus/chorus --dashboard deploy/grafana/chorus.json
       [--screenshot PATH]   (where to keep the page's screenshot; default: the temporary dir)
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
import xml.dom.minidom

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import script_support  # noqa: E402
from script_support import Failure, free_port  # noqa: E402

RANKS = 3
GLOBAL_BATCH = 48
JOB = [
    "--set", "devices=cpu,cpu@0.5,cpu@0.25/1GiB", "--set", "model.kind=mlp",
    "--set", "data.dataset=synthetic", "--set", "data.size=4096",
    "--set", f"train.global_batch={GLOBAL_BATCH}", "--set", "train.eval_every=10",
    "--set", "train.eval_samples=32", "--set", "train.target_accuracy=0",
    "--set", "train.log_every=1000", "--steps", "1000000",
]
# Generous deadlines for a loaded 2-core machine; none of them is an assertion on speed.
DEADLINE_S = 120


def get(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


# Any exception of the predicate's (a Failure too) is a server still starting.
def wait_for(what, predicate, deadline_s=DEADLINE_S, interval=0.25):
    return script_support.wait_for(what, predicate, deadline_s, interval)


class Prometheus:
    def __init__(self, workdir, target):
        self.port = free_port()
        config = os.path.join(workdir, "prometheus.yml")
        with open(config, "w") as out:
            out.write(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
                "scrape_configs:\n  - job_name: chorus\n    static_configs:\n"
                f"      - targets: ['{target}']\n")
        self.log = open(os.path.join(workdir, "prometheus.log"), "w")
        self.process = subprocess.Popen(
            ["prometheus", f"--config.file={config}",
             f"--storage.tsdb.path={os.path.join(workdir, 'tsdb')}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"

    def query(self, expr):
        text = get(f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        answer = json.loads(text)
        if answer["status"] != "success":
            raise Failure(f"query {expr!r}: {answer}")
        return answer["data"]["result"]

    def scrapes(self):
        """Successful scrapes of the chorus target so far."""
        result = self.query('sum(count_over_time(up{job="chorus"}[5m]))')
        return int(float(result[0]["value"][1])) if result else 0

    def stop(self):
        self.process.terminate()
        self.process.wait(timeout=30)
        self.log.close()


def start_train(chorus, workdir):
    log = open(os.path.join(workdir, "train.log"), "w+")
    process = subprocess.Popen([chorus, "train", *JOB, "--metrics-port", "0"], stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True)

    def announced_port():
        log.seek(0)
        found = re.search(r"metrics on http://[^:]+:(\d+)/metrics", log.read())
        if process.poll() is not None:
            log.seek(0)
            raise Failure(f"chorus train exited with {process.returncode}:\n{log.read()}")
        return int(found.group(1)) if found else None

    return process, log, wait_for("chorus train to announce its metrics port", announced_port)


def value(result):
    return float(result[0]["value"][1])


def check_prometheus(prometheus, port):
    wait_for("the target to be up", lambda: prometheus.query('up{job="chorus"} == 1'))
    # Steps must have run: the series exist once the first worker reported.
    wait_for("three ranks in Prometheus",
             lambda: len(prometheus.query("chorus_share_samples")) == RANKS)
    first_bytes = value(prometheus.query("sum(chorus_collective_bytes_total)"))
    before = prometheus.scrapes()
    wait_for("two more scrapes", lambda: prometheus.scrapes() >= before + 2)
    later_bytes = value(prometheus.query("sum(chorus_collective_bytes_total)"))
    ranks = sorted(int(r["metric"]["rank"]) for r in prometheus.query("chorus_share_samples"))
    shares = value(prometheus.query("sum(chorus_share_samples)"))
    samples_per_s = value(prometheus.query("chorus_samples_per_second"))
    step_count = value(prometheus.query("sum(chorus_step_seconds_count)"))
    devices = sorted(r["metric"]["device"] for r in prometheus.query("chorus_rank_info"))
    print(f"prometheus: ranks {ranks} devices {devices}, sum of shares {shares:g}, "
          f"samples/s {samples_per_s:.1f}, collective bytes {first_bytes:g} -> {later_bytes:g}, "
          f"{step_count:g} step observations, {prometheus.scrapes()} scrapes")
    if ranks != list(range(RANKS)):
        raise Failure(f"ranks {ranks}, expected 0..{RANKS - 1}")
    if [d.split("/")[0] for d in devices] != ["cpu", "cpu@0.25", "cpu@0.5"]:
        raise Failure(f"devices {devices}")
    if shares != GLOBAL_BATCH:
        raise Failure(f"the shares sum to {shares}, not the global batch {GLOBAL_BATCH}")
    if not samples_per_s > 0:
        raise Failure(f"samples/s is {samples_per_s}")
    if not later_bytes > first_bytes > 0:
        raise Failure(f"collective bytes did not increase: {first_bytes} -> {later_bytes}")


def panel_queries(dashboard_path):
    with open(dashboard_path) as f:
        dashboard = json.load(f)
    queries = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            queries.append((panel["title"], target["expr"]))
    return queries


def grafana_expr(expr):
    """The query Grafana would send: its variables replaced by what they stand for here."""
    return (expr.replace("$__rate_interval", "5s").replace("$__interval", "1s")
            .replace("$node", ".*").replace("$rank", ".*"))


def check_dashboard(prometheus, dashboard_path):
    queries = panel_queries(dashboard_path)
    if not queries:
        raise Failure(f"{dashboard_path} has no panel queries")
    empty = []
    for title, expr in queries:
        if not prometheus.query(grafana_expr(expr)):
            empty.append(f"{title}: {expr}")
    print(f"grafana: {len(queries) - len(empty)} of {len(queries)} panel queries return data")
    if empty:
        raise Failure("panel queries that return nothing:\n  " + "\n  ".join(empty))


def chromium(args, workdir):
    command = ["chromium", "--headless=new", "--no-sandbox", "--disable-gpu",
               "--disable-dev-shm-usage", "--no-first-run", "--hide-scrollbars",
               f"--user-data-dir={os.path.join(workdir, 'chromium-profile')}",
               "--virtual-time-budget=5000", "--window-size=1400,900", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=DEADLINE_S)
    if done.returncode != 0:
        raise Failure(f"chromium failed ({done.returncode}): {done.stderr[-2000:]}")
    return done.stdout


def check_page(port, workdir, screenshot):
    url = f"http://127.0.0.1:{port}/"
    dom = chromium(["--dump-dom", url], workdir)
    body = re.search(r"<body([^>]*)>", dom)
    updates = re.search(r'data-updates="(\d+)"', body.group(1)) if body else None
    shown_ranks = re.search(r'data-ranks="(\d+)"', body.group(1)) if body else None
    if not updates or int(updates.group(1)) < 1:
        raise Failure("the page never drew the agent's state:\n" + dom[:3000])
    if int(shown_ranks.group(1)) != RANKS:
        raise Failure(f"the page shows {shown_ranks.group(1)} ranks, expected {RANKS}")
    points = {}
    for chart in ("share", "compute", "wait", "memory"):
        svg = re.search(rf'<svg id="chart-{chart}".*?</svg>', dom, re.S)
        lines = re.findall(r'<polyline [^>]*data-rank="(\d+)" data-points="(\d+)"', svg.group(0))
        have = {int(rank): int(n) for rank, n in lines}
        if sorted(have) != list(range(RANKS)) or min(have.values()) < 1:
            raise Failure(f"chart {chart}: lines {have}, expected points for ranks 0..{RANKS - 1}")
        points[chart] = have
    for chart in ("throughput", "loss"):
        svg = re.search(rf'<svg id="chart-{chart}".*?</svg>', dom, re.S)
        if not re.search(r'data-points="[1-9]\d*"', svg.group(0)):
            raise Failure(f"chart {chart} has no points")
    alert = re.search(r'<div id="alerts"[^>]*>(.*?)</div>', dom, re.S).group(1)
    print(f"page: {updates.group(1)} updates, points per rank {points['share']}, alert line: {alert}")
    chromium([f"--screenshot={screenshot}", url], workdir)
    size = os.path.getsize(screenshot)
    with open(screenshot, "rb") as f:
        if f.read(8) != b"\x89PNG\r\n\x1a\n" or size < 10000:
            raise Failure(f"{screenshot} is not a screenshot ({size} bytes)")
    print(f"page: screenshot {screenshot} ({size} bytes)")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--chorus", required=True)
    parser.add_argument("--dashboard", required=True)
    parser.add_argument("--screenshot")
    args = parser.parse_args()
    for tool in ("prometheus", "chromium"):
        if not shutil.which(tool):
            print(f"FAIL: {tool} is not installed (scripts/setup installs it)")
            return 1
    workdir = tempfile.mkdtemp(prefix="chorus-live-metrics-")
    train = log = prometheus = None
    try:
        train, log, port = start_train(args.chorus, workdir)
        metrics = wait_for("a non-empty /metrics",
                           lambda: "chorus_share_samples" in get(f"http://127.0.0.1:{port}/metrics"))
        prometheus = Prometheus(workdir, f"127.0.0.1:{port}")
        check_prometheus(prometheus, port)
        check_dashboard(prometheus, args.dashboard)
        check_page(port, workdir, args.screenshot or os.path.join(workdir, "live_page.png"))
        print("PASS")
        return 0
    except Failure as failure:
        print(f"FAIL: {failure}")
        if log:
            log.seek(0)
            print("chorus train's output (end):\n" + log.read()[-3000:])
        return 1
    finally:
        if prometheus:
            prometheus.stop()
        if train and train.poll() is None:
            os.killpg(train.pid, signal.SIGTERM)
            try:
                train.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(train.pid, signal.SIGKILL)
                train.wait()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
