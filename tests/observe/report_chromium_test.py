#!/usr/bin/env python3
"""`chorus report` on the log of a real `chorus train` run, loaded in headless Chromium: the DOM
has every plot with a line of points per rank, the summary names the ranks, and a screenshot is
taken.

Usage: report_chromium_test.py --chorus BUILD/tools/chorus/chorus [--screenshot PATH] [--html PATH]
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

RANKS = 3
STEPS = 12
JOB = ["--set", "devices=cpu,cpu@0.5,cpu@0.25", "--set", "model.kind=mlp",
       "--set", "data.dataset=synthetic", "--set", "data.size=1024",
       "--set", "train.global_batch=48", "--set", "train.eval_every=4",
       "--set", "train.eval_samples=64", "--set", "train.target_accuracy=0",
       "--steps", str(STEPS)]


def run(command, **kwargs):
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, **kwargs)
    if done.returncode != 0:
        raise SystemExit(f"FAIL: {' '.join(command)} exited {done.returncode}:\n"
                         f"{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return done.stdout


def chromium(args, workdir):
    return run(["chromium", "--headless=new", "--no-sandbox", "--disable-gpu",
                "--disable-dev-shm-usage", "--no-first-run", "--hide-scrollbars",
                f"--user-data-dir={os.path.join(workdir, 'profile')}",
                "--window-size=1400,1200", *args])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--chorus", required=True)
    parser.add_argument("--screenshot")
    parser.add_argument("--html")
    args = parser.parse_args()
    if not shutil.which("chromium"):
        print("FAIL: chromium is not installed (scripts/setup installs it)")
        return 1
    workdir = tempfile.mkdtemp(prefix="chorus-report-")
    try:
        log = os.path.join(workdir, "run.jsonl")
        html = args.html or os.path.join(workdir, "report.html")
        run([args.chorus, "train", *JOB, "--log-json", log])
        print(run([args.chorus, "report", log, "--out", html]).strip())
        dom = chromium(["--dump-dom", "file://" + os.path.abspath(html)], workdir)
        plots = re.findall(r'<svg [^>]*data-title="([^"]+)".*?</svg>', dom, re.S)
        expected = ["Loss", "Test accuracy", "Throughput against the ideal",
                    "Share of the global batch per rank", "Compute per rank",
                    "Wait for the all-reduce per rank"]
        if plots != expected:
            print(f"FAIL: plots {plots}, expected {expected}")
            return 1
        for title in expected[3:]:
            svg = re.search(rf'<svg [^>]*data-title="{re.escape(title)}".*?</svg>', dom, re.S)
            lines = dict(re.findall(r'data-series="rank (\d+)" data-points="(\d+)"', svg.group(0)))
            if sorted(map(int, lines)) != list(range(RANKS)) or \
                    any(int(n) != STEPS for n in lines.values()):
                print(f"FAIL: {title}: lines {lines}, expected {STEPS} points for each of "
                      f"{RANKS} ranks")
                return 1
        accuracy = re.search(r'data-series="test accuracy" data-points="(\d+)"', dom)
        if not accuracy or int(accuracy.group(1)) < 2:
            print("FAIL: the accuracy plot has no evaluations")
            return 1
        ranks = re.search(r'<td id="summary-ranks">(\d+)</td>', dom)
        throughput = re.search(r'<td id="summary-throughput">([^<]+)</td>', dom)
        if not ranks or int(ranks.group(1)) != RANKS:
            print("FAIL: the summary does not name 3 ranks")
            return 1
        screenshot = args.screenshot or os.path.join(workdir, "report.png")
        chromium([f"--screenshot={screenshot}", "file://" + os.path.abspath(html)], workdir)
        with open(screenshot, "rb") as f:
            if f.read(8) != b"\x89PNG\r\n\x1a\n":
                print("FAIL: no screenshot")
                return 1
        print(f"report: {len(plots)} plots, {RANKS} ranks x {STEPS} points, "
              f"{accuracy.group(1)} evaluations, samples/s {throughput.group(1)}, "
              f"screenshot {os.path.getsize(screenshot)} bytes")
        print("PASS")
        return 0
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
