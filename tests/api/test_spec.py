"""The job spec: defaults users rely on, every rule on both sides of its bound, errors that name
the field, and job files read the way kubectl reads them, in bounded time and memory.

Cases: defaults (a job names only its model); camelCase round trip; each cross-field rule refused
just past its bound and accepted on it, naming the field with the CRD's message; strict values
(no strings for numbers or booleans, whole floats are integers, no NaN or infinity, bounded
seeds); Kubernetes quantities; `null` pruned as the API server prunes it; the builtin task,
reward and model names equal the workers'; YAML resolution as kubectl's (`1e-6` is a number,
`1:30` a string, keys are strings); file-level refusals (size, encoding, alias bombs, depth) as
one line naming the file; every shipped job file is valid.
"""

from __future__ import annotations

import pathlib
import time
from typing import Any

import pytest

from plrl_api import spec, validation
from plrl_operator import jobfile
from plrl_workers import prepare
from plrl_workers.tasks import registry, rewards


def _job(**spec_overrides: object) -> dict[str, object]:
    return {
        "apiVersion": "pipelinerl.io/v1alpha1",
        "kind": "PipelineRLJob",
        "metadata": {"name": "demo"},
        "spec": {"model": {"name": "/models/demo"}, **spec_overrides},
    }


def _refusal(**spec_overrides: object) -> list[str]:
    with pytest.raises(spec.JobFileError) as exc:
        spec.parse_job(_job(**spec_overrides))
    return str(exc.value).splitlines()


def test_defaults_are_the_seed_values() -> None:
    job = spec.parse_job(_job())
    a = job.spec.pipeline.autoscale
    assert (a.every_steps, a.lower_ratio, a.upper_ratio, a.step_down, a.step_up) == (10, 0.9, 0.95, 5, 2)
    assert job.spec.training.loss.is_clamp == 5.0
    assert job.spec.resources.gpu_resource_name == "nvidia.com/gpu"
    assert (job.spec.resources.cpu, job.spec.resources.memory) == ("4", "32Gi")


def test_camel_case_round_trip() -> None:
    doc = _job(resources={"totalGPUs": 16, "gpusPerGenerator": 2}, pipeline={"generators": 4})
    job = spec.parse_job(doc)
    assert job.spec.resources.total_gpus == 16
    dumped = spec.dump_job(job)
    assert dumped["spec"]["resources"]["totalGPUs"] == 16
    assert spec.parse_job(dumped) == job


def test_a_job_names_its_model() -> None:
    doc = _job()
    del doc["spec"]["model"]  # type: ignore[attr-defined]
    with pytest.raises(spec.JobFileError, match=r"^spec\.model: required field is missing$"):
        spec.parse_job(doc)
    assert _refusal(model={}) == ["spec.model.name: required field is missing"]
    with pytest.raises(spec.JobFileError, match=r"^spec: required field is missing$"):
        spec.parse_job({k: v for k, v in _job().items() if k != "spec"})


TINY_REVERSE = {"model": {"name": "builtin:tiny"}, "task": {"name": "builtin:reverse"}}

