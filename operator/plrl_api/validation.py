"""How one rule is enforced twice: by pydantic (`plrl run`, the webhook) and by the API server (CRD).

`plrl_api.spec` declares the job's rules next to its models; this module holds what those
declarations are made of, so that a rule is written once and both enforcements read it:

- `Rule`: a cross-field rule with its CEL expression, its Python check, the field it names and
  one message template. `Rule.crd()` is its `x-kubernetes-validations` entry (the message as a
  CEL `messageExpression`, so the API server prints the very text `plrl run` prints);
  `Rule.problem(model)` is the pydantic side. `refuse` raises every failed rule of a model as one
  pydantic error of type `plrl_rule`, and `format_error` prints each as `<field path>: <message>`.
- Value types that mean the same on both sides: `Int` (a whole float is an integer: kubectl sends
  `64.0` as 64, and the API server accepts it) and `Quantity` (a non-negative Kubernetes quantity:
  the same grammar as a regular expression in pydantic and as the CRD's `pattern`).
- `prune_nulls`: the API server drops `null` fields before it validates (none of ours is
  nullable), so `generation:` with every child commented out is a defaulted group in both paths.

Only pydantic and the standard library are imported (the `plrl_api` contract).
Neighbours: `plrl_api.spec` (the rules), `plrl_operator.crd` (writes `crd()` into the CRD),
`plrl_operator.admission` (the webhook, which prints `format_error`'s lines).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from typing import Annotated, Any, NoReturn

import pydantic
import pydantic_core
from pydantic.config import JsonDict

RULE_ERROR = "plrl_rule"
_PLACEHOLDER = re.compile(r"\{([A-Za-z][A-Za-z0-9.]*)\}")

# A Kubernetes resource quantity without a sign or with `+` (k8s.io/apimachinery resource.Quantity:
# <number><suffix>, suffix a binary SI (Ki..Ei), decimal SI (n u m k M G T P E) or an exponent).
QUANTITY_PATTERN = (
    r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
QUANTITY_MAX_LENGTH = 64


# --------------------------------------------------------------------------- values


def whole_number(value: Any) -> Any:
    """`64.0` -> 64: YAML floats that are whole numbers reach the API server as integers."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


Int = Annotated[int, pydantic.BeforeValidator(whole_number)]
"""An integer field: int, or a float with no fraction; never a string or a bool (strict mode)."""
OptInt = Annotated[int | None, pydantic.BeforeValidator(whole_number)]
"""An optional `Int` (written so, not `Int | None`, for pydantic to put its bounds in the schema)."""


def _int_quantity(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)  # `cpu: 4` is a quantity, as in a pod spec; "-4" then fails the pattern
    return value


def _quantity(value: str) -> str:
    if not re.match(QUANTITY_PATTERN, value):
        raise ValueError(f"{value!r} is not a non-negative Kubernetes quantity (such as 4, 500m or 32Gi)")
    return value


Quantity = Annotated[
    str,
    pydantic.BeforeValidator(_int_quantity),
    pydantic.Field(max_length=QUANTITY_MAX_LENGTH),
    pydantic.AfterValidator(_quantity),
    pydantic.WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "pattern": QUANTITY_PATTERN,
            "maxLength": QUANTITY_MAX_LENGTH,
            "minimum": 0,
        }
    ),
]
"""A non-negative Kubernetes quantity (`4`, `500m`, `32Gi`), written as a string or an integer.

In the CRD: int-or-string; `pattern` checks the strings and `minimum` the integers."""


def prune_nulls(doc: Any) -> Any:
    """`doc` without `null`-valued keys, at every depth (what the API server does before validating)."""
    if isinstance(doc, dict):
        return {k: prune_nulls(v) for k, v in doc.items() if v is not None}
    if isinstance(doc, list):
        return [prune_nulls(v) for v in doc]
    return doc


# --------------------------------------------------------------------------- rules


@dataclasses.dataclass(frozen=True)
class Rule:
    """One cross-field rule of the model it is declared on (`self` in both `cel` and `check`).

    `field`: the camelCase path below that model that the error names (None: the model itself).
    `message`: the text of the error; `{a.b}` placeholders are the values at those camelCase paths
    (only paths that are set whenever the rule fails). Written with values, it reads like
    "training.batchSize=100 must be a multiple of generation.samplesPerPrompt=8".
    """

    field: str | None
    cel: str
    check: Callable[[Any], bool]
    message: str

    def crd(self) -> JsonDict:
        """The `x-kubernetes-validations` entry: same rule, same message, same field."""
        out: JsonDict = {"rule": self.cel}
        paths = _PLACEHOLDER.findall(self.message)
        if paths:
            text = _PLACEHOLDER.sub("%s", self.message.replace("%", "%%"))
            args = ", ".join(f"self.{p}" for p in paths)
            out["messageExpression"] = f"{json.dumps(text)}.format([{args}])"
        else:
            out["message"] = self.message
        if self.field is not None:
            out["fieldPath"] = f".{self.field}"
        return out

    def problem(self, model: pydantic.BaseModel) -> tuple[str | None, str] | None:
        """(field, message) if `model` breaks the rule, else None."""
        if self.check(model):
            return None
        message = _PLACEHOLDER.sub(lambda m: _text(value_at(model, m.group(1))), self.message)
        return self.field, message


def value_at(model: pydantic.BaseModel, path: str) -> Any:
    """The value at a camelCase path (`training.tokensPerMicroBatch`) below `model`."""
    value: Any = model
    for part in path.split("."):
        fields = type(value).model_fields
        name = next(n for n, f in fields.items() if (f.alias or n) == part)
        value = getattr(value, name)
    return value


def _text(value: Any) -> str:
    """A value as CEL's `%s` prints it (`1.0` as `1`, booleans lowercase)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if hasattr(value, "value"):  # an enum member
        return str(value.value)
    return str(value)


def check_rules(model: pydantic.BaseModel, rules: tuple[Rule, ...]) -> None:
    """Raise every rule `model` breaks, as one pydantic error (see `format_error`)."""
    problems = [p for p in (r.problem(model) for r in rules) if p is not None]
    if problems:
        refuse(problems)


def refuse(problems: list[tuple[str | None, str]]) -> NoReturn:
    raise pydantic_core.PydanticCustomError(
        RULE_ERROR,
        "{summary}",
        {"summary": "; ".join(m for _, m in problems), "problems": problems},
    )


def format_error(err: pydantic.ValidationError) -> list[str]:
    """One line per problem, each starting with the field's path as the user wrote it."""
    lines = []
    for e in err.errors():
        loc = [str(p) for p in e["loc"] if p not in ("function-after",)]
        if e["type"] == RULE_ERROR:
            for field, message in e.get("ctx", {})["problems"]:
                lines.append(f"{'.'.join([*loc, *([field] if field else [])]) or '<root>'}: {message}")
            continue
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field (check the spelling; `plrl crd` prints every field)"
        elif e["type"] == "missing":
            msg = "required field is missing"
        lines.append(f"{'.'.join(loc) or '<root>'}: {msg}")
    return lines
