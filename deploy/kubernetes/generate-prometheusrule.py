#!/usr/bin/env python3
"""Writes deploy/kubernetes/base/prometheusrule.yaml from deploy/prometheus/alerts.yml.

deploy/prometheus/alerts.yml is the one place the alert rules are written (promtool checks and
unit-tests it); the Prometheus operator's PrometheusRule carries the same groups under spec.
Run this after changing alerts.yml. `--check` writes nothing and exits 1, naming the file, when
the committed PrometheusRule differs from what it would write (deploy/test.sh runs it).

Each rule's `runbook` (a path in this repository, e.g. docs/operations.md#runbook-cell-down) also
becomes a `runbook_url` a pager can open: `--runbook-base-url` (env
TOPOLOGY_CLAIMS_RUNBOOK_BASE_URL; default: this repository's docs on GitHub) followed by the path.
Point it at your own mirror of the docs and write the result into your overlay with `--output`.
"""

import argparse
import os
import sys

import yaml

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "deploy"))
import generated  # noqa: E402  (deploy/generated.py)

ALERTS = os.path.join(REPO, "deploy", "prometheus", "alerts.yml")
OUTPUT = os.path.join(REPO, "deploy", "kubernetes", "base", "prometheusrule.yaml")

HEADER = """\
# GENERATED from deploy/prometheus/alerts.yml by deploy/kubernetes/generate-prometheusrule.py:
# edit alerts.yml, then run the script. deploy/test.sh fails when this file differs.
"""


class Dumper(yaml.SafeDumper):
    pass


def _str(dumper, value):
    # Multi-line strings (expressions, descriptions) as literal blocks, like alerts.yml.
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


Dumper.add_representer(str, _str)


DEFAULT_RUNBOOK_BASE_URL = "https://github.com/topology-claims/topology-claims/blob/main/"


def render(runbook_base_url=DEFAULT_RUNBOOK_BASE_URL):
    with open(ALERTS, encoding="utf-8") as f:
        alerts = yaml.safe_load(f)
    groups = alerts.get("groups") if isinstance(alerts, dict) else None
    if not groups:
        sys.exit(f"generate-prometheusrule: {ALERTS} has no `groups`")
    if not runbook_base_url.endswith("/"):
        runbook_base_url += "/"
    for group in groups:
        for rule in group.get("rules", []):
            annotations = rule.get("annotations", {})
            if "runbook" in annotations:
                annotations["runbook_url"] = runbook_base_url + annotations["runbook"]
    rule = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "topology-claims",
            "labels": {
                "app.kubernetes.io/name": "topology-claims",
                "app.kubernetes.io/part-of": "topology-claims",
            },
        },
        "spec": {"groups": groups},
    }
    return HEADER + yaml.dump(rule, Dumper=Dumper, sort_keys=False, width=100, allow_unicode=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if the committed file is out of date")
    parser.add_argument("--runbook-base-url",
                        default=os.environ.get("TOPOLOGY_CLAIMS_RUNBOOK_BASE_URL")
                        or DEFAULT_RUNBOOK_BASE_URL,
                        help="URL the runbook paths are appended to (default: %(default)s)")
    parser.add_argument("--output", default=OUTPUT,
                        help="file to write (default: the kustomize base's prometheusrule.yaml)")
    args = parser.parse_args()
    if args.check and (args.output != OUTPUT
                       or args.runbook_base_url.rstrip("/") + "/" != DEFAULT_RUNBOOK_BASE_URL):
        sys.exit("generate-prometheusrule: --check compares the committed base file, generated "
                 "with the default --runbook-base-url and --output")
    return generated.write_or_check(args.output, render(args.runbook_base_url),
                                    "deploy/kubernetes/generate-prometheusrule.py", args.check)

if __name__ == "__main__":
    sys.exit(main())
