"""Failure reporting shared by deploy/tests/check_*.py: every failure is printed as it is
found and counted, so one run lists all of them instead of stopping at the first."""

import sys

failures = []


def fail(message):
    failures.append(message)
    print(f"FAIL {message}", file=sys.stderr)


def check(condition, message):
    """Records `message` as a failure unless `condition`; returns `condition`."""
    if not condition:
        fail(message)
    return condition
