"""Tasks, rewards and datasets, as the coordinator, generators and a user's job file see them.

Cases: builtin prompt streams are deterministic, random-access, seed-dependent, correct, and keep
held-out problems out of training; prompts tokenise to BOS + one token per character; builtin
rewards score edge cases as documented and `score` refuses non-finite or non-numeric rewards;
a user's `package.module:function` loads, and each way it can be wrong is reported naming
`task.reward`; JSONL datasets load, reshuffle per epoch, and bad files name the file and line;
`registry.from_spec` resolves what a job file asks for, and the demo job file is valid and fits its task.
"""

from __future__ import annotations

import itertools
import math
import pathlib
import textwrap
import uuid

import pytest

from plrl_api import spec
from plrl_operator import jobfile
from plrl_workers.models import tiny
from plrl_workers.tasks import arith, base, jsonl, registry, reverse, rewards


@pytest.mark.parametrize("name", sorted(registry.BUILTIN))
def test_builtin_stream_is_deterministic_random_access_and_seeded(name: str) -> None:
    task = registry.builtin(name)
    first = base.take(task, seed=7, n=50)
    assert first == base.take(task, seed=7, n=50)
    assert [it.prompt_id for it in first] == list(range(50))
    # Any prompt can be regenerated from its id alone (re-leases, restarts).
    assert task.item(7, 33) == first[33]
    assert base.take(task, seed=7, n=10, start=40) == first[40:]
    assert [it.text for it in base.take(task, seed=8, n=50)] != [it.text for it in first]
    assert all(set(it.text + it.answer) <= set(tiny.CHARACTERS) for it in first)


def test_arith_answers_are_correct_and_eval_problems_are_never_trained_on() -> None:
    task = arith.ArithTask()
    train = base.take(task, seed=0, n=3000)
    held_out = base.take(task, seed=0, n=300, split="eval")
    for it in train + held_out:
        a, b = it.text.removesuffix("=").split("+")
        assert int(it.answer) == int(a) + int(b)
        assert 0 <= int(a) <= 99 and 0 <= int(b) <= 99
    assert {it.text for it in train}.isdisjoint({it.text for it in held_out})
    assert len({it.text for it in held_out}) > 200  # the eval split is a real set, not a few items


def test_reverse_answers_are_reversed() -> None:
    for it in base.take(reverse.ReverseTask(), seed=0, n=100):
        digits = it.text.removeprefix("rev ").removesuffix("=")
        assert it.answer == digits[::-1] and 3 <= len(digits) <= 7


def test_negative_prompt_id_is_refused() -> None:
    with pytest.raises(ValueError, match="prompt_id"):
        arith.ArithTask().item(0, -1)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> object:
    import transformers

    tok_dir = tmp_path_factory.mktemp("tok")
    tiny.save_tokenizer(tok_dir)  # the tiny model's own tokenizer, without building the model
    return transformers.AutoTokenizer.from_pretrained(str(tok_dir))


def test_prompts_are_bos_plus_one_token_per_character(tokenizer: object) -> None:
    task = registry.builtin("arith")
    prompts = list(itertools.islice(base.to_prompts(task, tokenizer, seed=3, start=5), 4))
    vocab = tiny.vocabulary()
    for p, it in zip(prompts, base.take(task, seed=3, n=4, start=5), strict=True):
        assert (p.prompt_id, p.text, p.answer) == (it.prompt_id, it.text, it.answer)
        assert p.token_ids[0] == vocab[tiny.BOS]
        assert len(p.token_ids) == 1 + len(it.text)
    eos = vocab[tiny.EOS]
    ids = [*prompts[0].token_ids[1:], eos]
    assert base.completion_text(tokenizer, ids) == prompts[0].text


# --------------------------------------------------------------------------- rewards


