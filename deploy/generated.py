"""Generated files of deploy/: write one, or check that the committed one is current.

Used by deploy/kubernetes/generate-prometheusrule.py and deploy/grafana/build_dashboard.py;
with --check they write nothing and exit 1, naming the file and the generator to run, when the
committed file differs from what the generator makes (deploy/test.sh runs both checks).
"""

import os
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def write_or_check(path, text, generator, check):
    """Returns the exit status: 0 written or current, 1 out of date (with check)."""
    name = os.path.relpath(path, REPO)
    if check:
        try:
            with open(path, encoding="utf-8") as f:
                committed = f.read()
        except FileNotFoundError:
            committed = None
        if committed != text:
            print(f"{name} differs from what {generator} makes: run {generator}", file=sys.stderr)
            return 1
        print(f"{name}: matches {generator}")
        return 0
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {name}")
    return 0
