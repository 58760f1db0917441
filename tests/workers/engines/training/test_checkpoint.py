"""Checkpoints: saving does not perturb training (3 steps + save + 2 == 5 straight), a fresh process
resumed from the latest checkpoint continues to the same parameters, the saved `model/` loads as an
ordinary transformers model + tokenizer, the caller's JSON blob round-trips, only the last `keep`
are kept, and an unfinished (`.tmp-`) checkpoint is never picked. DDP and DeepSpeed ZeRO-2, 2 ranks."""

from __future__ import annotations

import json
import pathlib

import pytest
import torch

from plrl_workers import checkpoint
from tests.workers.engines.training import conftest

RUNS = conftest.CHECKPOINT_RUNS


@pytest.fixture(scope="module")
def runs(two_ranks: pathlib.Path, tiny_model_dir: pathlib.Path) -> pathlib.Path:
    """`two_ranks` ran the first phase (5 straight; 3 + checkpoints + 2); resume in fresh processes."""
    args = ["--model", str(tiny_model_dir), "--out", str(two_ranks), "--checkpoint", ",".join(RUNS)]
    conftest.launch_ranks(2, [*args, "--phase", "resume"])
    return two_ranks


def _params(out: pathlib.Path, run: str, what: str, rank: int = 0) -> dict[str, torch.Tensor]:
    params: dict[str, torch.Tensor] = torch.load(out / f"{run}.{what}.rank{rank}.pt", weights_only=True)[
        "params"
    ]
    return params


def _assert_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for n in a:
        torch.testing.assert_close(a[n], b[n], atol=0, rtol=0, msg=n)


@pytest.mark.slow
@pytest.mark.parametrize("run", RUNS)
def test_interrupting_and_resuming_gives_the_same_parameters(runs: pathlib.Path, run: str) -> None:
    straight = _params(runs, run, "straight")
    _assert_equal(_params(runs, run, "interrupted"), straight)
    for rank in (0, 1):
        _assert_equal(_params(runs, run, "resumed", rank), straight)
    info = json.loads((runs / f"{run}.resumed.rank1.json").read_text())
    assert info == {"step": 3, "version": 3, "extra": {"prompts_issued": 36, "cursor": [3, "x"]}}


@pytest.mark.slow
@pytest.mark.parametrize("run", RUNS)
def test_the_saved_model_loads_as_a_transformers_model(runs: pathlib.Path, run: str) -> None:
    import transformers

    root = runs / f"ckpt-{run}"
    assert [p.name for p in checkpoint.checkpoints(root)] == ["step-00000002", "step-00000003"]  # keep=2
    latest = checkpoint.latest(root)
    assert latest is not None and checkpoint.read_meta(latest).version == 3
    model = transformers.AutoModelForCausalLM.from_pretrained(str(latest / "model"), dtype=torch.float32)
    after3 = _params(runs, run, "after3")
    _assert_equal({n: p.detach() for n, p in model.named_parameters()}, after3)
    tok = transformers.AutoTokenizer.from_pretrained(str(latest / "model"))
    assert tok.decode(tok("12+3=15", add_special_tokens=False).input_ids) == "12+3=15"


def test_latest_ignores_unfinished_checkpoints_and_prune_keeps_the_newest(tmp_path: pathlib.Path) -> None:
    assert checkpoint.latest(tmp_path / "none") is None
    for step in (5, 40, 7):
        d = tmp_path / checkpoint.dir_name(step)
        d.mkdir()
        (d / "meta.json").write_text(json.dumps({"step": step, "version": step, "created": 0.0, "extra": {}}))
    (tmp_path / ".tmp-step-00000099").mkdir()  # a crash mid-save
    (tmp_path / checkpoint.dir_name(98)).mkdir()  # no meta.json: not a checkpoint
    assert checkpoint.latest(tmp_path) == tmp_path / "step-00000040"
    deleted = checkpoint.prune(tmp_path, keep=2)
    assert [p.name for p in deleted] == ["step-00000005"]
    assert [p.name for p in checkpoint.checkpoints(tmp_path)] == ["step-00000007", "step-00000040"]
