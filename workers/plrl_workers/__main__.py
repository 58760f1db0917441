"""`plrl-worker --role generator|trainer --config FILE`: the one entry point of every worker process.

The operator's pods run it (`/etc/plrl/<role>.json` from the job's ConfigMap) and so does `plrl
run` (config files in the run directory). It reads the config (`plrl_api.worker_config`) and the
process's identity (`plrl_api.identity`), refuses to start (exit 2) on a bad one, or on a model
directory that is not there, with a message naming the file, field or variable (in a pod the kubelet
keeps that last line as the container's termination message, which the operator quotes in the job's
conditions and events), and hands over to the role: `generator.main`, or `trainer.main` /
`conventional.main` depending on `spec.pipeline.mode`.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from plrl_api import identity, names, worker_config
from plrl_api import spec as spec_mod


def model_problem(cfg: worker_config.WorkerConfig) -> str:
    """Why the config's model directory cannot be loaded ("" if it can): caught here, before the
    engines, whose errors for a missing path are about Hub repository names."""
    model = pathlib.Path(cfg.paths.model_dir)
    if (model / "config.json").is_file():
        return ""
    where = "no such directory" if not model.exists() else "no config.json in it"
    return (
        f"spec.model.name: {model} is not a Hugging Face model directory ({where}); "
        "in a cluster it must be on a volume the pods mount (spec.model.volume)"
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="plrl-worker", description=__doc__.splitlines()[0])
    ap.add_argument("--role", required=True, choices=names.ROLES, help="which worker this process is")
    ap.add_argument("--config", required=True, help="worker config JSON (in a pod: /etc/plrl/<role>.json)")
    args = ap.parse_args(argv)
    try:
        cfg = worker_config.load(args.config)
        ident = identity.Identity.from_env()
    except (worker_config.ConfigError, identity.IdentityError) as err:
        print(f"plrl-worker: {err}", file=sys.stderr)
        return 2
    if cfg.role != args.role:
        print(f"plrl-worker: {args.config} is a {cfg.role} config, not a {args.role} one", file=sys.stderr)
        return 2
    problem = model_problem(cfg)
    if problem:
        print(f"plrl-worker: {problem}", file=sys.stderr)
        return 2
    # Imported here: each role pulls in torch and its engines, which argument errors never need.
    if args.role == names.GENERATOR:
        from plrl_workers import generator

        return generator.main(cfg, ident)
    if cfg.spec.pipeline.mode is spec_mod.PipelineMode.CONVENTIONAL:
        from plrl_workers import conventional

        return conventional.main(cfg, ident, argv)
    from plrl_workers import trainer

    return trainer.main(cfg, ident, argv)


if __name__ == "__main__":
    raise SystemExit(main())
