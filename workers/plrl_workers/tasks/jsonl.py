"""A user's prompts from a JSONL file (`task.name: jsonl`): one `{"prompt": ..., "answer": ...}` per line.

The whole file is read and validated up front, so a bad line fails the job before any worker
starts, with the file and line number in the message. The stream visits the records in a fresh
seeded order every epoch (prompt ids keep counting up across epochs, so they stay unique).
A dataset has no held-out part: the `eval` split is the same records in the same order.

Neighbours: `tasks/base.py` (the `Task` protocol), `tasks/registry.py` (`from_spec`),
`plrl_api.spec.DatasetSource`.
"""

from __future__ import annotations

import json
import pathlib
import random

import pydantic

from plrl_workers.tasks import base


class Record(pydantic.BaseModel):
    """One line of the file. Other keys (ids, metadata) are allowed and ignored."""

    model_config = pydantic.ConfigDict(extra="ignore", strict=True)

    prompt: str = pydantic.Field(min_length=1, description="The text the model is given.")
    answer: str = pydantic.Field(default="", description="Reference answer passed to the reward.")


def parse(text: str, source: str) -> list[Record]:
    """Validate JSONL text; `source` names it in errors (`<file>:<line>: <field>: <reason>`)."""
    records: list[Record] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise base.TaskError(
                f"{source}:{lineno}: not valid JSON: {err.msg} (column {err.colno})"
            ) from None
        if not isinstance(obj, dict):
            raise base.TaskError(
                f"{source}:{lineno}: expected an object with 'prompt' and 'answer', got {type(obj).__name__}"
            )
        try:
            records.append(Record.model_validate(obj))
        except pydantic.ValidationError as err:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or '<line>'}: {e['msg']}" for e in err.errors()
            )
            raise base.TaskError(f"{source}:{lineno}: {problems}") from None
    if not records:
        raise base.TaskError(f"{source}: no prompts (the file is empty)")
    return records


def load(path: str | pathlib.Path) -> JsonlTask:
    """Read and validate a JSONL dataset file."""
    p = pathlib.Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as err:
        raise base.TaskError(f"task.dataset.path: cannot read {p}: {err.strerror}") from None
    except UnicodeDecodeError as err:
        raise base.TaskError(f"task.dataset.path: {p} is not UTF-8 text: {err.reason}") from None
    return JsonlTask(records=parse(text, str(p)), source=p.name)


class JsonlTask:
    """The records of one file, reshuffled (deterministically from the seed) every epoch."""

    def __init__(self, records: list[Record], source: str = "<memory>") -> None:
        if not records:
            raise base.TaskError(f"{source}: no prompts")
        self._records = records
        self._source = source
        # One cached order: consecutive ids fall in the same epoch, so this is hit nearly always.
        self._order_key: tuple[int, int] | None = None
        self._order: list[int] = []

    def __len__(self) -> int:
        return len(self._records)

    @property
    def name(self) -> str:
        return f"jsonl:{self._source}"

    @property
    def default_reward(self) -> str:
        return "builtin:exact_match"

    def item(self, seed: int, prompt_id: int, split: base.Split = "train") -> base.Item:
        if prompt_id < 0:
            raise ValueError(f"prompt_id must be >= 0, got {prompt_id}")
        epoch, pos = divmod(prompt_id, len(self._records))
        if self._order_key != (seed, epoch):
            order = list(range(len(self._records)))
            random.Random(f"jsonl:{seed}:{epoch}").shuffle(order)
            self._order_key, self._order = (seed, epoch), order
        rec = self._records[self._order[pos]]
        return base.Item(prompt_id=prompt_id, text=rec.prompt, answer=rec.answer)