# (case, spec that breaks one rule, the same spec just inside the bound, field, words of the message)
RULES: list[tuple[str, dict[str, Any], dict[str, Any], str, str]] = [
    (
        "generators-below-n",
        {"resources": {"totalGPUs": 8}, "pipeline": {"generators": 8}},
        {"resources": {"totalGPUs": 8}, "pipeline": {"generators": 7}},
        "spec.pipeline.generators",
        "pipeline.generators=8 must be less than resources.totalGPUs=8 (trainers need accelerators)",
    ),
    (
        "generators-tile",
        {"resources": {"totalGPUs": 8, "gpusPerGenerator": 2}, "pipeline": {"generators": 3}},
        {"resources": {"totalGPUs": 8, "gpusPerGenerator": 2}, "pipeline": {"generators": 4}},
        "spec.pipeline.generators",
        "must be a multiple of resources.gpusPerGenerator=2",
    ),
    (
        "trainers-tile",
        {"resources": {"totalGPUs": 5, "gpusPerTrainer": 2}, "pipeline": {"generators": 2}},
        {"resources": {"totalGPUs": 5, "gpusPerTrainer": 2}, "pipeline": {"generators": 3}},
        "spec.resources.gpusPerTrainer",
        "resources.totalGPUs=5 - pipeline.generators=2 must be a multiple of resources.gpusPerTrainer=2",
    ),
    (
        "fits-one-of-each",
        {"resources": {"totalGPUs": 3, "gpusPerGenerator": 2, "gpusPerTrainer": 2}},
        {"resources": {"totalGPUs": 4, "gpusPerGenerator": 2, "gpusPerTrainer": 2}},
        "spec.resources.totalGPUs",
        "must fit at least one generator",
    ),
    (
        "batch-groups",
        {"training": {"batchSize": 100}, "generation": {"samplesPerPrompt": 8}},
        {"training": {"batchSize": 104}, "generation": {"samplesPerPrompt": 8}},
        "spec.training.batchSize",
        "training.batchSize=100 must be a multiple of generation.samplesPerPrompt=8",
    ),
    (
        "slots-hold-a-group",
        {"generation": {"concurrentSequences": 7, "samplesPerPrompt": 8}},
        {"generation": {"concurrentSequences": 8, "samplesPerPrompt": 8}},
        "spec.generation.concurrentSequences",
        "generation.concurrentSequences=7 (x resources.gpusPerGenerator=1 in pipeline mode) must be at least",
    ),
    (
        "slots-per-generator-pod",  # pipeline mode: H per accelerator, 2 accelerators per generator
        {"generation": {"concurrentSequences": 3}, "resources": {"gpusPerGenerator": 2}},
        {"generation": {"concurrentSequences": 4}, "resources": {"gpusPerGenerator": 2}},
        "spec.generation.concurrentSequences",
        "resources.gpusPerGenerator=2 in pipeline mode",
    ),
    (
        "slots-conventional",  # conventional mode: one generator per accelerator
        {
            "generation": {"concurrentSequences": 4},
            "resources": {"gpusPerGenerator": 2},
            "pipeline": {"mode": "conventional"},
        },
        {
            "generation": {"concurrentSequences": 8},
            "resources": {"gpusPerGenerator": 2},
            "pipeline": {"mode": "conventional"},
        },
        "spec.generation.concurrentSequences",
        "must be at least generation.samplesPerPrompt=8",
    ),
    (
        "model-len-above-new-tokens",
        {"generation": {"maxModelLen": 64, "maxNewTokens": 64}, "training": {"tokensPerMicroBatch": 64}},
        {"generation": {"maxModelLen": 65, "maxNewTokens": 64}, "training": {"tokensPerMicroBatch": 65}},
        "spec.generation.maxModelLen",
        "generation.maxModelLen=64 must be greater than generation.maxNewTokens=64",
    ),
    (
        "micro-batch-holds-new-tokens",
        {"generation": {"maxNewTokens": 128}, "training": {"tokensPerMicroBatch": 127}},
        {"generation": {"maxNewTokens": 128}, "training": {"tokensPerMicroBatch": 128}},
        "spec.training.tokensPerMicroBatch",
        "training.tokensPerMicroBatch=127 must be at least generation.maxNewTokens=128",
    ),
    (
        "micro-batch-holds-model-len",
        {"generation": {"maxNewTokens": 16, "maxModelLen": 64}, "training": {"tokensPerMicroBatch": 63}},
        {"generation": {"maxNewTokens": 16, "maxModelLen": 64}, "training": {"tokensPerMicroBatch": 64}},
        "spec.training.tokensPerMicroBatch",
        "training.tokensPerMicroBatch=63 must be at least generation.maxModelLen=64",
    ),
    (
        "tiny-prompt-fits-model-len",  # the crash-looping generator: 13 + 10 > 22
        {**TINY_REVERSE, "generation": {"maxNewTokens": 10, "maxModelLen": 22}},
        {**TINY_REVERSE, "generation": {"maxNewTokens": 10, "maxModelLen": 23}},
        "spec.generation.maxModelLen",
        "generation.maxModelLen=22 must be at least 13 + generation.maxNewTokens=10",
    ),
    (
        "tiny-prompt-fits-micro-batch",  # the issue's `tokensPerMicroBatch: 16`, no maxModelLen
        {**TINY_REVERSE, "generation": {"maxNewTokens": 10}, "training": {"tokensPerMicroBatch": 22}},
        {**TINY_REVERSE, "generation": {"maxNewTokens": 10}, "training": {"tokensPerMicroBatch": 23}},
        "spec.training.tokensPerMicroBatch",
        "the longest builtin:reverse prompt is 13 tokens of builtin:tiny",
    ),
    (
        "tiny-arith-prompt",
        {"model": {"name": "builtin:tiny"}, "generation": {"maxNewTokens": 10, "maxModelLen": 16}},
        {"model": {"name": "builtin:tiny"}, "generation": {"maxNewTokens": 10, "maxModelLen": 17}},
        "spec.generation.maxModelLen",
        "generation.maxModelLen=16 must be at least 7 + generation.maxNewTokens=10",
    ),
    (
        "autoscale-max-below-n",
        {"resources": {"totalGPUs": 8}, "pipeline": {"autoscale": {"maxGenerators": 8}}},
        {"resources": {"totalGPUs": 8}, "pipeline": {"autoscale": {"maxGenerators": 7}}},
        "spec.pipeline.autoscale.maxGenerators",
        "must be less than resources.totalGPUs=8",
    ),
    (
        "autoscale-ratios",
        {"pipeline": {"autoscale": {"lowerRatio": 0.95, "upperRatio": 0.95}}},
        {"pipeline": {"autoscale": {"lowerRatio": 0.9, "upperRatio": 0.95}}},
        "spec.pipeline.autoscale.lowerRatio",
        "autoscale.lowerRatio=0.95 must be less than autoscale.upperRatio=0.95",
    ),
    (
        "autoscale-min-max",
        {"pipeline": {"autoscale": {"minGenerators": 3, "maxGenerators": 2}}},
        {"pipeline": {"autoscale": {"minGenerators": 2, "maxGenerators": 2}}},
        "spec.pipeline.autoscale.minGenerators",
        "must not exceed autoscale.maxGenerators=2",
    ),
    (
        "heartbeat",
        {"heartbeat": {"intervalSeconds": 10, "timeoutSeconds": 10}},
        {"heartbeat": {"intervalSeconds": 10, "timeoutSeconds": 10.5}},
        "spec.heartbeat.timeoutSeconds",
        "heartbeat.timeoutSeconds=10 must be greater than heartbeat.intervalSeconds=10",
    ),
    (
        "heartbeat-startup",
        {"heartbeat": {"timeoutSeconds": 60, "startupTimeoutSeconds": 59}},
        {"heartbeat": {"timeoutSeconds": 60, "startupTimeoutSeconds": 60}},
        "spec.heartbeat.startupTimeoutSeconds",
        "heartbeat.startupTimeoutSeconds=59 must be at least heartbeat.timeoutSeconds=60",
    ),
    (
        "hybrid",
        {"pipeline": {"mode": "hybrid"}},
        {"pipeline": {"mode": "hybrid", "hybridSwitchStep": 5}},
        "spec.pipeline.hybridSwitchStep",
        "required when pipeline.mode is hybrid",
    ),
    (
        "jsonl-dataset",
        {"task": {"name": "jsonl"}},
        {"task": {"name": "jsonl", "dataset": {"path": "p.jsonl"}}},
        "spec.task.dataset",
        "task.dataset is required when task.name is jsonl",
    ),
    (
        "dataset-one-source",
        {"task": {"name": "jsonl", "dataset": {"path": "p", "configMap": {"name": "c", "key": "k"}}}},
        {"task": {"name": "jsonl", "dataset": {"configMap": {"name": "c", "key": "k"}}}},
        "spec.task.dataset",
        "exactly one of dataset.path or dataset.configMap",
    ),
    (
        "builtin-reward",
        {"task": {"reward": "builtin:exactmatch"}},
        {"task": {"reward": "builtin:exact_match"}},
        "spec.task.reward",
        "task.reward=builtin:exactmatch is not a builtin reward",
    ),
    (
        "builtin-model",
        {"model": {"name": "builtin:huge"}},
        {"model": {"name": "builtin:tiny"}},
        "spec.model.name",
        "model.name=builtin:huge is not a builtin model (known: builtin:tiny)",
    ),
    (
        "delay-compensation-torch-only",
        {"training": {"backend": "deepspeed", "delayCompensation": 0.5}},
        {"training": {"backend": "torch", "delayCompensation": 0.5}},
        "spec.training.delayCompensation",
        "training.delayCompensation=0.5 needs training.backend=torch, not deepspeed",
    ),
    (
        "warm-start-builtin-only",
        {"model": {"name": "/models/demo", "warmStartSteps": 1}},
        {"model": {"name": "builtin:tiny", "warmStartSteps": 1}},
        "spec.model.warmStartSteps",
        "only supported for builtin models",
    ),
]


