#!/usr/bin/env python3
"""Recovery time of chorus's elastic training against torchrun restarting from a checkpoint.

Seeded trials (kill step in [--first-step, --last-step], from 0 as CHORUS_FAULT's STEP; victim
rank 0..2; point forward|reduce|optimizer), each run in every mode, the order rotated per trial:
chorus-kill (`chorus train`, 3 CPU workers, the MLP [64, 32], elastic.enabled, CHORUS_FAULT
"RANK:POINT:STEP:KILL"); chorus-hung (STOP, found by the heartbeat, default 1000 ms x 3; the
victim is SIGCONTed once a step follows the recovery in the log) and chorus-hung-200
(heartbeat_ms = 200); torch (bench/elastic_torch.py: the job in DDP under `torchrun
--max-restarts 1`, checkpointing; the victim SIGKILLs itself at the same point of the same step).
chorus-replace (only with --modes): the chorus-kill job with `elastic.max_restarts = 1`, uneven
fixed shares `balancer.shares = [30, 40, 50]` and --replace-steps steps (default 1000, at the same
3-5 ms a step, so that the job outlasts the replacement's start of 0.5-2 s; no rank is slowed):
the agent starts a replacement for the victim, which joins the running job; the phases of the
join are read from the log lines' time stamps and the JSON log, and every trial is checked (exit
code 0, every step logged once, the replacement's launch share back: the step lines' shares
after the join are the launch shares in member order, the replacement last).
chorus-zero and chorus-zero-replica (only with --modes): the chorus-kill job sharded with ZeRO-2,
a checkpoint every --checkpoint-every steps; without replicas the survivors go back to the last
checkpoint, with `zero.redundancy = 1` they rebuild the lost slice from its replica. Besides the
phases: catch_up_s, from the kill until the interrupted step completed, and redone, the steps
logged again on the way.
chorus-pipeline and chorus-pipeline-replica (only with --modes): the chorus-kill job as a pipeline,
a checkpoint every --checkpoint-every steps: 3 stages of one replica on the 3 workers (a lost stage
has no copy: the survivors re-cut the model over two stages and go back to the last checkpoint),
and 2 stages x 2 replicas on 4 workers (the lost stage's copy in the other replica: one pipeline
of 3 stages from the members, only the interrupted step redone). A pipeline stage has no "reduce"
point: a trial drawn with it kills at "optimizer" there. The same figures as the ZeRO modes.
Each phase's definition is in docs/performance.md, "Elastic recovery"; min / median / max over
trials go to stdout and, with every trial's figures, to the JSON.

    bench/elastic.py [--chorus build/chorus] [--trials 8] [--seed 1] [--out bench/results/...]
                     [--modes chorus-kill,chorus-hung,chorus-hung-200,torch|chorus-replace|
                              chorus-zero,chorus-zero-replica,chorus-pipeline,
                              chorus-pipeline-replica]
"""
import argparse
import datetime
import hashlib
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
POINTS = ["forward", "reduce", "optimizer"]
MODES = ["chorus-kill", "chorus-hung", "chorus-hung-200", "torch", "chorus-replace", "chorus-zero",
         "chorus-zero-replica", "chorus-pipeline", "chorus-pipeline-replica"]
DEFAULT_MODES = MODES[:4]  # chorus-replace, the ZeRO and the pipeline modes: on request
# The modes that go back to a checkpoint (and log the steps since again), and their layouts.
GOING_BACK = {"chorus-zero", "chorus-pipeline"}
PIPELINES = {"chorus-pipeline": ["parallel.pipeline_stages=3"],
             "chorus-pipeline-replica": ["devices=cpu,cpu,cpu,cpu", "parallel.pipeline_stages=2",
                                         "parallel.replicas=2"]}
FAULT_LINE = re.compile(r"(\d\d):(\d\d):(\d\d)\.(\d{3}).*fault injection: signal (\d+) at (\w+) "
                        r"of step (\d+) \(pid (\d+)\)")
