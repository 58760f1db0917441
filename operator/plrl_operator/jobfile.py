"""Reading a job file (`plrl run`, `plrl render`, `plrl plan`, `plrl status`): YAML text -> `PipelineRLJob`.

The same models the API server's validation is generated from (`plrl_api.spec`) validate it, so a
file is refused here exactly when `kubectl apply` would refuse it. The errors name the file and
every bad field. Neighbours: `plrl_api.spec` (the models), the CLI verbs (the callers).
"""

from __future__ import annotations

import pathlib

import yaml

from plrl_api import spec as spec_mod


def load_job(path: str | pathlib.Path) -> spec_mod.PipelineRLJob:
    """Read and validate a job file (the same YAML a user would `kubectl apply`)."""
    p = pathlib.Path(path)
    try:
        text = p.read_text()
    except OSError as err:
        raise spec_mod.JobFileError(f"{p}: cannot read: {err.strerror}") from None
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as err:
        raise spec_mod.JobFileError(f"{p}: not valid YAML: {err}") from None
    if len(docs) != 1:
        raise spec_mod.JobFileError(f"{p}: expected exactly one YAML document, found {len(docs)}")
    try:
        return spec_mod.parse_job(docs[0])
    except spec_mod.JobFileError as err:
        raise spec_mod.JobFileError(f"{p}: invalid PipelineRLJob:\n{err}") from None
