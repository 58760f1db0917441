"""The invalid-job corpus: job files that both `kubectl apply` and `plrl run` must refuse alike.

Each case is one fault on top of `examples/local-tiny.yaml` (the demo job, valid in both paths),
written to a file; most are edits of the parsed job, some are edits of its bytes (what YAML
cannot say once parsed: a Latin-1 byte, `1e30` as written, an alias bomb, 50 MB). The `ISSUE`
cases are the bad files of issue 7 that used to crash, hang, start processes or eat memory.

A case names what both paths must say:
- `field`: a spec-level fault. The API server's error and `plrl`'s lines must name exactly the
  same set of field paths (`spec.training.tokensPerMicroBatch`), and for a `rule` case (a
  `validation.Rule`) the API server's message is `plrl`'s, word for word.
- `api` / `plrl`: a file-level fault, refused before any field exists. kubectl refuses it
  client-side, or the API server by size, or by the field the mangled text lands in (`api`);
  `plrl` names the file and where in it (`plrl`). Bounded time and memory are checked for these.

Neighbours: test_validation.py (runs the corpus through both paths), support.py.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Callable
from typing import Any

import yaml

from plrl_operator import jobfile

ROOT = pathlib.Path(__file__).resolve().parents[3]
BASE_FILE = ROOT / "examples" / "local-tiny.yaml"
BASE_NAME = "local-tiny"

Edit = Callable[[dict[str, Any]], None]


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    field: str | None = None  # the field both paths name (spec-level faults)
    edit: Edit | None = None  # one fault in the parsed base job ...
    raw: Callable[[bytes], bytes] | None = None  # ... or in the base file's bytes
    api_raw: Callable[[bytes], bytes] | None = None  # the bytes kubectl gets, if not the same
    api: str = ""  # file-level: what the API path says instead of a field
    plrl: str = ""  # file-level: what plrl says (it names the file and the place)
    rule: bool = False  # a validation.Rule: the same message in both paths
    # Fields only the API server names: it still runs the spec's CEL rules on a value that failed
    # its bound, where pydantic stops at the bound (the fault is the same one).
    api_also: tuple[str, ...] = ()
    issue: bool = False  # one of the issue's examples (also run as `plrl` processes)

    def write(self, out_dir: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
        """The case's file for plrl and the one for kubectl (the same file unless `api_raw`)."""
        base = BASE_FILE.read_bytes()
        if self.raw is not None:
            data = self.raw(base)
        else:
            doc = jobfile.parse_yaml(base, str(BASE_FILE))
            assert self.edit is not None, self.id
            self.edit(doc)
            data = yaml.safe_dump(doc, sort_keys=False).encode()
        path = out_dir / f"{self.id}.yaml"
        path.write_bytes(data)
        if self.api_raw is None:
            return path, path
        api_path = out_dir / f"{self.id}.api.yaml"
        api_path.write_bytes(self.api_raw(base))
        return path, api_path