TIME = r"(\d\d):(\d\d):(\d\d)\.(\d{3}) "
RESTART_LINE = re.compile(TIME + r"chorus run: restarting rank (\d+) as rank (\d+)")
ASK_LINE = re.compile(TIME + r"elastic: rank (\d+) asks to join the job in place of rank (\d+)")
JOINED_LINE = re.compile(TIME + r"elastic: rank (\d+) joined generation (\d+) as rank (\d+) of "
                         r"(\d+) at step (\d+) \(shares [^)]*\) after ([0-9.e+-]+) s")
AGENT_STOP_LINE = re.compile(r"[IWE]\d{4} (\d\d):(\d\d):(\d\d)\.(\d{6}) .*closing signal SIGTERM")
QUIET = "/work/QUIET"
JOB = ("devices=cpu,cpu,cpu balance=off model.kind=mlp model.hidden=[64,32] data.dataset=synthetic "
       "data.size=4096 train.global_batch=120 train.eval_every=0 train.eval_samples=256 "
       "train.target_accuracy=0 optimizer.name=adamw optimizer.lr=0.003 elastic.enabled=true"
       ).split()
REPLACE_SHARES = [30, 40, 50]  # uneven, so that the replacement's share shows
REPLACE_JOB = ["elastic.max_restarts=1", "balancer.shares=[30,40,50]"]


def make_trials(seed, count, first, last):
    rng = random.Random(seed)
    return [{"trial": i, "kill_step": rng.randint(first, last), "rank": rng.randrange(3),
             "point": rng.choice(POINTS)} for i in range(count)]


def chorus_command(args, log, heartbeat_ms=None, replace=False, zero_dir=None, replicas=False,
                   pipeline=None, checkpoint_dir=None):
    settings = JOB + (REPLACE_JOB + [f"train.steps={args.replace_steps}"] if replace
                      else [f"train.steps={args.steps}"])
    if zero_dir is not None:
        settings += ["zero.stage=2", f"checkpoint.dir={zero_dir}",
                     f"checkpoint.every={args.checkpoint_every}"]
        settings += ["zero.redundancy=1"] if replicas else []
    if pipeline is not None:
        settings += pipeline + ["parallel.micro_batches=4", f"checkpoint.dir={checkpoint_dir}",
                                f"checkpoint.every={args.checkpoint_every}"]
    if heartbeat_ms is not None:
        settings.append(f"elastic.heartbeat_ms={heartbeat_ms}")
    return [args.chorus, "train"] + [w for kv in settings for w in ("--set", kv)] + [
        "--log-json", log]


def torch_command(args, trial, events, checkpoint):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return [args.python, "-m", "torch.distributed.run", "--nproc-per-node", "3",
            "--max-restarts", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"localhost:{port}",
            os.path.join(ROOT, "bench", "elastic_torch.py"), "--events", events,
            "--checkpoint", checkpoint, "--checkpoint-every", str(args.checkpoint_every),
            "--steps", str(args.steps), "--kill-rank", str(trial["rank"]),
            "--kill-step", str(trial["kill_step"]), "--kill-point", trial["point"]]


def read_json_lines(path):
    """The whole lines' objects, and the lines that are not JSON (a log overwritten in place)."""
    records, bad = [], []
    if os.path.exists(path):
        with open(path) as lines:
            for line in (line for line in lines if line.endswith("\n")):
                try:
                    records.append(json.loads(line))
                except ValueError:
                    bad.append(line.strip())
    return records, bad


def clock_time(h, m, s, us, near):
    """Unix time of a local HH:MM:SS.us of a log line, on the date that puts it nearest `near`."""
    day = datetime.datetime.fromtimestamp(near).date()
    candidates = [datetime.datetime.combine(day + datetime.timedelta(days=d),
                                            datetime.time(h, m, s, us)).timestamp()
                  for d in (-1, 0, 1)]
    return min(candidates, key=lambda t: abs(t - near))


def fault_of(text, near):
    """(unix time, pid, step, point) of chorus's fault line."""
    match = FAULT_LINE.search(text)
    if match is None:
        return None
    h, m, s, ms = (int(g) for g in match.groups()[:4])
    return (clock_time(h, m, s, ms * 1000, near), int(match.group(8)), int(match.group(7)),
            match.group(6))


