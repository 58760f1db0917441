"""The gpu-check's results: the `results.json` schema and the `summary.txt` it is rendered into.

Schema `plrl-gpu-check/1` (stable: add keys, never change or drop one without bumping it):

    {
      "schema": "plrl-gpu-check/1",
      "mode": "gpu" | "cpu",
      "ok": true,                 # no stage failed or timed out (the script's exit code is 0 iff ok)
      "started_at": "2026-...Z", "wall_s": 312.4, "budget_s": 470,
      "host": {...},              # the env stage's probe: python, torch, CUDA device, package versions
      "stages": [
        {
          "name": "tests-engine",
          "status": "passed" | "failed" | "skipped" | "timeout",
          "reason": "...",        # why skipped, failed or timed out ("" when passed)
          "seconds": 41.2, "budget_s": 100,
          "checks": [{"name": "...", "ok": true | false | null, "detail": "..."}],  # null: not judged
          "data": {...},          # the stage's numbers (below)
          "log_tail": "..."       # last lines of its output when it did not pass
        }, ...
      ]
    }

Stage data: `env` the probe; `profile` the curve (`points`, `peak_tflops`, `device`, `file`);
`plan` `{"h100": plan, "measured": plan}` (selected fields of `plrl plan --json`); `tests-*` pytest
counts, failed test ids and skip reasons; `bench-decode` the bench's JSON (rows of H with tokens/s
median/min/max for the torch engine and `generate`, and their ratio); `run-demo` the run's
`summary.json` and the derived job's settings.

Neighbours: `runner.py` (fills these in), `collect.py` (turns a stage's files into checks and data).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Literal

SCHEMA = "plrl-gpu-check/1"
Status = Literal["passed", "failed", "skipped", "timeout"]


@dataclasses.dataclass(frozen=True)
class Check:
    name: str
    ok: bool | None
    """None: recorded but not judged (e.g. learning over a handful of CPU steps)."""
    detail: str = ""


@dataclasses.dataclass
class StageResult:
    name: str
    status: Status
    reason: str = ""
    seconds: float = 0.0
    budget_s: float = 0.0
    checks: list[Check] = dataclasses.field(default_factory=list)
    data: dict[str, Any] = dataclasses.field(default_factory=dict)
    log_tail: str = ""

    @property
    def ok(self) -> bool:
        return self.status in ("passed", "skipped")


def judged(name: str, checks: list[Check], data: dict[str, Any] | None = None) -> StageResult:
    """A stage that ran: passed unless a judged check failed (the first failure is the reason)."""
    failed = [c for c in checks if c.ok is False]
    reason = f"{failed[0].name}: {failed[0].detail}" if failed else ""
    return StageResult(name, "failed" if failed else "passed", reason, checks=checks, data=data or {})


@dataclasses.dataclass
class Results:
    mode: Literal["gpu", "cpu"]
    started_at: str
    budget_s: float
    wall_s: float = 0.0
    host: dict[str, Any] = dataclasses.field(default_factory=dict)
    stages: list[StageResult] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(s.ok for s in self.stages)

    def stage(self, name: str) -> StageResult | None:
        return next((s for s in self.stages if s.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "mode": self.mode,
            "ok": self.ok,
            "started_at": self.started_at,
            "wall_s": round(self.wall_s, 1),
            "budget_s": self.budget_s,
            "host": self.host,
            "stages": [
                dataclasses.asdict(s)
                | {"seconds": round(s.seconds, 1), "checks": [dataclasses.asdict(c) for c in s.checks]}
                for s in self.stages
            ],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str) + "\n"


# ------------------------------------------------------------------ summary.txt


def summary_text(r: Results) -> str:
    """A short, plain-text account: one line per stage, then the numbers worth reading."""
    host = r.host
    device = host.get("device") or "no CUDA device"
    verdict = "PASSED" if r.ok else f"FAILED ({sum(not s.ok for s in r.stages)} of {len(r.stages)} stages)"
    lines = [
        f"plrl gpu-check ({r.mode}) on {device}, torch {host.get('torch', '?')}, "
        f"python {host.get('python', '?')}: {verdict} in {r.wall_s:.0f} s (budget {r.budget_s:.0f} s)",
        "",
    ]
    for s in r.stages:
        lines.append(f"  {s.name:<14} {s.status:<8} {s.seconds:6.1f} s  {_stage_note(s)}".rstrip())
    for part in (_curve_and_plan(r), _bench(r), _run(r)):
        if part:
            lines += ["", *part]
    return "\n".join(lines) + "\n"


def _stage_note(s: StageResult) -> str:
    d = s.data
    if "passed" in d and "failed" in d:
        counts = f"{d['passed']} passed, {d['failed']} failed, {d['skipped']} skipped"
        skips = "; ".join(sorted(d.get("skip_reasons", {})))
        note = counts + (f" (skipped: {skips})" if skips else "")
        return note + (f"; {s.reason}" if s.reason and s.status != "skipped" else "")
    return s.reason


def _curve_and_plan(r: Results) -> list[str]:
    out: list[str] = []
    prof = r.stage("profile")
    if prof is not None and prof.data.get("points"):
        d = prof.data
        pts = ", ".join(f"{_num(h)}: {u:.3f}" for h, u in d["points"])
        out.append(f"U(h) on {d.get('device', '?')} ({d.get('dtype', '?')}, {d.get('file', '')}):")
        out.append(f"  {pts}")
    plan = r.stage("plan")
    if plan is not None and plan.data.get("h100") and plan.data.get("measured"):
        a, b = plan.data["h100"], plan.data["measured"]
        head = f"plrl plan, N={a['n_gpus']}, B={a['batch_size']}:"
        out.append(f"{head:<30}{'H100 (built-in)':>16}  {b['curve'] + ' (measured)':>16}")
        for label, key in (
            ("conventional r_conv", "r_conv"),
            ("pipeline I", "generators"),
            ("pipeline H", "concurrency"),
            ("U(H)", "utilisation"),
            ("pipeline r", "r_pipeline"),
            ("g_max (steps)", "g_max"),
            ("speed-up", "speedup"),
        ):
            suffix = "x" if key == "speedup" else ""
            out.append(f"  {label:<28}{_fmt(a[key]) + suffix:>16}  {_fmt(b[key]) + suffix:>16}")
    return out


def _bench(r: Results) -> list[str]:
    s = r.stage("bench-decode")
    if s is None or not s.data.get("rows"):
        return []
    d = s.data
    out = [
        f"decode tokens/s, {d['parameters'] / 1e6:.3g}M-parameter model, {d['dtype']} on {d['device']} "
        f"(median of {d['repeats']}, min-max):",
        f"  {'H':>5}  {'torch engine':>26}  {'transformers generate':>26}  ratio",
    ]
    for row in d["rows"]:
        e, g = row["engine_tok_s"], row["generate_tok_s"]
        out.append(f"  {row['h']:>5}  {_spread(e):>26}  {_spread(g):>26}  {row['ratio']:.2f}x")
    return out


def _run(r: Results) -> list[str]:
    s = r.stage("run-demo")
    if s is None or not s.data.get("summary"):
        return []
    sm = s.data["summary"]
    out = [
        f"plrl run demo ({s.data.get('job', {}).get('dtype', '?')}, {sm.get('steps', 0)} steps, "
        f"{sm.get('wall_seconds', 0):.0f} s): reward {sm.get('reward_first_10pct', float('nan')):.3f} -> "
        f"{sm.get('reward_last_10pct', float('nan')):.3f}, lag mean {sm.get('lag_mean', float('nan')):.2f}, "
        f"samples spanning 2+ versions {sm.get('mixed_version_samples', 0)}",
    ]
    out += [
        f"  {c.name}: {'ok' if c.ok else 'not judged' if c.ok is None else 'FAILED'} ({c.detail})"
        for c in s.checks
    ]
    return out


def _spread(s: dict[str, float]) -> str:
    return f"{s['median']:,.0f} ({s['min']:,.0f}-{s['max']:,.0f})"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f}" if v < 1 else f"{v:.2f}"
    return str(v)
