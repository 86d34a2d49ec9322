"""`pip install .` where users are: a fresh venv, then the examples from outside the source tree.

CTest `python.PipInstallInAFreshVenvRunsTheExamples` (label `python`). It

- creates a venv in a temporary folder with `--system-site-packages` (torch is the interpreter's
  own, as scripts/setup installed it, and is never downloaded again);
- runs `pip install <source root>` into it, as docs/python.md tells users (pip's isolated build
  environment fetches scikit-build-core; torch>=2.0 is already satisfied). scikit-build-core builds
  in build/pip (pyproject.toml), never in the main build's folder, so a second install rebuilds
  only what changed; a lock on build/pip.lock keeps two installs from building there at once;
- checks that `import chorus` in the venv loads the installed package (chorus and chorus._C from
  the venv's site-packages), not the source tree or the build tree, and that the venv has the
  `chorus` launcher;
- copies each example of examples/python into a temporary folder and runs it there through the
  venv's launcher on `cpu@1.0,cpu@0.5` for a bounded number of steps (seed 0, the examples'
  own), asserting the steps it ran and a test accuracy above a floor set with margin below the
  measured runs (bench/results/python_install_2026-12-05.json).

A failing venv or pip fails the test; nothing here skips.

Recording (docs/python.md cites the file):
  CHORUS_PIP_INSTALL_RESULTS=bench/results/python_install_<date>.json  writes the figures there;
  CHORUS_PIP_INSTALL_COLD=1  first removes build/pip and installs into a first venv (the cold
  install), then installs again into the venv the examples run from (the warm install);
  CHORUS_PIP_INSTALL_FULL=1  also runs the examples as long as the docs quote them.
A file that exists already keeps what it held under "runs"; the new run's figures go on top.
"""

import datetime
import fcntl
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PIP_BUILD = os.path.join(ROOT, "build", "pip")
DEVICES = "cpu@1.0,cpu@0.5"
# (script, steps, accuracy floor). Floors: below every seeded run measured (the adaptive shares
# change the summation order, so runs differ in the third digit), with margin for that spread.
EXAMPLES = [
    ("fashion_mnist_cnn.py", 150, 0.78),
    ("fashion_mnist_transformer.py", 150, 0.75),
]
# Recording only (CHORUS_PIP_INSTALL_FULL=1): the runs the README and docs/python.md quote, as
# long as the examples' documented commands (the CNN's 2 epochs, the transformer's first epoch).
FULL_LENGTH = [
    ("fashion_mnist_cnn.py", ["--epochs", "2"]),
    ("fashion_mnist_transformer.py", ["--epochs", "1"]),
]
SEED = 0  # the examples' torch.manual_seed and ShardSampler seed
INSTALL_TIMEOUT = 3600  # a cold build of ~190 files on 2 busy cores took 12-42 minutes
EXAMPLE_TIMEOUT = 300

RESULTS = {}


def _environment(venv=None):
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "CHORUS_CLI", "VIRTUAL_ENV")}
    # ccache keys on paths relative to the clone, so a clean clone elsewhere on this machine
    # reuses what an earlier install compiled instead of paying the cold build again.
    env.setdefault("CCACHE_BASEDIR", ROOT)
    if venv:
        env["PATH"] = os.path.join(venv, "bin") + os.pathsep + env.get("PATH", "")
        env["VIRTUAL_ENV"] = venv
    return env


def _run(command, timeout, cwd, env, what):
    start = time.monotonic()
    try:
        done = subprocess.run(command, cwd=cwd, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"{what} ran past {timeout} s: {' '.join(command)}\n"
                    f"{(error.output or '')[-4000:]}")
    seconds = time.monotonic() - start
    if done.returncode != 0:
        pytest.fail(f"{what} failed (exit {done.returncode}) after {seconds:.0f} s: "
                    f"{' '.join(command)}\n{done.stdout[-6000:]}")
    return done.stdout, seconds


def _make_venv(path):
    _run([sys.executable, "-m", "venv", "--system-site-packages", path], 300,
         os.path.dirname(path), _environment(), "python3 -m venv")
    return os.path.join(path, "bin", "python")