def line_time(pattern, text, near):
    """(unix time, the other groups) of the first line of `pattern` (TIME first), or None."""
    match = pattern.search(text)
    if match is None:
        return None
    h, m, s, ms = (int(g) for g in match.groups()[:4])
    return clock_time(h, m, s, ms * 1000, near), match.groups()[4:]


def agent_stop_time(text, near):
    """When torchrun's agent began stopping the surviving workers (its first SIGTERM line)."""
    match = AGENT_STOP_LINE.search(text)
    return match and clock_time(*(int(g) for g in match.groups()), near)


def run_job(command, env, log, stderr_path, continue_stopped, timeout_s):
    """Runs one job; SIGCONTs a stopped victim once a step follows the recovery in `log`, keeping
    the log as it was just before (a continued rank 0 may overwrite lines of it)."""
    started = time.time()
    quiet_seen, continued, before = False, None, None
    with open(stderr_path, "w") as err, open(stderr_path + ".out", "w") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=err,
                                   start_new_session=True)
        while process.poll() is None:
            time.sleep(0.02)
            quiet_seen = quiet_seen or os.path.exists(QUIET)
            late = time.time() - started > timeout_s
            if continue_stopped and continued is None:
                records = read_json_lines(log)[0]
                kinds = ["recovery" if r.get("event") else "step" for r in records]
                recovered = "recovery" in kinds and "step" in kinds[kinds.index("recovery"):]
                with open(stderr_path) as err_so_far:
                    fault = fault_of(err_so_far.read(), started)
                if fault and (recovered or late):
                    before = records
                    os.kill(fault[1], signal.SIGCONT)
                    continued = time.time()
            if time.time() - started > timeout_s + 30:
                os.killpg(process.pid, signal.SIGKILL)  # our own session only
    with open(stderr_path) as err, open(stderr_path + ".out") as out:
        output = out.read() + err.read()
    return {"rc": process.returncode, "wall_s": time.time() - started, "quiet_seen": quiet_seen,
            "started": started, "continued": continued}, output, before


def step_check(steps, total):
    """Steps missing from or repeated in the log (chorus: every step exactly once)."""
    numbers = [s["step"] for s in steps]
    return {"missing": sorted(set(range(1, total + 1)) - set(numbers)),
            "repeated": sorted({n for n in numbers if numbers.count(n) > 1})}


def chorus_figures(final, fault, total_steps, before=None):
    """Phases from the log as it was before a SIGCONT (`before`) or at the end (`final`); the
    step check from the end."""
    steps = [r for r in final if "event" not in r]
    figures = {"steps_logged": len(steps), **step_check(steps, total_steps),
               "median_step_s": statistics.median(s["step_s"] for s in steps) if steps else None}
    records = before if before is not None else final
    events = [i for i, r in enumerate(records) if r.get("event") == "recovery"]
    if fault is None or not events:
        return {**figures, "error": "no fault line" if fault is None else "no recovery"}
    recovery = records[events[0]]
    after = next((r for r in records[events[0]:] if "event" not in r), None)
    kill = fault[0]
    figures.update({
        "kill_time": kill, "recoveries": len(events), "reason": recovery["reason"],
        "lost": recovery["lost"], "members": recovery["members"],
        "redo_step": recovery["redo_step"], "first_step_after": after and after["step"],
        "detect_s": recovery["time"] - recovery["agree_s"] - recovery["rebuild_s"] - kill,
        "agree_s": recovery["agree_s"], "rebuild_s": recovery["rebuild_s"],
        "redo_s": after and after["time"] - recovery["time"],
        "total_s": after and after["time"] - kill,
        # Until the interrupted step completed (later than total_s where the recovery went back
        # to a checkpoint), and the steps done again on the way.
        "catch_up_s": next((r["time"] - kill for r in records[events[0]:] if "event" not in r
                            and r["step"] >= fault[2] + 1), None),
        "redone": sum(1 for r in records[events[0]:] if "event" not in r
                      and r["step"] <= fault[2]),
        "stale_step_lines": [s["step"] for s in steps  # written by a left-out worker
                             if s["time"] > recovery["time"] and "generation" not in s]})
    return figures