@pytest.mark.parametrize(("case", "bad", "good", "field", "words"), RULES, ids=[r[0] for r in RULES])
def test_each_rule_on_both_sides_of_its_bound(
    case: str, bad: dict[str, Any], good: dict[str, Any], field: str, words: str
) -> None:
    lines = _refusal(**bad)
    assert lines and all(line.startswith(f"{field}: ") for line in lines), lines
    assert any(words in line for line in lines), lines
    spec.parse_job(_job(**good))


def test_only_the_jobs_own_task_length_applies() -> None:
    lines = _refusal(**TINY_REVERSE, generation={"maxNewTokens": 10}, training={"tokensPerMicroBatch": 16})
    assert lines == [
        "spec.training.tokensPerMicroBatch: training.tokensPerMicroBatch=16 must be at least 13 + "
        "generation.maxNewTokens=10 (the longest builtin:reverse prompt is 13 tokens of builtin:tiny; "
        "sequences are never split)"
    ]


def test_rule_messages_are_the_crd_messages() -> None:
    """Each Rule renders into pydantic's message and the CRD's messageExpression from one text."""
    rule = next(r for r in spec.JobSpec.RULES if r.field == "training.batchSize")
    assert rule.crd() == {
        "rule": "self.training.batchSize % self.generation.samplesPerPrompt == 0",
        "messageExpression": '"training.batchSize=%s must be a multiple of generation.samplesPerPrompt=%s '
        "(a prompt's samples form one baseline group)\".format([self.training.batchSize, "
        "self.generation.samplesPerPrompt])",
        "fieldPath": ".training.batchSize",
    }


