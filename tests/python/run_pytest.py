"""Runs pytest for CTest and scripts/test, failing when it collected no test.

pytest exits 5 when it collected nothing (a renamed file, a wrong path): that must fail CI like a
failing test does, not pass as "no failures".
"""

import sys

import pytest

if __name__ == "__main__":
    code = pytest.main(sys.argv[1:])
    if code == pytest.ExitCode.NO_TESTS_COLLECTED:
        print("run_pytest: pytest collected no tests; failing", file=sys.stderr)
        code = 1
    sys.exit(int(code))
