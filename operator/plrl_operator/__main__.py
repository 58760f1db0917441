"""`python -m plrl_operator`: run the operator (kopf) with settings from env and flags.

Environment (set by the Helm chart): PLRL_NAMESPACES, PLRL_PEERING, PLRL_METRICS_PORT,
PLRL_LIVENESS_PORT, PLRL_STATUS_INTERVAL, PLRL_FIELD_MANAGER, PLRL_WEBHOOK_PORT, PLRL_WEBHOOK_ADDR,
PLRL_WEBHOOK_CERT_DIR, PLRL_WEBHOOK_HOST; flags override them (see `settings.OperatorConfig`).
Credentials: in-cluster ServiceAccount, else $KUBECONFIG. Neighbours: `settings`, `handlers`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import sys

from plrl_operator import settings


def main(argv: list[str] | None = None) -> int:
    base = settings.from_env()
    p = argparse.ArgumentParser(prog="python -m plrl_operator", description=__doc__.splitlines()[0])
    p.add_argument(
        "-n", "--namespace", action="append", default=None, help="watch this namespace (repeatable)"
    )
    p.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace")
    p.add_argument("--peering", default=base.peering, help="kopf peering name (several replicas, one active)")
    p.add_argument("--standalone", action="store_true", help="no peering: this process is the only one")
    p.add_argument(
        "--priority",
        type=int,
        default=int(os.environ["PLRL_PRIORITY"]) if "PLRL_PRIORITY" in os.environ else None,
        help="peering priority (highest live replica works); default: random, so replicas never tie",
    )
    p.add_argument("--metrics-port", type=int, default=base.metrics_port, help="0 disables /metrics")
    p.add_argument("--liveness-port", type=int, default=base.liveness_port, help="0 disables /healthz")
    p.add_argument("--status-interval", type=float, default=base.status_interval, help="seconds")
    p.add_argument("--webhook-port", type=int, default=base.webhook_port, help="admission webhook; 0: none")
    p.add_argument("--webhook-addr", default=base.webhook_addr, help="address the webhook listens on")
    p.add_argument("--webhook-cert-dir", default=base.webhook_cert_dir, help="tls.crt, tls.key, ca.crt")
    p.add_argument(
        "--webhook-host",
        default=base.webhook_host,
        help="outside the cluster: register the webhook as https://HOST:PORT (generates a certificate)",
    )
    p.add_argument(
        "--worker-cluster-role",
        default=base.worker_cluster_role,
        help="ClusterRole bound to each job's worker pods (the chart's <release>-worker)",
    )
    a = p.parse_args(argv)
    namespaces = () if a.all_namespaces else tuple(a.namespace or base.namespaces)
    config = dataclasses.replace(
        base,
        namespaces=namespaces,
        peering=None if a.standalone else a.peering,
        priority=a.priority if a.priority is not None else random.randint(1, 1_000_000),
        metrics_port=a.metrics_port,
        liveness_port=a.liveness_port,
        status_interval=a.status_interval,
        webhook_port=a.webhook_port,
        webhook_addr=a.webhook_addr,
        webhook_cert_dir=a.webhook_cert_dir or None,
        webhook_host=a.webhook_host or None,
        worker_cluster_role=a.worker_cluster_role,
    )
    problem = settings.check(config)
    if problem:
        p.error(problem)
    from plrl_operator import handlers  # imports kopf: only now that the flags are known good

    handlers.run(config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