@pytest.mark.parametrize(
    ("overrides", "field", "reason"),
    [
        ({"training": {"batchSiz": 100}}, "spec.training.batchSiz", "unknown field"),
        ({"generation": {"engine": "sglang"}}, "spec.generation.engine", "'vllm' or 'torch'"),
        ({"resources": {"totalGPUs": 1}}, "spec.resources.totalGPUs", "greater than or equal to 2"),
        (
            {"task": {"name": "arith"}},
            "spec.task.name",
            "must be one of jsonl, builtin:arith, builtin:reverse",
        ),
        ({"training": {"batchSize": "64"}}, "spec.training.batchSize", "valid integer"),
        ({"training": {"batchSize": True}}, "spec.training.batchSize", "valid integer"),
        ({"training": {"batchSize": 64.5}}, "spec.training.batchSize", "valid integer"),
        ({"training": {"learningRate": "3e-4"}}, "spec.training.learningRate", "valid number"),
        ({"suspend": "yes"}, "spec.suspend", "valid boolean"),
        ({"training": {"gradientClipping": float("inf")}}, "spec.training.gradientClipping", "finite"),
        ({"generation": {"temperature": float("nan")}}, "spec.generation.temperature", "finite"),
        ({"model": {"name": "m", "seed": 1e30}}, "spec.model.seed", "less than or equal to 4294967295"),
        ({"training": {"seed": 2**64}}, "spec.training.seed", "less than or equal to 4294967295"),
        ({"task": {"seed": -1}}, "spec.task.seed", "greater than or equal to 0"),
        ({"task": {"reward": "modulé:fn"}}, "spec.task.reward", "should match pattern"),
        (
            {"resources": {"tolerations": [{"operator": "Sometimes"}]}},
            "spec.resources.tolerations.0.operator",
            "Exists",
        ),
    ],
)
def test_bad_values_name_the_field(overrides: dict[str, Any], field: str, reason: str) -> None:
    lines = _refusal(**overrides)
    assert lines[0].startswith(field + ":"), lines
    assert reason in lines[0], lines


def test_whole_floats_are_integers_and_seeds_reach_2_to_the_32() -> None:
    s = spec.parse_job(_job(training={"batchSize": 64.0, "zeroStage": 2.0, "seed": 2**32 - 1})).spec
    assert (s.training.batch_size, s.training.zero_stage, s.training.seed) == (64, 2, 2**32 - 1)
    assert type(s.training.batch_size) is int


