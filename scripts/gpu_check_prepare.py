"""`scripts/gpu-check --prepare`: what a development machine readies before a GPU is at hand.

1. The build dependencies a GPU image lacks (DEBIAN_PACKAGES), unpacked into .gpu-deps/ with the
   text the precision check trains on (.gpu-deps/data/mobydick.txt): carried along to the GPU
   machine with the working tree, so they must stay small (a few MiB).
2. Unless --no-torch-check: every chorus target compiled against another PyTorch than the one
   installed here (default 2.11.0, TORCH_VERSION), so that a break against it shows before a GPU
   machine with that PyTorch runs the check. Its wheel is downloaded from the Python registry
   without dependencies (`pip download torch==V --no-deps --only-binary :all:`) into
   .cache/gpu-check/wheels/ (ignored by git, never carried: about 530 MB; kept, so a second
   --prepare does not download it again), its torch/{include,lib,share} unpacked into
   .cache/gpu-check/torch-V/, and chorus configured in build-torchV/ (ignored by git) with
   -DTorch_DIR pointing at the unpacked TorchConfig.cmake (cmake/ChorusTorch.cmake takes a given
   Torch_DIR first; ./build is untouched) and built there with -j2 under `nice -n 10`. The build
   is compiled and linked, not run: its test listing is left to ctest time
   (CMAKE_GTEST_DISCOVER_TESTS_DISCOVERY_MODE=PRE_TEST), since the wheel's CUDA libraries are
   not installed here. The figures (wheel size, download and compile seconds, the failing
   output) go to build-torchV/torch-check.json and are printed.
"""

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEPS = os.path.join(REPO, ".gpu-deps")
CACHE = os.path.join(REPO, ".cache", "gpu-check")
TEXT = "/var/lib/chorus/data/mobydick.txt"  # where scripts/setup puts it
# What chorus's configure and link need beyond PyTorch, CMake, ninja and a compiler (which the GPU
# image has): headers, CMake package files and the shared libraries they name.
DEBIAN_PACKAGES = [
    "libcli11-dev", "libtomlplusplus-dev", "libtomlplusplus3", "nlohmann-json3-dev",
    "libgtest-dev", "libgmock-dev", "googletest", "libgloo-dev", "libssl-dev", "libssl3",
    "zlib1g-dev", "prometheus-cpp-dev", "libprometheus-cpp-core1.0", "libprometheus-cpp-pull1.0",
    "libprometheus-cpp-push1.0", "libcivetweb-dev", "libcivetweb1", "civetweb", "libcurl4-openssl-dev",
    "libcurl4", "libhiredis-dev", "libibverbs-dev",
]
# pytest and what it imports, pure Python: the Python front's GPU tests (tests/python/test_gpu.py)
# run under it, and a GPU image need not have it. Unpacked into .gpu-deps/python, which
# scripts/gpu-check appends to PYTHONPATH (the machine's own packages come first).
PYTHON_PACKAGES = ["pytest", "pluggy", "iniconfig", "packaging"]
TORCH_VERSION = "2.11.0"
# The parts of the wheel a C++ build reads: headers, libraries, CMake package files.
TORCH_PARTS = ("torch/include/", "torch/lib/", "torch/share/")


def log(message):
    print(f"gpu-check: {message}", flush=True)


def run(command, cwd=REPO, env=None):
    """Runs `command` to its end; returns (exit code, stdout and stderr together)."""
    done = subprocess.run(command, cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, check=False)
    return done.returncode, done.stdout