@pytest.mark.parametrize(
    ("completion", "answer", "exact", "digits"),
    [
        ("85", "85", 1.0, 1.0),
        (" 85\n", "85", 1.0, 1.0),  # surrounding whitespace never costs
        ("84", "85", 0.0, 0.5),
        ("58", "85", 0.0, 0.0),
        ("8", "85", 0.0, 0.5),  # a missing character costs like a wrong one
        ("850", "85", 0.0, 2 / 3),  # so does an extra one: longer guesses are not free
        ("", "85", 0.0, 0.0),
        ("", "", 1.0, 1.0),
        ("123", "", 0.0, 0.0),
    ],
)
def test_builtin_rewards(completion: str, answer: str, exact: float, digits: float) -> None:
    assert rewards.load("builtin:exact_match")("1+1=", completion, answer) == exact
    assert rewards.load("builtin:digit_match")("1+1=", completion, answer) == pytest.approx(digits)


def test_unknown_builtin_reward_lists_the_known_ones() -> None:
    with pytest.raises(rewards.RewardError, match=r"task\.reward: .*builtin:nope.*builtin:digit_match"):
        rewards.load("builtin:nope")


def test_score_refuses_non_finite_and_non_numeric_rewards() -> None:
    assert rewards.score(lambda p, c, a: 1, "p", "c", "a") == 1.0
    assert isinstance(rewards.score(lambda p, c, a: 1, "p", "c", "a"), float)
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(rewards.RewardError, match="must be finite"):
            rewards.score(lambda p, c, a, v=bad: v, "p", "c", "a")  # type: ignore[misc]
    for bad_value in (None, "1.0", [1.0]):
        with pytest.raises(rewards.RewardError, match="must return a float"):
            rewards.score(lambda p, c, a, v=bad_value: v, "p", "c", "a")  # type: ignore[misc]


