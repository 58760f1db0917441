"""Reading a job file (`plrl run`, `plrl render`, `plrl plan`, `plrl status`): bytes -> `PipelineRLJob`.

The same models the API server's validation is generated from (`plrl_api.spec`) validate it, and
the YAML is read the way kubectl reads it, so a file is refused here exactly when `kubectl apply`
would be refused, naming the same field:

- YAML values resolve as kubectl's YAML library (go-yaml v2, through sigs.k8s.io/yaml) resolves
  them, not as PyYAML's YAML 1.1 would: `1e-6` and `1e30` are numbers, `0o17` an integer,
  `y`/`n` booleans, `1:30` and `2024-01-01` strings; mapping keys become strings (`1: x` -> "1").
- Any input costs bounded time and memory, and every refusal is one `JobFileError` line naming
  the file: at most `MAX_BYTES` are read, text must be UTF-8 (the offending byte's offset is
  named), and the document may not nest deeper than `MAX_DEPTH` or expand, aliases included, to
  more than `MAX_NODES` nodes (a "billion laughs" alias bomb is refused while it is still small).

`Dumper` writes YAML the same resolution reads back unchanged (the run directory's `job.yaml`,
`plrl render`'s output). Neighbours: `plrl_api.spec` (the models), the CLI verbs (the callers).
"""

from __future__ import annotations

import copy
import pathlib
import re
from collections.abc import Sequence
from typing import Any, ClassVar

import yaml
import yaml.composer
import yaml.constructor
import yaml.emitter
import yaml.nodes
import yaml.parser
import yaml.reader
import yaml.representer
import yaml.resolver
import yaml.scanner
import yaml.serializer

from plrl_api import spec as spec_mod

# Kubernetes stores an object in etcd only up to ~1.5 MiB (etcd's default request limit), so no
# larger job could ever be applied; a real job file is a few KiB. 1 MiB leaves room for comments.
MAX_BYTES = 1 << 20
# A job is a few hundred nodes, nested at most 8 deep; these bounds stop pathological files long
# before they cost memory (20k nodes are a few MB of Python objects) or recursion depth.
MAX_NODES = 20_000
MAX_DEPTH = 64

try:  # libyaml's parser produces the events in C (5x faster); composing stays in Python, bounded
    from yaml.cyaml import CParser as _Parser  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - PyYAML built without libyaml

    class _Parser(yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser):  # type: ignore[no-redef]
        def __init__(self, text: str) -> None:
            yaml.reader.Reader.__init__(self, text)
            yaml.scanner.Scanner.__init__(self)
            yaml.parser.Parser.__init__(self)


class _Resolver(yaml.resolver.BaseResolver):
    """Plain-scalar types as go-yaml v2 resolves them (kubectl's YAML -> JSON conversion)."""


def _implicit(tag: str, pattern: str, first: list[str]) -> None:
    _Resolver.add_implicit_resolver(f"tag:yaml.org,2002:{tag}", re.compile(pattern), first)


_implicit(
    "bool",
    r"^(?:y|Y|yes|Yes|YES|n|N|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF)$",
    list("yYnNtTfFoO"),
)
_implicit("null", r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""])
_INT = re.compile(r"^[-+]?(?:0b[01_]+|0o[0-7_]+|0x[0-9a-fA-F_]+|[0-9][0-9_]*)$")
_implicit("int", _INT.pattern, list("-+0123456789"))
_FLOAT = (
    r"^(?:[-+]?(?:\.[0-9]+|[0-9][0-9_]*(?:\.[0-9_]*)?)(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
)
_implicit("float", _FLOAT, list("-+0123456789."))
_implicit("merge", r"^(?:<<)$", ["<"])


class _Constructor(yaml.constructor.SafeConstructor):
    """Safe construction with kubectl's scalar types and string keys."""

    bool_values: ClassVar[dict[str, bool]] = {
        **yaml.constructor.SafeConstructor.bool_values,
        "y": True,
        "n": False,
    }

    def construct_go_int(self, node: yaml.nodes.ScalarNode) -> int | float:
        text = str(self.construct_scalar(node)).replace("_", "")
        sign, digits = (-1, text[1:]) if text.startswith("-") else (1, text.removeprefix("+"))
        try:
            if len(digits) > 1 and digits[0] == "0" and digits[1].isdigit():
                return sign * int(digits, 8)  # `017`: octal, as Go's strconv with base 0
            return sign * int(digits, 0)
        except ValueError:
            return float(text)  # `09`: not octal; go-yaml then reads it as a float

    def construct_go_float(self, node: yaml.nodes.ScalarNode) -> float:
        text = str(self.construct_scalar(node)).replace("_", "").lower()
        return float(text.replace(".inf", "inf").replace(".nan", "nan"))

    def construct_mapping(self, node: yaml.nodes.Node, deep: bool = False) -> dict[Any, Any]:
        if not isinstance(node, yaml.nodes.MappingNode):
            raise yaml.constructor.ConstructorError(
                None, None, f"expected a mapping, found a {type(node).__name__}", node.start_mark
            )
        self.flatten_mapping(node)
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (dict, list)):
                raise yaml.constructor.ConstructorError(
                    None, None, "a mapping key must be a scalar", key_node.start_mark
                )
            out[_key_text(key)] = self.construct_object(value_node, deep=deep)
        return out