def debian_packages():
    """Downloads DEBIAN_PACKAGES and unpacks them under .gpu-deps/ (replaced if present), with
    the text corpus beside them."""
    shutil.rmtree(DEPS, ignore_errors=True)
    scratch = tempfile.mkdtemp(prefix="gpu-deps.")
    os.chmod(scratch, 0o755)  # apt-get download runs as _apt
    code, output = run(["apt-get", "download", "-qq"] + DEBIAN_PACKAGES, cwd=scratch)
    if code != 0:
        sys.exit(f"gpu-check: apt-get download failed:\n{output[-2000:]}")
    for deb in sorted(glob.glob(os.path.join(scratch, "*.deb"))):
        code, output = run(["dpkg-deb", "-x", deb, DEPS])
        if code != 0:
            sys.exit(f"gpu-check: cannot unpack {deb}:\n{output}")
    shutil.rmtree(scratch)
    # Documentation and man pages do not need to travel.
    shutil.rmtree(os.path.join(DEPS, "usr", "share", "doc"), ignore_errors=True)
    shutil.rmtree(os.path.join(DEPS, "usr", "share", "man"), ignore_errors=True)
    if not os.path.exists(TEXT):
        sys.exit(f"gpu-check: {TEXT} is missing (the precision check trains on it): run "
                 "scripts/setup")
    python_packages()
    os.makedirs(os.path.join(DEPS, "data"))
    shutil.copy(TEXT, os.path.join(DEPS, "data"))
    size = sum(os.lstat(os.path.join(d, f)).st_size for d, _, files in os.walk(DEPS) for f in files)
    log(f"{len(DEBIAN_PACKAGES)} packages and mobydick.txt in .gpu-deps/ ({size / 2**20:.1f} MiB); "
        "carry it to the GPU machine")


def torch_wheel(version, result):
    """The wheel of torch `version` for this interpreter, downloaded unless present."""
    wheels = os.path.join(CACHE, "wheels")
    pattern = os.path.join(wheels, f"torch-{version}-*.whl")
    found = glob.glob(pattern)
    if not found:
        os.makedirs(wheels, exist_ok=True)
        start = time.monotonic()
        code, output = run([sys.executable, "-m", "pip", "download", f"torch=={version}",
                            "--no-deps", "--only-binary", ":all:", "-d", wheels])
        result["download_seconds"] = round(time.monotonic() - start, 1)
        found = glob.glob(pattern)
        if code != 0 or not found:
            result["output"] = output[-3000:]
            return None
    else:
        result["download_seconds"] = 0  # kept from an earlier --prepare
    result["wheel"] = os.path.relpath(found[0], REPO)
    result["wheel_mib"] = round(os.path.getsize(found[0]) / 2**20, 1)
    return found[0]


def unpack(wheel, version):
    """torch/{include,lib,share} of `wheel` under .cache/gpu-check/torch-V/ (once: a marker file
    says the unpacking finished). Returns that folder."""
    root = os.path.join(CACHE, f"torch-{version}")
    marker = os.path.join(root, ".unpacked")
    if not os.path.exists(marker):
        shutil.rmtree(root, ignore_errors=True)
        with zipfile.ZipFile(wheel) as archive:
            members = [m for m in archive.namelist() if m.startswith(TORCH_PARTS)]
            archive.extractall(root, members)
        with open(marker, "w", encoding="utf-8") as done:
            done.write(os.path.basename(wheel) + "\n")
    return root


def compilers():
    """The compiler and linker flags scripts/build gives ./build: clang++-14 and lld when present."""
    clang = shutil.which("clang++-14")
    if not clang:
        return []
    flags = [f"-DCMAKE_CXX_COMPILER={clang}"]
    if os.path.exists("/usr/lib/llvm-14/bin/ld.lld"):
        flags += ["-DCMAKE_EXE_LINKER_FLAGS=-fuse-ld=lld", "-DCMAKE_SHARED_LINKER_FLAGS=-fuse-ld=lld"]
    return flags