def replace_figures(records, output, near, fault, victim):
    """The join of the victim's replacement: its phases from the agent's and the replacement's log
    lines and the JSON log, and whether it took its launch share back."""
    restart, ask, joined = (line_time(p, output, near)
                            for p in (RESTART_LINE, ASK_LINE, JOINED_LINE))
    events = [(i, r) for i, r in enumerate(records) if r.get("event") == "recovery"]
    loss = next((r for _, r in events if r["lost"]), None)
    join_at = next((i for i, r in events if r["joined"]), None)
    if fault is None or None in (restart, ask, joined, loss, join_at):
        return {"error": "no " + next(name for name, x in (
            ("fault line", fault), ("restarting line", restart), ("join request", ask),
            ("joined line", joined), ("loss", loss), ("join", join_at)) if x is None)}
    join = records[join_at]
    member = int(restart[1][1])
    steps = [r for r in records if "event" not in r]
    after = [r for r in records[join_at:] if "event" not in r]
    # Launch shares in member order: a survivor keeps its launch rank's, the replacement takes
    # the victim's (it sorts last: member ids of replacements start at the launch world size).
    expected = [REPLACE_SHARES[m if m < len(REPLACE_SHARES) else victim]
                for m in sorted(join["members"])]
    # The last step completed before the join request; the steps from it to the join are counted
    # by number (a step line may be missing), and their lines by time.
    before_ask = max((s["step"] for s in steps if s["time"] <= ask[0]), default=0)
    kill = fault[0]
    return {
        "replacement": member, "joined": join["joined"], "join_generation": join["generation"],
        "join_members": join["members"], "join_shares": join["shares"], "expected_shares": expected,
        "final_shares": after[-1]["shares"] if after else None,
        "shares_ok": bool(after) and join["shares"] == expected and
                     all(s["shares"] == expected for s in after),
        "joined_ok": join["joined"] == [member] and loss["lost"] == [victim],
        "loss_redo_step": loss["redo_step"], "join_redo_step": join["redo_step"],
        "first_step_with_replacement": after[0]["step"] if after else None,
        "restart_s": restart[0] - kill, "startup_s": ask[0] - restart[0],
        "admit_s": joined[0] - ask[0], "joined_after_s": float(joined[1][5]),
        "join_agree_s": join["agree_s"], "join_rebuild_s": join["rebuild_s"],
        "join_total_s": after[0]["time"] - kill if after else None,
        "reduced_steps": join["redo_step"] - loss["redo_step"],
        "ask_to_join_steps": join["redo_step"] - 1 - before_ask,
        "ask_to_join_lines": sum(ask[0] < s["time"] < join["time"] for s in steps)}


def torch_figures(records, total_steps, stopping):
    kill = next((r for r in records if r.get("event") == "kill"), None)
    starts = {r["attempt"]: r for r in records if r.get("event") == "start"}
    steps = [r for r in records if "event" not in r]
    first_attempt = {s["step"] for s in steps if s["attempt"] == 0}
    again = [s for s in steps if s["attempt"] == 1]
    figures = {"missing": step_check(steps, total_steps)["missing"],
               "median_step_s": statistics.median(
                   b["time"] - a["time"] for a, b in zip(steps, steps[1:])
                   if b["step"] == a["step"] + 1) if len(steps) > 1 else None}
    if kill is None or 1 not in starts or not again:
        return {**figures, "error": "no kill" if kill is None else "no restart"}
    start = starts[1]
    # The interrupted step, or the first after it when it had completed (an "optimizer" kill).
    caught = next((s for s in again if s["step"] >= kill["step"] + 1), None)
    figures.update({
        "kill_time": kill["time"], "resumed_step": start["resumed_step"],
        "completed_before_kill": max(first_attempt, default=0),
        "replayed": len(first_attempt & {s["step"] for s in again}),
        "kill_step_minus_checkpoint": kill["step"] - start["resumed_step"],
        "detect_s": stopping and stopping - kill["time"],
        "restart_s": start["started"] - kill["time"],
        "import_s": start["imported"] - start["started"],
        "init_s": start["ready"] - start["imported"],
        "first_step_s": again[0]["time"] - start["ready"],
        "total_s": again[0]["time"] - kill["time"],
        "catch_up_s": caught and caught["time"] - kill["time"]})
    return figures


