"""Runs pytest for CTest and scripts/test, failing when it collected no test.

pytest exits 5 when it collected nothing (a renamed file, a wrong path): that must fail CI like a
failing test does, not pass as "no failures". With `--all-skipped-exit N` (first argument) a run
in which every test skipped exits N, for CTest's SKIP_RETURN_CODE: the GPU suite skips without a
GPU, and CTest (and scripts/gpu-check, which fails a skipped GPU test) must see that.
"""

import sys

import pytest


class _Outcomes:
    """Counts the outcomes of the tests' calls (a skip is reported at setup)."""

    def __init__(self):
        self.ran = 0
        self.skipped = 0

    def pytest_runtest_logreport(self, report):
        if report.skipped:
            self.skipped += 1
        elif report.when == "call":
            self.ran += 1


if __name__ == "__main__":
    args = sys.argv[1:]
    all_skipped_exit = None
    if args[:1] == ["--all-skipped-exit"]:
        all_skipped_exit, args = int(args[1]), args[2:]
    outcomes = _Outcomes()
    code = pytest.main(args, plugins=[outcomes])
    if code == pytest.ExitCode.OK and all_skipped_exit is not None and outcomes.ran == 0 \
            and outcomes.skipped > 0:
        print(f"run_pytest: every test skipped; exiting {all_skipped_exit}", file=sys.stderr)
        sys.exit(all_skipped_exit)
    if code == pytest.ExitCode.NO_TESTS_COLLECTED:
        print("run_pytest: pytest collected no tests; failing", file=sys.stderr)
        code = 1
    sys.exit(int(code))
