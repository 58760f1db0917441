"""`plrl render job.yaml`: print the objects the operator would create, as a YAML stream.

Like `helm template`: no cluster needed. The RPC token is shown as a placeholder (the operator
generates a random one at creation) and objects carry no owner reference (a file has no uid).
Neighbours: `plrl_operator.render` (the pure function), `plrl_operator.cli` (dispatch).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import yaml

from plrl_api import names, spec
from plrl_operator import jobfile, render
from plrl_operator.policy import decide


class _Dumper(jobfile.Dumper):
    """Multi-line strings (the ConfigMap's JSON files) as readable `|` blocks; no YAML aliases;
    strings kubectl would read as numbers or booleans quoted."""


def _str(dumper: jobfile.Dumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump(objects: list[dict[str, Any]]) -> str:
    """The objects as one YAML stream, in render order (what `kubectl apply -f -` takes)."""
    return yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False, width=120)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="plrl render", description=__doc__.splitlines()[0])
    parser.add_argument("job", help="PipelineRLJob YAML file")
    parser.add_argument(
        "--generators", type=int, default=None, help="I: generator accelerators (default: the planner's)"
    )
    parser.add_argument(
        "--namespace", default=None, help="namespace to render into (default: the job's, else 'default')"
    )
    parser.add_argument(
        "--worker-cluster-role",
        default=names.WORKER_CLUSTER_ROLE,
        help="the ClusterRole bound to the worker pods: the chart's <release>-worker (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    try:
        job = jobfile.load_job(args.job)
    except spec.JobFileError as err:
        print(f"plrl render: {err}", file=sys.stderr)
        return 2
    job.metadata.namespace = args.namespace or job.metadata.namespace or "default"
    generators = args.generators if args.generators is not None else decide.current_generators(job.spec, None)
    try:
        objects = render.render(job, generators, worker_role=args.worker_cluster_role)
    except ValueError as err:
        print(f"plrl render: --generators: {err}", file=sys.stderr)
        return 2
    sys.stdout.write(dump(objects))
    return 0