def run_mode(args, mode, trial, workdir):
    name = os.path.join(workdir, f"{mode}_{trial['trial']}")
    log, stderr_path, env = name + ".jsonl", name + ".err", dict(os.environ)
    if mode == "torch":
        command = torch_command(args, trial, log, name + ".pt")
    else:
        signal_name = "STOP" if mode.startswith("chorus-hung") else "KILL"
        point = "optimizer" if mode in PIPELINES and trial["point"] == "reduce" else trial["point"]
        env["CHORUS_FAULT"] = f"{trial['rank']}:{point}:{trial['kill_step']}:{signal_name}"
        zero_dir = name + ".ckpt" if mode.startswith("chorus-zero") else None
        command = chorus_command(args, log, 200 if mode.endswith("200") else None,
                                 mode == "chorus-replace", zero_dir, mode == "chorus-zero-replica",
                                 PIPELINES.get(mode), name + ".ckpt")
    for attempt in range(3):  # a run that overlapped the CI's quiet period is run again
        while os.path.exists(QUIET):
            time.sleep(10)
        for path in (log, log + ".kill", name + ".pt"):
            if os.path.exists(path):
                os.remove(path)
        load = os.getloadavg()[0]
        job, output, before = run_job(command, env, log, stderr_path,
                                      mode.startswith("chorus-hung"), args.timeout)
        if not job["quiet_seen"]:
            break
    records, bad_lines = read_json_lines(log)
    records += read_json_lines(log + ".kill")[0]  # the torch victim's
    if mode == "torch":
        figures = torch_figures(records, args.steps, agent_stop_time(output, job["started"]))
    else:
        fault = fault_of(output, job["started"])
        total = args.replace_steps if mode == "chorus-replace" else args.steps
        figures = chorus_figures(records, fault, total, before)
        figures["left_out_refused"] = "was left out of the job" in output
        if mode == "chorus-replace":
            figures.update(replace_figures(records, output, job["started"], fault, trial["rank"]))
            if figures.get("error") is None and (not figures["shares_ok"] or
                                                 not figures["joined_ok"]):
                figures["error"] = "wrong shares" if not figures["shares_ok"] else "wrong members"
    result = {"mode": mode, **trial, **job, "load_1m": load, "reruns": attempt, **figures,
              "bad_log_lines": bad_lines, "command": " ".join(command),
              "env": env.get("CHORUS_FAULT")}
    going_back = mode in GOING_BACK  # the steps since the checkpoint are logged again
    if (job["rc"] != 0 or "error" in figures or bad_lines or figures.get("missing")
            or (figures.get("repeated") and not going_back)):
        result["output_tail"] = output[-3000:]
    return result


ZERO_PHASES = ["detect_s", "agree_s", "rebuild_s", "redo_s", "total_s", "catch_up_s", "redone"]
PHASES = {"chorus": ["detect_s", "agree_s", "rebuild_s", "redo_s", "total_s"],
          "chorus-zero": ZERO_PHASES, "chorus-zero-replica": ZERO_PHASES,
          "chorus-pipeline": ZERO_PHASES, "chorus-pipeline-replica": ZERO_PHASES,
          "torch": ["detect_s", "restart_s", "import_s", "init_s", "first_step_s", "total_s",
                    "catch_up_s", "replayed"],
          "chorus-replace": ["detect_s", "agree_s", "rebuild_s", "redo_s", "total_s", "restart_s",
                             "startup_s", "admit_s", "join_agree_s", "join_rebuild_s",
                             "join_total_s", "reduced_steps", "ask_to_join_steps",
                             "ask_to_join_lines"]}
COUNTS = {"replayed", "reduced_steps", "ask_to_join_steps", "ask_to_join_lines",
          "redone"}  # not seconds


def phases(mode):
    return PHASES[mode if mode in PHASES else "chorus"]