@pytest.mark.parametrize("value", ["4", "500m", "1.5", "32Gi", "1e3", "0", "+2", ".5Ki", 4, 0])
def test_quantities_are_accepted(value: object) -> None:
    assert spec.parse_job(_job(resources={"cpu": value, "memory": value})).spec.resources.cpu == str(value)


@pytest.mark.parametrize("value", ["banana", "-5 potatoes", "-5", -4, "5 Gi", "", "1Gb", 0.5, True, "1" * 65])
def test_non_quantities_are_refused_naming_the_field(value: object) -> None:
    for key in ("cpu", "memory"):
        lines = _refusal(resources={key: value})
        assert lines[0].startswith(f"spec.resources.{key}: "), lines


def test_nulls_are_pruned_as_the_api_server_prunes_them() -> None:
    s = spec.parse_job(_job(training=None, generation={"maxModelLen": None}, suspend=None)).spec
    assert s.training == spec.TrainingSpec() and s.generation.max_model_len is None
    assert validation.prune_nulls({"a": None, "b": [{"c": None}], "d": 1}) == {"b": [{}], "d": 1}


def test_builtin_names_are_the_workers() -> None:
    assert set(spec.BUILTIN_TASKS) == set(registry.BUILTIN)
    assert set(spec.BUILTIN_REWARDS) == set(rewards.BUILTIN_REWARDS)
    assert spec.BUILTIN_MODELS == prepare.BUILTIN_MODELS


@pytest.mark.parametrize("task", sorted(registry.BUILTIN))
def test_builtin_prompt_lengths_bound_the_real_prompts(task: str) -> None:
    """BUILTIN_TASKS[task] is the longest prompt in builtin:tiny tokens: one per character + BOS."""
    from plrl_workers.models import tiny
    from plrl_workers.tasks import base

    t = registry.builtin(task)
    longest = max(len(item.text) for item in base.take(t, seed=0, n=3000))
    vocab = tiny.vocabulary()
    assert all(c in tiny.CHARACTERS for c in base.take(t, seed=1, n=1)[0].text)
    assert longest + 1 == spec.BUILTIN_TASKS[task], (task, longest, len(vocab))


def test_load_job_names_the_file(tmp_path: pathlib.Path) -> None:
    p = tmp_path / "job.yaml"
    p.write_text("apiVersion: pipelinerl.io/v1alpha1\nkind: PipelineRLJob\nmetadata: {name: Bad_Name}\n")
    with pytest.raises(
        spec.JobFileError, match=r"job.yaml: invalid PipelineRLJob:\nmetadata.name: .*DNS label"
    ):
        jobfile.load_job(p)


def test_yaml_is_read_as_kubectl_reads_it() -> None:
    doc = jobfile.parse_yaml(
        b"a: 1e-6\nb: 1e30\nc: 0o17\nd: 017\ne: y\nf: 1:30\ng: 2024-01-01\nh: -.5\ni: 09\n"
        b"1: one\ntrue: yes\nj: &x {k: 1}\nl: *x\nm: 1_000\n",
        "t.yaml",
    )
    assert doc == {
        "a": 1e-6, "b": 1e30, "c": 15, "d": 15, "e": True, "f": "1:30", "g": "2024-01-01", "h": -0.5,
        "i": 9.0, "1": "one", "true": True, "j": {"k": 1}, "l": {"k": 1}, "m": 1000,
    }  # fmt: skip


def _alias_bomb(levels: int = 9) -> bytes:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, levels + 1)]
    return ("\n".join(lines) + "\n").encode()


@pytest.mark.parametrize(
    ("name", "data", "message"),
    [
        ("big", b"# " + b"x" * (2 << 20), "larger than 1024 KiB"),
        ("latin1", b"metadata:\n  name: caf\xe9\n", "not UTF-8: byte 0xe9 at offset 21 (line 2, column 12)"),
        ("bomb", _alias_bomb(), "expands, through its aliases, to more than 20000 YAML nodes"),
        ("recursive", b"a: &x [*x]\n", "alias to one of its own ancestors"),
        ("deep", b"a:\n" + b"".join(b"  " * i + b"- \n" for i in range(100)), "nests deeper than 64"),
        ("flow-deep", b"a: " + b"[" * 5000, "not valid YAML"),
        ("many-nodes", b"a: [" + b"1, " * 30_000 + b"]\n", "more than 20000 YAML nodes"),
        ("two-docs", b"a: 1\n---\nb: 2\n", "expected exactly one YAML document, found 2"),
        ("tab", b"a:\n\t- b\n", "not valid YAML: found character that cannot start any token (line 2"),
        ("tag", b"a: !python/object 1\n", "could not determine a constructor"),
    ],
)
def test_bad_files_are_refused_in_one_line_quickly(name: str, data: bytes, message: str) -> None:
    started = time.perf_counter()
    with pytest.raises(spec.JobFileError) as exc:
        jobfile.parse_yaml(data, f"{name}.yaml")
    assert time.perf_counter() - started < 2.0
    text = str(exc.value)
    assert text.startswith(f"{name}.yaml: ") and "\n" not in text and message in text, text