@pytest.fixture
def user_module(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A real importable module (unique name per test) holding reward functions of every shape."""
    name = f"user_rewards_{uuid.uuid4().hex[:12]}"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            """
            THRESHOLD = 0.5

            def length_bonus(prompt, completion, answer):
                return min(len(completion), 10) / 10

            def two_args(prompt, completion):
                return 0.0

            def with_default(prompt, completion, answer, scale=2.0):
                return scale

            def star(*args):
                return 1.0
            """
        )
    )
    (tmp_path / f"{name}_broken.py").write_text("raise RuntimeError('config missing')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_dotted_reward_loads_and_scores(user_module: str) -> None:
    fn = rewards.load(f"{user_module}:length_bonus")
    assert rewards.score(fn, "p", "abc", "x") == pytest.approx(0.3)
    assert rewards.load(f"{user_module}:with_default")("p", "c", "a") == 2.0
    assert rewards.load(f"{user_module}:star")("p", "c", "a") == 1.0


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("no_such_pkg_xyz.rewards:f", r"task\.reward: cannot import module 'no_such_pkg_xyz\.rewards'"),
        ("{mod}:missing", r"task\.reward: module '{mod}' has no attribute 'missing'"),
        ("{mod}:THRESHOLD", r"task\.reward: '{mod}:THRESHOLD' is a float, not a function"),
        (
            "{mod}:two_args",
            r"task\.reward: '{mod}:two_args' has signature \(prompt, completion\); it must accept",
        ),
        (
            "{mod}_broken:f",
            r"task\.reward: importing module '{mod}_broken' .* raised RuntimeError: config missing",
        ),
        (
            "just_a_module",
            r"task\.reward: 'just_a_module' must be 'builtin:<name>' or 'package\.module:function'",
        ),
    ],
)
def test_dotted_reward_errors_name_the_field(user_module: str, ref: str, message: str) -> None:
    with pytest.raises(rewards.RewardError, match=message.format(mod=user_module)):
        rewards.load(ref.format(mod=user_module))


# --------------------------------------------------------------------------- JSONL


def _write(tmp_path: pathlib.Path, text: str) -> pathlib.Path:
    p = tmp_path / "data.jsonl"
    p.write_text(text)
    return p


def test_jsonl_loads_and_every_epoch_is_a_reshuffled_permutation(tmp_path: pathlib.Path) -> None:
    lines = [f'{{"prompt": "q{i}", "answer": "a{i}", "id": {i}}}' for i in range(7)]
    task = jsonl.load(_write(tmp_path, "\n".join(lines[:3]) + "\n\n" + "\n".join(lines[3:]) + "\n"))
    assert len(task) == 7 and task.name == "jsonl:data.jsonl"
    items = base.take(task, seed=1, n=21)
    epochs = [items[i : i + 7] for i in (0, 7, 14)]
    for epoch in epochs:
        assert sorted(it.text for it in epoch) == [f"q{i}" for i in range(7)]
        assert all(it.answer == "a" + it.text[1:] for it in epoch)
    assert [it.text for it in epochs[0]] != [it.text for it in epochs[1]]
    assert [it.prompt_id for it in items] == list(range(21))
    assert base.take(task, seed=1, n=21) == items
    assert task.item(1, 15) == items[15]


def test_jsonl_answer_is_optional(tmp_path: pathlib.Path) -> None:
    task = jsonl.load(_write(tmp_path, '{"prompt": "write a poem"}\n'))
    assert task.item(0, 0).answer == ""


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"prompt": "a", "answer": "b"}\n{"prompt": "c", "answer": \n', r"data\.jsonl:2: not valid JSON"),
        ('{"prompt": "a"}\n\n{"answer": "b"}\n', r"data\.jsonl:3: prompt: Field required"),
        ('{"prompt": "a", "answer": 42}\n', r"data\.jsonl:1: answer: Input should be a valid string"),
        ('{"prompt": ""}\n', r"data\.jsonl:1: prompt: String should have at least 1 character"),
        ('["a", "b"]\n', r"data\.jsonl:1: expected an object with 'prompt' and 'answer', got list"),
        ("\n\n", r"data\.jsonl: no prompts"),
    ],
)
def test_jsonl_errors_name_file_and_line(tmp_path: pathlib.Path, text: str, message: str) -> None:
    with pytest.raises(base.TaskError, match=message):
        jsonl.load(_write(tmp_path, text))


def test_jsonl_missing_file_names_the_field(tmp_path: pathlib.Path) -> None:
    with pytest.raises(base.TaskError, match=r"task\.dataset\.path: cannot read .*nope\.jsonl"):
        jsonl.load(tmp_path / "nope.jsonl")


# --------------------------------------------------------------------------- from the job spec


def test_from_spec_resolves_builtin_and_jsonl(tmp_path: pathlib.Path) -> None:
    assert registry.from_spec(spec.TaskSpec()).name == "arith"  # the spec's default task exists
    (tmp_path / "p.jsonl").write_text('{"prompt": "hi", "answer": "yo"}\n')
    ts = spec.TaskSpec(name="jsonl", dataset=spec.DatasetSource(path="data/p.jsonl"))
    task = registry.from_spec(ts, tmp_path / "p.jsonl")  # the controller resolved the path
    assert task.item(0, 0) == base.Item(prompt_id=0, text="hi", answer="yo")
    with pytest.raises(
        base.TaskError, match=r"task\.name: unknown builtin task 'builtin:sudoku'.*builtin:arith"
    ):
        registry.from_spec(spec.TaskSpec(name="builtin:sudoku"))
    with pytest.raises(base.TaskError, match=r"task\.dataset"):
        registry.from_spec(ts, None)


def test_every_builtin_tasks_default_reward_loads() -> None:
    for name in registry.BUILTIN:
        rewards.load(registry.builtin(name).default_reward)


def test_demo_job_is_valid_and_its_task_and_reward_resolve() -> None:
    root = pathlib.Path(__file__).resolve().parents[3]
    job = jobfile.load_job(root / "examples" / "local-tiny.yaml")
    assert job.spec.model.name == "builtin:tiny" and job.spec.model.warm_start_steps > 0
    task = registry.from_spec(job.spec.task)
    reward = rewards.load(job.spec.task.reward)
    it = task.item(job.spec.task.seed, 0)
    assert rewards.score(reward, it.text, it.answer, it.answer) == 1.0
    # Every prompt plus a full-length completion fits the model length the job asks for.
    longest = max(len(t.text) for t in base.take(task, job.spec.task.seed, 500))
    assert job.spec.generation.max_model_len is not None
    assert 1 + longest + job.spec.generation.max_new_tokens <= job.spec.generation.max_model_len
