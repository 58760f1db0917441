"""The generated CRD: committed copies match the models, and the schema says what spec.py says.

Cases: no drift between `plrl crd` and `crds/` and the chart's `crds/` (run `make crds`); names,
short names, categories, status subresource and printer columns; every spec field of the pydantic
model is in the schema with a description; the schema is structural (no refs, unions, titles);
bounds, enums and defaults carry over; `spec` and `spec.model` are required; quantities are
int-or-string with the quantity pattern; the CEL rules are exactly the `RULES` written in spec.py
(each naming a field, messages as in pydantic); defaulting a spec that names only its model the
way the API server does gives pydantic's defaults; a status the operator writes validates against
the status schema.
"""

from __future__ import annotations

import pathlib
from typing import Any

import jsonschema
import pydantic
import pytest
import yaml

from plrl_api import records, spec, validation
from plrl_operator import crd, status

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _root() -> dict[str, Any]:
    schema: dict[str, Any] = crd.build()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def _walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        out.append((path, node))
        for name, sub in node.get("properties", {}).items():
            out += _walk(sub, f"{path}.{name}")
        if "items" in node:
            out += _walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            out += _walk(node["additionalProperties"], f"{path}{{}}")
    return out


@pytest.mark.parametrize("committed", ["crds", "helm/pipelinerl-operator/crds"])
def test_committed_crd_matches_the_models(committed: str) -> None:
    path = ROOT / committed / crd.FILE_NAME
    assert path.read_text() == crd.render_yaml(), f"{path} drifted from spec.py/status.py: run `make crds`"


def test_plrl_crd_prints_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert crd.main([]) == 0
    doc = yaml.safe_load(capsys.readouterr().out)
    assert doc == crd.build()


def test_names_and_subresources() -> None:
    c = crd.build()
    assert c["metadata"]["name"] == "pipelinerljobs.pipelinerl.io"
    names = c["spec"]["names"]
    assert names["kind"] == "PipelineRLJob"
    assert names["shortNames"] == ["plrljob", "plrljobs"]
    assert "pipelinerl" in names["categories"]
    version = c["spec"]["versions"][0]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}


def test_printer_columns() -> None:
    cols = crd.build()["spec"]["versions"][0]["additionalPrinterColumns"]
    default = [c["name"].upper() for c in cols if not c.get("priority")]
    assert default == ["PHASE", "GEN", "TRAIN", "STEP", "LAG", "REWARD", "TOK/S", "RESTARTS", "AGE"]
    wide = [c["name"].upper() for c in cols if c.get("priority") == 1]
    assert wide == ["READY", "WEIGHTS", "GEN-TOK/S", "SCHEDULING"]
    status_props = _root()["properties"]["status"]
    for c in cols:
        if c["jsonPath"].startswith(".status."):
            first = c["jsonPath"].split(".")[2].split("[")[0]
            assert first in status_props["properties"], c


def _model_fields(model: type[pydantic.BaseModel], prefix: str) -> list[str]:
    out = []
    for name, field in model.model_fields.items():
        alias = field.alias or name
        out.append(f"{prefix}.{alias}")
        ann = field.annotation
        for arg in (ann, *getattr(ann, "__args__", ())):
            if isinstance(arg, type) and issubclass(arg, pydantic.BaseModel):
                out += _model_fields(arg, f"{prefix}.{alias}" + ("[]" if "list" in str(ann) else ""))
    return out


def test_every_spec_field_is_in_the_schema_with_a_description() -> None:
    schema_paths = dict(_walk(_root()))
    for path in _model_fields(spec.JobSpec, ".spec"):
        assert path in schema_paths, f"{path} missing from the CRD"
        assert schema_paths[path].get("description"), f"{path} has no description (kubectl explain)"


def test_schema_is_structural() -> None:
    for path, node in _walk(_root()):
        assert not {"$ref", "anyOf", "oneOf", "allOf", "title", "$defs"} & node.keys(), path
        assert (
            "type" in node
            or node.get("x-kubernetes-preserve-unknown-fields")
            or node.get("x-kubernetes-int-or-string")
        ), path
        for key in ("exclusiveMinimum", "exclusiveMaximum"):
            assert isinstance(node.get(key, True), bool), f"{path}: {key} must be boolean in OpenAPI v3.0"
        if node.get("type") == "object" and "properties" in node:
            assert "additionalProperties" not in node, path