def put(path: str, value: Any) -> Edit:
    """Set `path` (dotted, from the document root) to `value`."""

    def edit(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = doc
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value

    return edit


def drop(path: str) -> Edit:
    def edit(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = doc
        for key in parents:
            node = node[key]
        del node[last]

    return edit


def both(*edits: Edit) -> Edit:
    def edit(doc: dict[str, Any]) -> None:
        for e in edits:
            e(doc)

    return edit


def replace(old: str, new: str) -> Callable[[bytes], bytes]:
    def edit(data: bytes) -> bytes:
        assert data.count(old.encode()) == 1, old
        return data.replace(old.encode(), new.encode())

    return edit


def _alias_bomb(data: bytes) -> bytes:
    """A "billion laughs": 10 levels of 10 aliases, 10^10 strings once expanded, 1 KiB written."""
    lines = ["  annotations:", "    a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"    a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 10)]
    return data.replace(b"  name: local-tiny\n", b"  name: local-tiny\n" + "\n".join(lines).encode() + b"\n")


def _blob(size: int) -> Callable[[bytes], bytes]:
    """The job with an annotation of `size` bytes: a real object that large, not a long comment."""

    def edit(data: bytes) -> bytes:
        blob = b"  annotations:\n    blob: " + b"x" * size + b"\n"
        return data.replace(b"  name: local-tiny\n", b"  name: local-tiny\n" + blob)

    return edit


def _deep(data: bytes) -> bytes:
    nested = b"".join(b"        " + b"  " * i + b"- \n" for i in range(100))
    return data.replace(b"    memory: 2Gi\n", b"    memory: 2Gi\n    nodeSelector:\n      a:\n" + nested)


ISSUE: list[Case] = [
    Case("no-model", "spec.model", drop("spec.model"), issue=True),
    Case(
        "task-name-without-prefix", "spec.task.name", put("spec.task.name", "reverse"), rule=True, issue=True
    ),
    Case(
        "model-seed-1e30",
        "spec.model.seed",
        raw=replace("    warmStartSteps: 150\n    seed: 0\n", "    warmStartSteps: 150\n    seed: 1e30\n"),
        issue=True,
    ),
    Case(
        "training-seed-2-to-the-64",
        "spec.training.seed",
        raw=replace("      keep: 2\n    seed: 0\n", "      keep: 2\n    seed: 18446744073709551616\n"),
        issue=True,
    ),
    Case(
        "micro-batch-16",
        "spec.training.tokensPerMicroBatch",
        put("spec.training.tokensPerMicroBatch", 16),
        rule=True,
        issue=True,
    ),
    Case(
        "slots-below-samples-per-prompt",
        "spec.generation.concurrentSequences",
        put("spec.generation.concurrentSequences", 4),
        rule=True,
        issue=True,
    ),
    Case(
        "model-len-below-prompt-plus-new-tokens",
        "spec.generation.maxModelLen",
        put("spec.generation.maxModelLen", 16),
        rule=True,
        issue=True,
    ),
    Case("cpu-banana", "spec.resources.cpu", put("spec.resources.cpu", "banana"), issue=True),
    Case("memory-potatoes", "spec.resources.memory", put("spec.resources.memory", "-5 potatoes"), issue=True),
    Case(
        "gradient-clipping-inf",
        "spec.training.gradientClipping",
        raw=replace("    gradientClipping: 1.0\n", "    gradientClipping: .inf\n"),
        api="json: unsupported value: +Inf",  # JSON cannot carry it: kubectl refuses client-side
        issue=True,
    ),
    Case(
        "not-utf-8",
        raw=lambda data: data.replace(
            b"  name: local-tiny\n", b"  name: local-tiny-caf\xe9\n"
        ),  # Latin-1 "é"
        api="metadata.name",  # kubectl reads the byte as U+FFFD; the name is then no DNS label
        plrl="not UTF-8: byte 0xe9 at offset",
        issue=True,
    ),
    Case(
        "alias-bomb",
        raw=_alias_bomb,
        api="yaml: document contains excessive aliasing",
        plrl="refused: the YAML expands, through its aliases, to more than 20000 YAML nodes",
        issue=True,
    ),
    Case(
        "50-mb",
        raw=_blob(50 << 20),
        # Any request over 3 MiB is refused alike; kubectl needs 9 s and 740 MB to convert 50 MB
        # of YAML before the server refuses it, so it is sent 4 MiB.
        api_raw=_blob(4 << 20),
        api="Request entity too large: limit is 3145728",
        plrl="larger than 1024 KiB",
        issue=True,
    ),
]

MORE: list[Case] = [
    Case("model-without-name", "spec.model.name", put("spec.model", {"dtype": "float32"})),
    Case("builtin-model-unknown", "spec.model.name", put("spec.model.name", "builtin:huge"), rule=True),
    Case(
        "warm-start-needs-builtin-model",
        "spec.model.warmStartSteps",
        put("spec.model.name", "/models/tiny"),
        rule=True,
    ),
    Case("reward-unknown", "spec.task.reward", put("spec.task.reward", "builtin:digits"), rule=True),
    Case("reward-not-ascii", "spec.task.reward", put("spec.task.reward", "modulé:reward")),
    Case("jsonl-without-dataset", "spec.task.dataset", put("spec.task.name", "jsonl"), rule=True),
    Case(
        "dataset-two-sources",
        "spec.task.dataset",
        both(
            put("spec.task.name", "jsonl"),
            put("spec.task.dataset", {"path": "p.jsonl", "configMap": {"name": "p", "key": "k"}}),
        ),
        rule=True,
    ),
    Case("batch-size-string", "spec.training.batchSize", put("spec.training.batchSize", "128")),
    Case("batch-size-groups", "spec.training.batchSize", put("spec.training.batchSize", 100), rule=True),
    Case("generators-all", "spec.pipeline.generators", put("spec.pipeline.generators", 2), rule=True),
    Case(
        "one-gpu",
        "spec.resources.totalGPUs",
        put("spec.resources.totalGPUs", 1),
        api_also=("spec.pipeline.generators",),  # its rule `generators < totalGPUs`, on the 1
    ),
    Case("engine-unknown", "spec.generation.engine", put("spec.generation.engine", "sglang")),
    Case("zero-stage-3", "spec.training.zeroStage", put("spec.training.zeroStage", 3)),
    Case("temperature-0", "spec.generation.temperature", put("spec.generation.temperature", 0)),
    Case(
        "learning-rate-string",
        "spec.training.learningRate",
        raw=replace("    learningRate: 1.5e-4\n", '    learningRate: "1.5e-4"\n'),
    ),
    Case("suspend-string", "spec.suspend", put("spec.suspend", "yes")),
    Case(
        "heartbeat-order",
        "spec.heartbeat.timeoutSeconds",
        put("spec.heartbeat", {"intervalSeconds": 10, "timeoutSeconds": 5}),
        rule=True,
    ),
    Case(
        "heartbeat-startup-order",
        "spec.heartbeat.startupTimeoutSeconds",
        put("spec.heartbeat", {"timeoutSeconds": 30, "startupTimeoutSeconds": 10}),
        rule=True,
    ),
    Case(
        "autoscale-ratios",
        "spec.pipeline.autoscale.lowerRatio",
        put("spec.pipeline.autoscale", {"lowerRatio": 0.95, "upperRatio": 0.9}),
        rule=True,
    ),
    Case(
        "delay-compensation-deepspeed",
        "spec.training.delayCompensation",
        both(put("spec.training.backend", "deepspeed"), put("spec.training.delayCompensation", 0.5)),
        rule=True,
    ),
    Case("stale-weight-zero", "spec.training.loss.staleWeight", put("spec.training.loss.staleWeight", 0)),
    Case(
        "hybrid-without-switch",
        "spec.pipeline.hybridSwitchStep",
        put("spec.pipeline.mode", "hybrid"),
        rule=True,
    ),
    Case("unknown-field", "spec.training.batchSiz", put("spec.training.batchSiz", 128)),
    Case("name-too-long", "metadata.name", put("metadata.name", "x" * 41)),
    Case("name-not-dns", "metadata.name", put("metadata.name", "Local_Tiny")),
    Case(
        "gpu-resource-name",
        "spec.resources.gpuResourceName",
        put("spec.resources.gpuResourceName", "NVIDIA GPU"),
    ),
    Case(
        "toleration-operator",
        "spec.resources.tolerations[0].operator",
        put("spec.resources.tolerations", [{"key": "gpu", "operator": "Sometimes"}]),
    ),
    Case("top-p", "spec.generation.topP", put("spec.generation.topP", 1.5)),
    Case("cpu-negative", "spec.resources.cpu", put("spec.resources.cpu", -4)),
    Case("memory-float", "spec.resources.memory", put("spec.resources.memory", 0.5)),
    Case(
        "model-len-not-above-new-tokens",
        "spec.generation.maxModelLen",
        put("spec.generation.maxNewTokens", 40),
        rule=True,
    ),
    Case("spec-not-a-mapping", "spec", put("spec", [1])),
    Case(
        "too-deep",
        raw=_deep,
        api="spec.resources.nodeSelector.a",  # the server reads it, and finds no string there
        plrl="refused: the YAML nests deeper than 64 levels",
    ),
    Case(
        "tab-indent",
        raw=replace("    dtype: float32\n", "\tdtype: float32\n"),
        api="error converting YAML to JSON",
        plrl="not valid YAML: found character that cannot start any token (line",
    ),
]

CORPUS: list[Case] = ISSUE + MORE