def summarize(runs):
    summary = {}
    for mode in MODES:
        mine = [r for r in runs if r["mode"] == mode]
        if not mine:
            continue
        entry = {"runs": len(mine), "failed": sum(r["rc"] != 0 or "error" in r for r in mine),
                 "steps_missing": sum(len(r.get("missing", [])) for r in mine),
                 "steps_repeated": sum(len(r.get("repeated", [])) for r in mine),
                 "runs_with_bad_log_lines": sum(bool(r["bad_log_lines"]) for r in mine)}
        if mode == "chorus-replace":
            entry["shares_wrong"] = sum(not r.get("shares_ok") for r in mine)
        for phase in phases(mode):
            values = [r[phase] for r in mine if r.get(phase) is not None]
            if values:
                entry[phase] = {"min": min(values), "median": statistics.median(values),
                                "max": max(values)}
        summary[mode] = entry
    return summary


def report(summary):
    """Per mode: the counts, then one line per phase: min / median / max (ms; COUNTS: steps)."""
    lines = []
    for mode, entry in summary.items():
        lines.append(f"{mode}: " + ", ".join(f"{k} {v}" for k, v in entry.items()
                                              if not isinstance(v, dict)))
        for phase in (p for p in phases(mode) if p in entry):
            scale = 1 if phase in COUNTS else 1000
            lines.append(f"  {phase:17} " + " / ".join(f"{entry[phase][k] * scale:.0f}"
                                                       for k in ("min", "median", "max")))
    return "\n".join(lines)


def machine(python):
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()[:15]
    torch_version = subprocess.run(
        [python, "-c", "import warnings; warnings.filterwarnings('ignore');"
         "import torch; print(torch.__version__)"], capture_output=True, text=True).stdout.strip()
    return {"nproc": os.cpu_count(), "lscpu": lscpu, "torch": torch_version,
            "kernel": os.uname().release}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chorus", default=os.path.join(ROOT, "build", "chorus"))
    parser.add_argument("--python", default=sys.executable, help="the Python with torch")
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--first-step", type=int, default=5, help="earliest kill step (from 0)")
    parser.add_argument("--last-step", type=int, default=34)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--replace-steps", type=int, default=1000, help="chorus-replace's steps")
    parser.add_argument("--modes", default=",".join(DEFAULT_MODES), help="of " + ",".join(MODES))
    parser.add_argument("--timeout", type=float, default=120, help="seconds per job")
    parser.add_argument("--out", default=os.path.join(
        ROOT, "bench", "results", f"elastic_{datetime.date.today().isoformat()}.json"))
    args = parser.parse_args()
    args.chorus = os.path.abspath(args.chorus)
    modes = args.modes.split(",")
    if not set(modes) <= set(MODES):
        parser.error(f"--modes: {args.modes} (modes: {','.join(MODES)})")
    trials = make_trials(args.seed, args.trials, args.first_step, args.last_step)
    with open(args.chorus, "rb") as binary:
        chorus_sha256 = hashlib.sha256(binary.read()).hexdigest()
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    result = {"date": started, "machine": machine(args.python), "seed": args.seed, "trials": trials,
              "args": vars(args), "chorus_sha256": chorus_sha256,
              "commands": {"bench": " ".join(sys.argv),
                           "chorus": " ".join(chorus_command(args, "LOG")),
                           "chorus-replace": " ".join(chorus_command(args, "LOG", replace=True)),
                           "torch": " ".join(torch_command(args, trials[0], "EVENTS", "CKPT"))},
              "runs": []}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with tempfile.TemporaryDirectory() as workdir:
        for trial in trials:
            order = modes[trial["trial"] % len(modes):] + modes[:trial["trial"] % len(modes)]
            for mode in order:
                r = run_mode(args, mode, trial, workdir)
                result["runs"].append(r)
                joined = (f" join_total={r.get('join_total_s')} ask_to_join_steps="
                          f"{r.get('ask_to_join_steps')}" if mode == "chorus-replace" else "")
                print(f"trial {trial['trial']} {mode:16} rc={r['rc']} total={r.get('total_s')}"
                      f"{joined} {r.get('error', '')}", flush=True)
            result["summary"] = summarize(result["runs"])  # saved after every trial
            result["finished"] = datetime.datetime.now(datetime.timezone.utc).isoformat(
                timespec="seconds")
            with open(args.out, "w") as out:
                json.dump(result, out, indent=1)
    print(report(result["summary"]))


if __name__ == "__main__":
    main()
