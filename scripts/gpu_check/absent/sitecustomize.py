"""In `scripts/gpu-check.sh --cpu` runs: the packages the GPU machine's image lacks are absent here too.

Python imports `sitecustomize` at start-up from the first folder on sys.path that has one; the
check puts this folder first on PYTHONPATH, so every process it starts (pytest, `plrl run` and its
workers) sees `PLRL_GPU_CHECK_ABSENT` (e.g. "kopf,kubernetes,vllm") as not installed: a None
entry in sys.modules makes `import kopf` raise ModuleNotFoundError and `importlib.util.find_spec`
return None, exactly as on a machine without them. A `sitecustomize` this one shadows still runs.
"""

import importlib.util
import os
import pathlib
import sys

for _name in filter(None, (n.strip() for n in os.environ.get("PLRL_GPU_CHECK_ABSENT", "").split(","))):
    sys.modules[_name] = None  # type: ignore[assignment]  # the documented way to block an import

_here = pathlib.Path(__file__).resolve().parent
for _entry in sys.path:
    _candidate = pathlib.Path(_entry or ".").resolve() / "sitecustomize.py"
    if _candidate.parent != _here and _candidate.is_file():
        _spec = importlib.util.spec_from_file_location("_shadowed_sitecustomize", _candidate)
        if _spec is not None and _spec.loader is not None:
            _spec.loader.exec_module(importlib.util.module_from_spec(_spec))
        break