_Constructor.add_constructor("tag:yaml.org,2002:int", _Constructor.construct_go_int)  # type: ignore[type-var]
_Constructor.add_constructor("tag:yaml.org,2002:float", _Constructor.construct_go_float)  # type: ignore[type-var]


def _key_text(key: Any) -> str:
    """A mapping key as JSON (and so the API server) sees it: always a string."""
    if isinstance(key, bool):
        return "true" if key else "false"
    if key is None:
        return "null"
    if isinstance(key, float) and key.is_integer():
        return str(int(key))
    return str(key)


class _Loader(_Parser, yaml.composer.Composer, _Constructor, _Resolver):
    """libyaml's parser, PyYAML's composer with a depth and node budget, kubectl's resolution."""

    def __init__(self, text: str) -> None:
        _Parser.__init__(self, text)
        yaml.composer.Composer.__init__(self)
        _Constructor.__init__(self)
        _Resolver.__init__(self)
        self.depth = 0
        self.nodes = 0

    # CParser brings its own C composer; use PyYAML's (which calls compose_node below) instead.
    get_single_node = yaml.composer.Composer.get_single_node
    compose_document = yaml.composer.Composer.compose_document
    check_node = yaml.composer.Composer.check_node
    get_node = yaml.composer.Composer.get_node

    def compose_node(self, parent: yaml.nodes.Node | None, index: Any) -> yaml.nodes.Node:
        self.depth += 1
        self.nodes += 1
        if self.depth > MAX_DEPTH:
            raise _TooBig(f"nests deeper than {MAX_DEPTH} levels")
        if self.nodes > MAX_NODES:
            raise _TooBig(f"has more than {MAX_NODES} YAML nodes")
        try:
            node = yaml.composer.Composer.compose_node(self, parent, index)
            assert node is not None  # None only at the end of a stream, never below a parent
            return node
        finally:
            self.depth -= 1


class _TooBig(Exception):
    pass


class Dumper(yaml.emitter.Emitter, yaml.serializer.Serializer, yaml.representer.SafeRepresenter, _Resolver):
    """YAML that kubectl and `load_job` read back as written: a string that kubectl would take
    for a number or a boolean (`1e3`, `y`, `0o17`) is quoted; no aliases."""

    def __init__(self, stream: Any, **kwargs: Any) -> None:
        yaml.emitter.Emitter.__init__(
            self,
            stream,
            canonical=kwargs.get("canonical"),
            indent=kwargs.get("indent"),
            width=kwargs.get("width"),
            allow_unicode=kwargs.get("allow_unicode"),
            line_break=kwargs.get("line_break"),
        )
        yaml.serializer.Serializer.__init__(
            self,
            encoding=kwargs.get("encoding"),
            explicit_start=kwargs.get("explicit_start"),
            explicit_end=kwargs.get("explicit_end"),
            version=kwargs.get("version"),
            tags=kwargs.get("tags"),
        )
        yaml.representer.SafeRepresenter.__init__(
            self,
            default_style=kwargs.get("default_style"),
            default_flow_style=kwargs.get("default_flow_style", False),
            sort_keys=kwargs.get("sort_keys", True),
        )
        _Resolver.__init__(self)

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump_yaml(doc: Any) -> str:
    """`doc` as YAML that reads back (here and in kubectl) to the same values."""
    return yaml.dump(doc, Dumper=Dumper, sort_keys=False)


