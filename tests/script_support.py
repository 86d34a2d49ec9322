"""What the test scripts that CTest runs with python3 (tests/deploy, tests/observe, tests/runtime)
share: the exceptions that end a script, free ports, waiting on a service that starts, emulated
hosts in network namespaces (scripts/netns_hosts), and CTest's exit codes. A script one folder
below tests/ imports it after putting tests/ on sys.path:

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
"""
import argparse
import os
import shutil
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NETNS = os.path.join(ROOT, "scripts", "netns_hosts")
SKIPPED = 77  # CTest's SKIP_RETURN_CODE for these scripts


class Failure(Exception):
    """A check failed: the script prints FAIL and exits 1."""


class Skip(Exception):
    """The script cannot run here: it prints SKIP and exits 77."""


def free_port(host="127.0.0.1"):
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_for(what, predicate, deadline_s, interval=0.25, give_up_on=()):
    """Calls predicate() every `interval` seconds until it returns a true value, which it returns.
    An exception of a type in `give_up_on` ends the wait at once; any other is taken for a service
    still starting. Raises Failure after `deadline_s` seconds."""
    end = time.monotonic() + deadline_s
    last_error = None
    while time.monotonic() < end:
        try:
            value = predicate()
            if value:
                return value
        except give_up_on:
            raise
        except Exception as error:  # a service still starting
            last_error = error
        time.sleep(interval)
    raise Failure(f"gave up after {deadline_s} s waiting for {what} (last error: {last_error})")


def netns_skip_reason(needs="network namespaces", tools=("ip",)):
    """Why emulated hosts cannot run here (None when they can): they need root, `tools` and a
    working `ip netns`."""
    if os.geteuid() != 0:
        return f"needs root ({needs})"
    for tool in tools:
        if not shutil.which(tool):
            return f"{tool} is not installed (scripts/setup installs it)"
    if subprocess.run(["ip", "netns", "list"], capture_output=True).returncode != 0:
        return "ip netns does not work here"
    return None


def skip_if(reason):
    """Ends the script with CTest's skip code when `reason` (why it cannot run here) is given."""
    if reason:
        print(f"skipped: {reason}")
        sys.exit(SKIPPED)


def chorus_argument(description):
    """Parses the script's one option, --chorus (the binary to test): its absolute path."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--chorus", required=True)
    return os.path.abspath(parser.parse_args().chorus)


def in_netns_host(prefix, index, command):
    """`command` run in emulated host `index` of the hosts named by `prefix`."""
    return [NETNS, "exec", str(index), "--prefix", prefix, "--"] + list(command)


def exit_code(check, failures=(Failure,)):
    """Runs check() and prints its outcome: PASS (0), SKIP: why (a Skip, 77) or FAIL: what (one of
    `failures`, 1). Returns the exit code."""
    try:
        check()
    except Skip as skip:
        print(f"SKIP: {skip}")
        return SKIPPED
    except failures as failure:
        print(f"FAIL: {failure}")
        return 1
    print("PASS")
    return 0
