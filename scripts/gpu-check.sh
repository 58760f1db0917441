#!/usr/bin/env bash
# The prepared GPU check: the CUDA torch engine, the trainer backends on CUDA, bf16,
# `plrl profile` + `plrl plan` with the measured utilisation curve, decode throughput and a short
# `plrl run`, in one command that fits in 8 minutes on the GPU machine and writes results.json +
# summary.txt (+ logs.txt, the curve, the run's report) into --out. See scripts/gpu_check/.
#
#   scripts/gpu-check.sh --fetch                  # here, once: the wheels that travel, into .whl/
#   scripts/gpu-check.sh --dry-run                # here: what would travel, and whether it fits
#   scripts/gpu-check.sh --out "$OUT"             # there: run everything (carry .whl)
#   scripts/gpu-check.sh --cpu --out runs/gpu-check   # anywhere (CI): CUDA-only parts skipped
#
# The GPU machine has Python 3.12 with torch but no package registry and no build backend for
# `pip install -e .`: the carried wheels go into a target folder and the sources are put on
# PYTHONPATH. Exit code: 0 when everything passed, 1 when a stage failed, 2 for bad usage.
set -uo pipefail
cd "$(dirname "$0")/.."

SITE="${PLRL_GPU_CHECK_SITE:-/tmp/plrl-gpu-check-site}"
mode=gpu
for arg in "$@"; do
  case "$arg" in
    --cpu) mode=cpu ;;
    --dry-run | --fetch | -h | --help) mode=local ;;
  esac
done

if [[ -n "${PYTHON:-}" ]]; then
  PY="$PYTHON"
elif [[ "$mode" != gpu && -x .venv/bin/python ]]; then
  PY=.venv/bin/python # here: the project's venv (it has pydantic and the dev tools)
else
  PY=python3 # the GPU image's interpreter, the one that holds torch
fi

if [[ "$mode" == gpu ]]; then
  shopt -s nullglob
  wheels=(.whl/*.whl)
  if ((${#wheels[@]})); then
    mkdir -p "$SITE"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$SITE" "${wheels[@]}" >"$SITE.log" 2>&1
    export PLRL_GPU_CHECK_INSTALL_RC=$?
    echo "[gpu-check] installed ${#wheels[@]} carried wheels into $SITE (exit code $PLRL_GPU_CHECK_INSTALL_RC)"
    ((PLRL_GPU_CHECK_INSTALL_RC == 0)) || tail -5 "$SITE.log"
  else
    export PLRL_GPU_CHECK_INSTALL_RC="no wheels in .whl/ (run --fetch here and carry .whl)"
    echo "[gpu-check] $PLRL_GPU_CHECK_INSTALL_RC"
  fi
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi

exec "$PY" -m scripts.gpu_check "$@"