def test_an_oversized_file_is_not_read_whole(tmp_path: pathlib.Path) -> None:
    p = tmp_path / "huge.yaml"
    with p.open("wb") as f:
        f.truncate(50 << 20)  # 50 MB (sparse)
    with pytest.raises(spec.JobFileError, match="larger than 1024 KiB"):
        jobfile.load_job(p)
    with pytest.raises(spec.JobFileError, match="cannot read"):
        jobfile.load_job(tmp_path)


_ROOT = pathlib.Path(__file__).parents[2]
SHIPPED_JOBS = sorted([*(_ROOT / "examples").glob("*.yaml"), *(_ROOT / "bench" / "jobs").glob("*.yaml")])


@pytest.mark.parametrize("path", SHIPPED_JOBS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_shipped_job_file_is_a_valid_job(path: pathlib.Path) -> None:
    job = jobfile.load_job(path)
    assert job.metadata.name
    assert len(SHIPPED_JOBS) >= 4  # examples/job.yaml, local-tiny.yaml and the bench jobs are found


def test_dumped_yaml_reads_back_unchanged() -> None:
    """The run directory's job.yaml and `plrl render`'s output: strings kubectl would take for
    numbers or booleans are quoted, so both readers get back what was written."""
    doc = {"cpu": "1e3", "b": "y", "c": "0o17", "d": "plain", "e": 1e-6, "f": "1:30", "g": ["n", 2], "h": "~"}
    text = jobfile.dump_yaml(doc)
    assert jobfile.parse_yaml(text.encode(), "t.yaml") == doc
    job = spec.parse_job(_job(resources={"cpu": "1e3", "memory": "1e9"}))
    assert spec.parse_job(jobfile.parse_yaml(jobfile.dump_yaml(spec.dump_job(job)).encode(), "j")) == job


def test_overrides_are_validated_like_the_file(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(
        "apiVersion: pipelinerl.io/v1alpha1\nkind: PipelineRLJob\nmetadata: {name: j}\n"
        "spec:\n  model: {name: 'builtin:tiny'}\n  generation: {samplesPerPrompt: 4}\n"
    )
    job = jobfile.load_job(path, ["spec.training.batchSize=64", "spec.training.totalSteps=7"])
    assert (job.spec.training.batch_size, job.spec.training.total_steps) == (64, 7)
    job = jobfile.load_job(path, ["spec.pipeline.autoscale.enabled=true"])  # creates the groups
    assert job.spec.pipeline.autoscale.enabled
    with pytest.raises(spec.JobFileError, match=r"training\.batchSize=10 must be a multiple"):
        jobfile.load_job(path, ["spec.training.batchSize=10"])
    with pytest.raises(spec.JobFileError, match=r"--set spec\.training: expected path\.to\.field=value"):
        jobfile.load_job(path, ["spec.training"])
    with pytest.raises(
        spec.JobFileError, match=r"--set spec\.model\.name\.x=1: spec\.model\.name is not a mapping"
    ):
        jobfile.load_job(path, ["spec.model.name.x=1"])


@pytest.mark.parametrize(
    ("field", "bad", "good"),
    [
        ("staleWeight", 0, 0.3),
        ("staleWeight", 1.5, 1.0),
        ("behaviourKL", -0.1, 0.05),
        ("behaviourKL", 101, 100),
    ],
)
def test_lag_compensation_settings_are_bounded_and_named(field: str, bad: float, good: float) -> None:
    lines = _refusal(training={"loss": {field: bad}})
    assert lines and all(line.startswith(f"spec.training.loss.{field}: ") for line in lines), lines
    loss = spec.parse_job(_job(training={"loss": {field: good}})).spec.training.loss
    assert (loss.stale_weight if field == "staleWeight" else loss.behaviour_kl) == good
