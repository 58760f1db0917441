"""`plrl`: the command line. Thin dispatch; each verb lives in the module that owns its logic.

Verbs are modules named by string and imported on use, so `plrl crd` imports neither torch nor kopf
and `plrl run` not kopf; `profile` is the one verb that runs worker code in this process (it
measures the device). Every verb module exposes `main(argv: list[str]) -> int`.
"""

from __future__ import annotations

import importlib
import sys

# verb -> (module, one-line help). The module's `main(argv)` parses its own arguments.
VERBS: dict[str, tuple[str, str]] = {
    "run": ("plrl_operator.local.runner", "run a job on this machine as local processes"),
    "plan": ("plrl_operator.plan_cli", "print the throughput model's plan for a job or cluster size"),
    "simulate": ("plrl_operator.simulate_cli", "simulate a job on N accelerators (discrete events)"),
    "profile": ("plrl_workers.profiler", "measure the utilisation curve U(h) on this device"),
    "render": ("plrl_operator.render_cli", "print the Kubernetes objects the operator would create"),
    "crd": ("plrl_operator.crd", "print the PipelineRLJob CustomResourceDefinition"),
    "status": ("plrl_operator.local.status_cli", "show the progress of a local run directory"),
}


def _usage() -> str:
    width = max(len(v) for v in VERBS)
    lines = ["usage: plrl <verb> [options]", "", "verbs:"]
    lines += [f"  {verb:<{width}}  {help_}" for verb, (_, help_) in VERBS.items()]
    lines += ["", "`plrl <verb> --help` describes a verb's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0 if args else 2
    verb, rest = args[0], args[1:]
    if verb not in VERBS:
        print(f"plrl: unknown verb {verb!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(VERBS[verb][0])
    code: int = module.main(rest)
    return code


if __name__ == "__main__":
    sys.exit(main())
