"""Utilisation curves U(h): the fraction of peak FLOP/s an accelerator reaches at decode batch h.

A curve is a small table of (h, U) points, linearly interpolated. Below the first point it runs
straight to U(0) = 0 (a batch of nothing does no useful work, and decoding is memory-bound there,
so U grows in proportion to h); above the last point it stays at the last value (U never
decreases, and extrapolating growth would be a guess). Curves come from JSON files: the built-in
ones under `plrl_api/curves/` (see the README there for how they were derived) or those
`plrl profile` (`plrl_workers.profiler`) measures on a device.

Neighbours: `plrl_operator.policy.planner` and `.simulator` evaluate curves; `plan_cli`/`simulate_cli`
load them from `--curve`.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import pathlib
import re
from typing import Any

import pydantic

CURVES_DIR = pathlib.Path(__file__).parent / "curves"
BUILTIN = ("h100",)
DEFAULT = "h100"


class CurveError(ValueError):
    """A curve that cannot be used; the message names the problem in one line."""


class CurveFile(pydantic.BaseModel):
    """The JSON form of a curve (what `plrl profile` writes and `--curve` reads)."""

    model_config = pydantic.ConfigDict(extra="allow")

    name: str = pydantic.Field(min_length=1, description="Short name shown in plans.")
    points: list[tuple[float, float]] = pydantic.Field(
        min_length=1, description="[h, U] pairs: decode batch size and fraction of peak FLOP/s."
    )
    tau: float | None = pydantic.Field(
        default=None,
        gt=0,
        description="Training flashes per token on this device, if known (else the planner's default).",
    )
    description: str = ""


@dataclasses.dataclass(frozen=True)
class Curve:
    """A validated, interpolated U(h)."""

    name: str
    hs: tuple[float, ...]
    us: tuple[float, ...]
    tau: float | None = None
    description: str = ""
    extra: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        _validate(self.hs, self.us)

    @property
    def h_max(self) -> float:
        return self.hs[-1]

    def u(self, h: float) -> float:
        """U(h), linear between points, proportional to h below the first, flat above the last."""
        if h <= 0:
            raise CurveError(f"curve {self.name}: U(h) needs h > 0, got h={h}")
        hs, us = self.hs, self.us
        if h <= hs[0]:
            return us[0] * h / hs[0]
        if h >= hs[-1]:
            return us[-1]
        k = bisect.bisect_right(hs, h)
        h0, h1, u0, u1 = hs[k - 1], hs[k], us[k - 1], us[k]
        return u0 + (u1 - u0) * (h - h0) / (h1 - h0)

    def to_json(self) -> str:
        doc: dict[str, Any] = {"name": self.name, "description": self.description}
        if self.tau is not None:
            doc["tau"] = self.tau
        doc.update(self.extra)
        doc["points"] = [[_num(h), round(u, 6)] for h, u in zip(self.hs, self.us, strict=True)]
        # One [h, U] pair (or short list of numbers) per line keeps the file readable and diffable.
        return re.sub(r"\[\s+([^\[\]{}\"]*?)\s+\]", _inline, json.dumps(doc, indent=2)) + "\n"


def _inline(m: re.Match[str]) -> str:
    return "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]"


def _num(h: float) -> float | int:
    return int(h) if float(h).is_integer() else h


def _validate(hs: tuple[float, ...], us: tuple[float, ...]) -> None:
    if len(hs) != len(us) or not hs:
        raise CurveError("points: need at least one [h, U] pair")
    for k, (h, u) in enumerate(zip(hs, us, strict=True)):
        if not h > 0:
            raise CurveError(f"points[{k}]: h={h} must be positive (h is a batch size)")
        if not 0 < u <= 1:
            raise CurveError(f"points[{k}]: U={u} at h={_num(h)} must be in (0, 1] (a fraction of peak)")
        if k and h <= hs[k - 1]:
            raise CurveError(
                f"points[{k}]: h must increase from point to point, "
                f"but h={_num(h)} follows h={_num(hs[k - 1])}"
            )
        if k and u < us[k - 1]:
            raise CurveError(
                f"points[{k}]: U must not decrease as h grows, but U({_num(h)})={u} "
                f"< U({_num(hs[k - 1])})={us[k - 1]}"
            )


def from_points(
    name: str, points: list[tuple[float, float]], tau: float | None = None, description: str = ""
) -> Curve:
    """A curve from [h, U] pairs (raises CurveError naming the first bad point)."""
    return Curve(
        name=name,
        hs=tuple(float(h) for h, _ in points),
        us=tuple(float(u) for _, u in points),
        tau=tau,
        description=description,
    )


def parse(doc: Any, source: str = "<curve>") -> Curve:
    """Validate a decoded JSON document as a curve; errors are prefixed with `source`."""
    try:
        f = CurveFile.model_validate(doc)
    except pydantic.ValidationError as err:
        first = err.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "<root>"
        raise CurveError(f"{source}: {loc}: {first['msg']}") from None
    try:
        return Curve(
            name=f.name,
            hs=tuple(h for h, _ in f.points),
            us=tuple(u for _, u in f.points),
            tau=f.tau,
            description=f.description,
            extra=dict(f.model_extra or {}),
        )
    except CurveError as err:
        raise CurveError(f"{source}: {err}") from None


def load(ref: str | pathlib.Path) -> Curve:
    """A built-in curve by name (`h100`) or a curve JSON file by path."""
    path = CURVES_DIR / f"{ref}.json" if isinstance(ref, str) and ref in BUILTIN else pathlib.Path(ref)
    try:
        text = path.read_text()
    except OSError as err:
        names = ", ".join(BUILTIN)
        raise CurveError(f"{path}: cannot read curve ({err.strerror}); built-in curves: {names}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise CurveError(f"{path}: not valid JSON: {err.msg} at line {err.lineno}") from None
    return parse(doc, str(path))


def builtin(name: str = DEFAULT) -> Curve:
    if name not in BUILTIN:
        raise CurveError(f"no built-in curve {name!r}; built-in curves: {', '.join(BUILTIN)}")
    return load(name)