def torch_check(version):
    """Builds every chorus target against torch `version` in build-torch<version>/; returns
    whether all compiled and linked, and writes the figures beside the build."""
    build = os.path.join(REPO, f"build-torch{version.rsplit('.', 1)[0]}")
    result = {"torch": version, "build_dir": os.path.relpath(build, REPO)}
    wheel = torch_wheel(version, result)
    if wheel is None:
        log(f"torch {version}: download failed")
        return finish(build, result, ok=False)
    start = time.monotonic()
    root = unpack(wheel, version)
    result["unpack_seconds"] = round(time.monotonic() - start, 1)
    torch_dir = os.path.join(root, "torch", "share", "cmake", "Torch")
    configure = ["cmake", "-S", REPO, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                 f"-DTorch_DIR={torch_dir}", f"-DPython3_EXECUTABLE={sys.executable}",
                 "-DCMAKE_GTEST_DISCOVER_TESTS_DISCOVERY_MODE=PRE_TEST"] + compilers()
    start = time.monotonic()
    code, output = run(configure)
    result["configure_seconds"] = round(time.monotonic() - start, 1)
    if code != 0:
        result.update(stage="configure", output=output[-4000:])
        return finish(build, result, ok=False)
    found = [line for line in output.splitlines() if "chorus: libtorch" in line]
    result["configured"] = found[-1].strip("- ") if found else ""
    log(f"torch {version}: building every target in {result['build_dir']}/ (-j2, nice)")
    start = time.monotonic()
    # Without ccache: these objects are of no use to ./build, and would push its out of the cache.
    code, output = run(["nice", "-n", "10", "cmake", "--build", build, "-j2", "--", "-k", "0"],
                       env={**os.environ, "CCACHE_DISABLE": "1"})
    result["compile_seconds"] = round(time.monotonic() - start, 1)
    result["failed"] = failures(output)
    if code != 0:
        result.update(stage="build", output=output[-6000:])
    return finish(build, result, ok=code == 0)


def failures(output):
    """Each step ninja reports FAILED with the compiler's error lines after it (up to the next
    step), so the report names what broke even when the log's tail is other steps."""
    found, current = [], None
    for line in output.splitlines():
        if line.startswith("FAILED: "):
            current = {"step": line[len("FAILED: "):].strip(), "errors": []}
            found.append(current)
        elif line.startswith("[") or line.startswith("ninja: "):
            current = None
        elif current is not None and ("error:" in line or line.endswith(" generated.")) and \
                len(current["errors"]) < 20:  # not the command line's -Werror
            current["errors"].append(line.strip())
    return found


def finish(build, result, ok):
    result["ok"] = ok
    os.makedirs(build, exist_ok=True)
    with open(os.path.join(build, "torch-check.json"), "w", encoding="utf-8") as out:
        json.dump(result, out, indent=1)
    figures = {k: v for k, v in result.items() if k != "output"}
    log(f"torch {result['torch']}: {'compiled' if ok else 'FAILED'} {json.dumps(figures)}")
    if not ok and result.get("output"):
        print(result["output"][-3000:], flush=True)
    return ok


def python_packages():
    """Downloads PYTHON_PACKAGES' wheels (pure Python, no dependencies beyond each other) and
    unpacks them into .gpu-deps/python."""
    scratch = tempfile.mkdtemp(prefix="gpu-deps-python.")
    code, output = run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--only-binary", ":all:", "-d", scratch] + PYTHON_PACKAGES)
    if code != 0:
        sys.exit(f"gpu-check: pip download of {PYTHON_PACKAGES} failed:\n{output[-2000:]}")
    for wheel in sorted(glob.glob(os.path.join(scratch, "*.whl"))):
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(os.path.join(DEPS, "python"))
    shutil.rmtree(scratch)


def prepare(torch_check_version=TORCH_VERSION):
    """--prepare: the carried dependencies, then (unless `torch_check_version` is None) the build
    against that PyTorch. Returns the exit status: 1 when that build failed."""
    debian_packages()
    if torch_check_version is None:
        log("torch compile check skipped (--no-torch-check)")
        return 0
    return 0 if torch_check(torch_check_version) else 1