def _pip_install(venv, workdir):
    python = os.path.join(venv, "bin", "python")
    output, seconds = _run([python, "-m", "pip", "install", "--no-input",
                            "--disable-pip-version-check", ROOT],
                           INSTALL_TIMEOUT, workdir, _environment(venv), "pip install")
    print(f"pip install into {venv}: {seconds:.1f} s\n{output[-1500:]}")
    return seconds


@pytest.fixture(scope="module")
def venv():
    start = time.monotonic()
    workdir = tempfile.mkdtemp(prefix="chorus-pip-")
    assert not os.path.realpath(workdir).startswith(os.path.realpath(ROOT) + os.sep)
    os.makedirs(os.path.dirname(PIP_BUILD), exist_ok=True)
    with open(PIP_BUILD + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.environ.get("CHORUS_PIP_INSTALL_COLD") == "1":
            shutil.rmtree(PIP_BUILD, ignore_errors=True)
            cold = os.path.join(workdir, "cold")
            _make_venv(cold)
            RESULTS["pip_install_cold_seconds"] = round(_pip_install(cold, workdir), 1)
        path = os.path.join(workdir, "venv")
        made = time.monotonic()
        _make_venv(path)
        RESULTS["venv_seconds"] = round(time.monotonic() - made, 1)
        RESULTS["pip_install_warm_seconds" if "pip_install_cold_seconds" in RESULTS
                else "pip_install_seconds"] = round(_pip_install(path, workdir), 1)
    yield path
    RESULTS["test_seconds"] = round(time.monotonic() - start, 1)
    _write_results()
    shutil.rmtree(workdir, ignore_errors=True)


def test_import_loads_the_installed_package(venv):
    site = subprocess.run([os.path.join(venv, "bin", "python"), "-c",
                           "import sysconfig; print(sysconfig.get_paths()['platlib'])"],
                          env=_environment(venv), cwd=os.path.dirname(venv), text=True,
                          stdout=subprocess.PIPE, check=True).stdout.strip()
    output, _ = _run([os.path.join(venv, "bin", "python"), "-c",
                      "import json, chorus, chorus._C, torch; "
                      "print(json.dumps([chorus.__file__, chorus._C.__file__, torch.__file__]))"],
                     120, os.path.dirname(venv), _environment(venv), "import chorus")
    package, module, torch_file = json.loads(output.strip().splitlines()[-1])
    for path in (package, module):
        assert os.path.realpath(path).startswith(os.path.realpath(site) + os.sep), (path, site)
        assert not os.path.realpath(path).startswith(os.path.realpath(ROOT) + os.sep), path
    # torch is the interpreter's, seen through --system-site-packages, not a second download.
    assert not os.path.realpath(torch_file).startswith(os.path.realpath(venv) + os.sep), torch_file
    assert os.access(os.path.join(venv, "bin", "chorus"), os.X_OK)


@pytest.mark.parametrize("script,steps,floor", EXAMPLES, ids=[e[0] for e in EXAMPLES])
def test_example_reaches_its_accuracy_from_outside_the_tree(venv, script, steps, floor):
    rundir = tempfile.mkdtemp(prefix="chorus-example-")
    shutil.copy(os.path.join(ROOT, "examples", "python", script), rundir)
    command = [os.path.join(venv, "bin", "chorus"), "run", "--devices", DEVICES, "--",
               os.path.join(venv, "bin", "python"), script, "--epochs", "1",
               "--max-steps", str(steps)]
    output, seconds = _run(command, EXAMPLE_TIMEOUT, rundir, _environment(venv), script)
    shutil.rmtree(rundir, ignore_errors=True)
    done = re.search(r"done: (\d+) steps", output)
    accuracies = re.findall(r"test accuracy ([0-9.]+)", output)
    assert done and accuracies, output[-3000:]
    accuracy = float(accuracies[-1])
    RESULTS.setdefault("examples", []).append({
        "script": f"examples/python/{script}", "devices": DEVICES, "epochs": 1,
        "max_steps": steps, "steps_run": int(done.group(1)), "global_batch": 128, "seed": SEED,
        "test_accuracy": accuracy, "floor": floor, "wall_seconds": round(seconds, 1)})
    print(f"{script}: {done.group(1)} steps, test accuracy {accuracy:.4f} "
          f"(floor {floor}), {seconds:.1f} s")
    assert int(done.group(1)) == steps, output[-3000:]
    assert accuracy >= floor, f"{script}: test accuracy {accuracy} below {floor}\n{output[-3000:]}"


def _full_length_run(venv, script, arguments):
    rundir = tempfile.mkdtemp(prefix="chorus-example-")
    shutil.copy(os.path.join(ROOT, "examples", "python", script), rundir)
    command = [os.path.join(venv, "bin", "chorus"), "run", "--devices", DEVICES, "--",
               os.path.join(venv, "bin", "python"), script, *arguments]
    output, seconds = _run(command, 900, rundir, _environment(venv), script)
    shutil.rmtree(rundir, ignore_errors=True)
    done = re.search(r"done: (\d+) steps in ([0-9.]+) s", output)
    accuracies = re.findall(r"test accuracy ([0-9.]+)", output)
    assert done and accuracies, output[-3000:]
    RESULTS.setdefault("full_length_examples", []).append({
        "script": f"examples/python/{script}", "devices": DEVICES, "arguments": arguments,
        "steps_run": int(done.group(1)), "global_batch": 128, "seed": SEED,
        "test_accuracy": float(accuracies[-1]), "training_seconds": float(done.group(2)),
        "wall_seconds": round(seconds, 1)})
    print(f"{script} {' '.join(arguments)}: {done.group(1)} steps, "
          f"test accuracy {accuracies[-1]}, {seconds:.1f} s")


if os.environ.get("CHORUS_PIP_INSTALL_FULL") == "1":  # defined only when recording: no skips
    @pytest.mark.parametrize("script,arguments", FULL_LENGTH, ids=[e[0] for e in FULL_LENGTH])
    def test_recorded_full_length_run(venv, script, arguments):
        _full_length_run(venv, script, arguments)


def _git(*args):
    return subprocess.run(["git", "-C", ROOT, *args], stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True).stdout.strip()


def _write_results():
    path = os.environ.get("CHORUS_PIP_INSTALL_RESULTS")
    if not path:
        return
    path = os.path.join(ROOT, path)  # a relative path names a file of the source tree
    with open("/proc/cpuinfo") as cpuinfo:
        cpu = re.search(r"model name\s*:\s*(.*)", cpuinfo.read())
    cache = {}
    cache_file = os.path.join(PIP_BUILD, "CMakeCache.txt")
    if os.path.exists(cache_file):
        with open(cache_file) as text:
            cache = dict(re.findall(r"^(CMAKE_CXX_COMPILER|CHORUS_CCACHE):[A-Z]+=(.*)$",
                                    text.read(), re.M))
    compiler = cache.get("CMAKE_CXX_COMPILER")
    status = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                            stdout=subprocess.PIPE, text=True).stdout
    changed = [line[3:] for line in status.splitlines()]
    RESULTS.update({
        "what": "tests/python/test_pip_install.py: pip install <source root> into a fresh venv "
                "(--system-site-packages), then each example from a temporary folder through "
                "the venv's `chorus run`",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": _git("rev-parse", "HEAD"),
        "tracked_files_modified_in_the_tree": changed,
        "machine": {"cpu": cpu.group(1) if cpu else platform.processor(),
                    "cores": os.cpu_count(), "load_average_at_end": os.getloadavg()},
        "python": platform.python_version(),
        "compiler": compiler and subprocess.run([compiler, "--version"], text=True,
                                                stdout=subprocess.PIPE).stdout.splitlines()[0],
        "ccache": cache.get("CHORUS_CCACHE"),
        "build_dir": "build/pip",
        "jobs": "ninja's default",
    })
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    recorded = {}
    if os.path.exists(path):  # a later run adds its figures to the file, keeping the others'
        with open(path) as previous:
            recorded = json.load(previous)
        recorded.setdefault("runs", []).append(
            {k: recorded.pop(k) for k in list(recorded) if k != "runs"})
        RESULTS["runs"] = recorded["runs"]
    with open(path, "w") as out:
        json.dump(RESULTS, out, indent=2)
        out.write("\n")
    print(f"wrote {path}")