def test_bounds_enums_and_defaults_carry_over() -> None:
    p = dict(_walk(_root()))
    assert p[".spec.resources.totalGPUs"] == {
        "description": "N: accelerators in the job, generators and trainers together.",
        "type": "integer",
        "default": 8,
        "maximum": 65536,
        "minimum": 2,
    }
    assert p[".spec.generation.engine"]["enum"] == ["vllm", "torch"]
    assert p[".spec.training.zeroStage"]["enum"] == [1, 2]
    assert p[".spec.pipeline.mode"]["enum"] == ["pipeline", "conventional", "hybrid"]
    temp = p[".spec.generation.temperature"]
    assert (temp["minimum"], temp["exclusiveMinimum"], temp["maximum"]) == (0.0, True, 10.0)
    assert p[".spec.resources.affinity"]["x-kubernetes-preserve-unknown-fields"] is True
    assert p[".spec.resources.nodeSelector"]["additionalProperties"] == {"type": "string"}
    assert p[".metadata.name"]["maxLength"] == 40
    # Optional groups have no default (absent stays absent); always-present groups are fully defaulted
    # (the API server checks defaults against the group's CEL rules before nested defaults apply).
    assert "default" not in p[".spec.model.volume"]
    autoscale = spec.AutoscaleSpec().model_dump(mode="json", by_alias=True, exclude_none=True)
    assert p[".spec.pipeline.autoscale"]["default"] == autoscale
    assert p[".spec.heartbeat"]["default"] == {"intervalSeconds": 5.0, "timeoutSeconds": 30.0}
    assert "default" not in p[".spec.pipeline.generators"]
    # A job names its model: no default spec, no default model (a cluster job cannot use builtin:tiny's).
    assert _root()["required"] == ["spec"] and "default" not in p[".spec"]
    assert p[".spec"]["required"] == ["model"] and p[".spec.model"]["required"] == ["name"]
    assert "default" not in p[".spec.model"] and "default" not in p[".spec.model.name"]
    for seed in (".spec.model.seed", ".spec.task.seed", ".spec.training.seed"):
        assert (p[seed]["minimum"], p[seed]["maximum"]) == (0, 2**32 - 1), seed
    assert p[".spec.training.gradientClipping"]["maximum"] == 1e6
    assert p[".spec.pipeline.generators"]["maximum"] == 65536  # Optional ints keep their bounds
    for q in (".spec.resources.cpu", ".spec.resources.memory"):
        assert p[q]["x-kubernetes-int-or-string"] is True and "type" not in p[q]
        assert (p[q]["pattern"], p[q]["minimum"]) == (validation.QUANTITY_PATTERN, 0)
    assert ("jsonl", *(f"builtin:{t}" for t in spec.BUILTIN_TASKS)) == spec.TASK_NAMES
    assert "builtin:reverse" in p[".spec.task.name"]["description"]
    for path, node in p.items():  # every number is bounded (and so is every string the CEL reads)
        if path.startswith(".spec") and node.get("type") in ("integer", "number") and "enum" not in node:
            assert "minimum" in node and "maximum" in node, path


def test_cel_rules_are_the_ones_in_spec_py() -> None:
    p = dict(_walk(_root()))
    rules = {
        path: node["x-kubernetes-validations"]
        for path, node in p.items()
        if "x-kubernetes-validations" in node
    }
    models: dict[str, Any] = {
        ".spec": spec.JobSpec,
        ".spec.model": spec.ModelSpec,
        ".spec.task": spec.TaskSpec,
        ".spec.task.dataset": spec.DatasetSource,
        ".spec.pipeline": spec.PipelineSpec,
        ".spec.pipeline.autoscale": spec.AutoscaleSpec,
        ".spec.heartbeat": spec.HeartbeatSpec,
        ".spec.training": spec.TrainingSpec,
    }
    assert set(rules) == set(models)
    for path, model in models.items():
        assert rules[path] == [r.crd() for r in model.RULES], path
        for r in rules[path]:
            assert r["rule"] and (r.get("message") or r.get("messageExpression")), path
    # Every cross-field rule of the job names the field to fix, and that field exists.
    for r in rules[".spec"]:
        assert f".spec{r['fieldPath']}" in p, r


def test_a_rule_message_is_the_same_text_in_cel_and_in_pydantic() -> None:
    rule = validation.Rule(
        "training.batchSize",
        "true",
        lambda s: False,
        "training.batchSize={training.batchSize} must divide 100% of generation.samplesPerPrompt="
        "{generation.samplesPerPrompt}",
    )
    assert rule.crd()["messageExpression"] == (
        '"training.batchSize=%s must divide 100%% of generation.samplesPerPrompt=%s"'
        ".format([self.training.batchSize, self.generation.samplesPerPrompt])"
    )
    job = spec.JobSpec.model_validate({"model": {"name": "m"}, "training": {"batchSize": 64}})
    assert rule.problem(job) == (
        "training.batchSize",
        "training.batchSize=64 must divide 100% of generation.samplesPerPrompt=8",
    )


def _default(schema: dict[str, Any], value: Any) -> Any:
    """Apply OpenAPI defaults the way the API server does: to absent fields of present objects."""
    if not isinstance(value, dict) or "properties" not in schema:
        return value
    out = dict(value)
    for name, sub in schema["properties"].items():
        if name not in out and "default" in sub:
            out[name] = sub["default"]
        if name in out:
            out[name] = _default(sub, out[name])
    return out


def test_server_side_defaults_equal_pydantic_defaults() -> None:
    written = {"model": {"name": "/models/m"}}
    defaulted = _default(_root()["properties"]["spec"], written)
    # Every scalar default is filled in by the server (empty maps/lists stay absent, same meaning).
    expected = spec.JobSpec.model_validate(written).model_dump(mode="json", by_alias=True, exclude_none=True)
    del expected["resources"]["nodeSelector"], expected["resources"]["tolerations"]
    del expected["network"]["metricsFrom"]
    assert defaulted == expected
    assert spec.JobSpec.model_validate(defaulted) == spec.JobSpec.model_validate(written)


def test_status_written_by_the_operator_validates_against_the_schema() -> None:
    example = status.JobStatus(
        phase="Running",
        generators=6,
        trainers=10,
        ready="11/11",
        step=3,
        lag=records.Lag(mean=1.5, max=3),
        reward=0.25,
        throughput=records.Throughput(
            generated_tokens_per_second=100.0, trained_tokens_per_second=90.0, ratio=0.9
        ),
        conditions=[status.Condition(type="Ready", status="True", reason="AllPodsReady")],
        observed_generation=2,
    )
    jsonschema.Draft4Validator(_root()["properties"]["status"]).validate(status.dump(example))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft4Validator(_root()["properties"]["status"]).validate({"phase": "Sleeping"})