def _check_expansion(root: yaml.nodes.Node) -> None:
    """Refuse a document whose aliases expand it past MAX_NODES nodes or MAX_DEPTH levels.

    An alias is the same node object as its anchor, so the expanded size is a sum over a DAG,
    computed once per distinct node (a bomb of 10^9 nodes costs a few dozen steps here).
    """
    size: dict[int, tuple[int, int]] = {}  # id(node) -> (expanded nodes, expanded depth)
    active: set[int] = set()

    def walk(node: yaml.nodes.Node, depth: int) -> tuple[int, int]:
        key = id(node)
        if key in size:
            return size[key]
        if key in active:
            raise _TooBig("contains an alias to one of its own ancestors (a recursive structure)")
        if depth > MAX_DEPTH:
            raise _TooBig(f"nests deeper than {MAX_DEPTH} levels once its aliases are expanded")
        children: list[yaml.nodes.Node] = []
        if isinstance(node, yaml.nodes.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.nodes.MappingNode):
            children = [n for pair in node.value for n in pair]
        active.add(key)
        total, deepest = 1, 0
        for child in children:
            n, d = walk(child, depth + 1)
            total, deepest = total + n, max(deepest, d)
            if total > MAX_NODES:
                raise _TooBig(f"expands, through its aliases, to more than {MAX_NODES} YAML nodes")
        active.discard(key)
        size[key] = (total, deepest + 1)
        return size[key]

    walk(root, 1)


def parse_yaml(data: bytes, source: str) -> Any:
    """The one YAML document in `data` as Python values, or JobFileError (one line, naming `source`)."""
    if len(data) > MAX_BYTES:
        raise spec_mod.JobFileError(
            f"{source}: larger than {MAX_BYTES // 1024} KiB; no job that large could be stored by "
            "the API server (a job file is a few KiB)"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise spec_mod.JobFileError(
            f"{source}: not UTF-8: byte 0x{data[err.start]:02x} at offset {err.start} "
            f"(line {line}, column {column}); save the file as UTF-8"
        ) from None
    loader = _Loader(text.removeprefix("\ufeff"))
    try:
        documents = []
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            _check_expansion(node)
            documents.append(loader.construct_document(node))
    except _TooBig as err:
        raise spec_mod.JobFileError(f"{source}: refused: the YAML {err}") from None
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = err.problem or err.context or "malformed"
        raise spec_mod.JobFileError(f"{source}: not valid YAML: {problem}{where}") from None
    except (yaml.YAMLError, RecursionError, ValueError) as err:
        raise spec_mod.JobFileError(f"{source}: not valid YAML: {str(err).splitlines()[0]}") from None
    finally:
        loader.dispose()
    documents = [d for d in documents if d is not None]
    if len(documents) != 1:
        raise spec_mod.JobFileError(f"{source}: expected exactly one YAML document, found {len(documents)}")
    return documents[0]


def read_bytes(path: pathlib.Path) -> bytes:
    """At most MAX_BYTES + 1 bytes of `path` (enough to tell that it is too large)."""
    try:
        with path.open("rb") as f:
            return f.read(MAX_BYTES + 1)
    except OSError as err:
        raise spec_mod.JobFileError(f"{path}: cannot read: {err.strerror or err}") from None


def apply_overrides(doc: Any, overrides: Sequence[str]) -> Any:
    """`doc` with each `path.to.field=value` set (camelCase keys as in the file, e.g.
    `spec.training.batchSize=64`); values are read as YAML scalars, as they would be in the file.

    Intermediate mappings are created as needed; the result is validated like the file itself.
    """
    if not overrides:
        return doc
    out = copy.deepcopy(doc)
    for item in overrides:
        where = f"--set {item}"
        key, sep, raw = item.partition("=")
        parts = key.strip().split(".")
        if not sep or not all(parts):
            raise spec_mod.JobFileError(
                f"{where}: expected path.to.field=value, e.g. spec.training.totalSteps=50"
            )
        if not isinstance(out, dict):
            raise spec_mod.JobFileError(f"{where}: the job file is not a mapping")
        node: Any = out
        for i, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise spec_mod.JobFileError(f"{where}: {'.'.join(parts[: i + 1])} is not a mapping")
            node = child
        node[parts[-1]] = parse_yaml(raw.encode(), where) if raw.strip() else ""
    return out


def load_job(path: str | pathlib.Path, overrides: Sequence[str] = ()) -> spec_mod.PipelineRLJob:
    """Read and validate a job file (the same YAML a user would `kubectl apply`), with `overrides`
    (`--set path=value`) applied before validation."""
    p = pathlib.Path(path)
    doc = apply_overrides(parse_yaml(read_bytes(p), str(p)), overrides)
    try:
        return spec_mod.parse_job(doc)
    except spec_mod.JobFileError as err:
        raise spec_mod.JobFileError(f"{p}: invalid PipelineRLJob:\n{err}") from None
