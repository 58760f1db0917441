"""The generator loop (`generator.Generator.run`) against a real coordinator over gRPC on 127.0.0.1.

The engine is a fake written here (deterministic tokens, logprobs <= 0, each token tagged with the
engine's weight version, every request finished after `LENGTH` decode steps; it can be stalled and
told to fail a broadcast); everything else is real: `coordinator.core.Coordinator`, `rpc.server`,
`rpc.client.CoordinatorClient`, the rollout stream and the control stream.

Cases:
- backpressure: with no trainer taking groups, the generator stops leasing once `max_unacked_groups`
  groups wait for the full buffer (leases, requests and in-flight sequences stay bounded while the
  coordinator keeps refusing re-sends), then resumes when groups are taken, and every prompt is
  accounted for once the source is used up (and `run()` returns by itself);
- a broadcast that failed midway: the generator leaves the group, pulls the full weights of that
  version over gRPC (bit-exact), and the tokens it decodes from then on carry the new version (a
  sequence in flight across the update holds both versions);
- a broadcast aborted before any tensor (`GroupAborted`: a peer was missing): the weights are intact,
  so it does not pull the version (not published yet) but decodes on and joins the re-announcement;
- a Stop on the control stream ends `run()`; `close()` leaves the broadcast group it had joined and
  closes the control stream and the rollout stream;
- a rollout refused by the coordinator (its lease expired while the generator decoded) is counted,
  not fatal: the generator goes on and the re-queued prompt comes back from a later lease;
- asked to stop (SIGTERM) while backpressured, it stops without waiting for a stalled trainer;
- leases migrated away from it as a slow generator (a Revoke on the control stream) stop decoding
  there at once: their slots go to new leases and no result for them is sent to be refused.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterable, Iterator

import pytest
import torch

from plrl_api import spec as spec_mod
from plrl_workers import generator, protocol
from plrl_workers.coordinator import core as coordinator
from plrl_workers.engines import base as engines
from plrl_workers.rpc import client, limits, server
from plrl_workers.weight_sync import groups, snapshot
from tests.polling import eventually
from tests.workers.rollouts import group_for

TOKEN = "job-token"
GEN = "gen-0"
G = 2
LENGTH = 3  # tokens per completion
VOCAB = 64
EOS = 1


# --------------------------------------------------------------------------- the fake engine


@dataclasses.dataclass
class _Seq:
    request_id: str
    prompt: tuple[int, ...]
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    versions: list[int] = dataclasses.field(default_factory=list)


class FakeEngine:
    """A `GenerationEngine` that decodes `LENGTH` deterministic tokens per request, one per `step()`.

    `allow(n)` lets only `n` more decode steps run (None: no limit); a stalled engine's `step()`
    returns nothing, like a slow decode. `fail_receive` is what `receive_weights` raises (if set).
    Calls are recorded: `requests` (every request id added), `sync` (weight-sync calls in order),
    `pulled` (each `update_weights`: version and tensors), `max_in_flight`.
    """

    def __init__(self, step_s: float = 0.001) -> None:
        self._version = 0
        self._live: dict[str, _Seq] = {}
        self._step_s = step_s
        self._steps_left: int | None = None
        self._lock = threading.Lock()
        self.steps = 0
        self.requests: list[str] = []
        self.sync: list[str] = []
        self.pulled: list[tuple[int, dict[str, torch.Tensor]]] = []
        self.max_in_flight = 0
        self.fail_receive: Exception | None = None
        self.closed = False
        self.updates_allowed = threading.Event()  # cleared: `update_weights` waits (a slow pull)
        self.updates_allowed.set()
        self.updating = threading.Event()  # set once an `update_weights` call has begun

    def allow(self, steps: int | None) -> None:
        with self._lock:
            self._steps_left = steps

    @property
    def weight_version(self) -> int:
        return self._version

    def add_request(
        self, request_id: str, prompt_token_ids: list[int], params: engines.SamplingParams
    ) -> None:
        engines.validate_request(request_id, prompt_token_ids, params, 1024, self._live)
        self._live[request_id] = _Seq(request_id, tuple(prompt_token_ids))
        self.requests.append(request_id)
        self.max_in_flight = max(self.max_in_flight, len(self._live))

    def step(self) -> list[engines.FinishedSequence]:
        time.sleep(self._step_s)
        with self._lock:
            if self._steps_left is not None:
                if self._steps_left <= 0:
                    return []
                self._steps_left -= 1
        self.steps += 1
        done: list[engines.FinishedSequence] = []
        for seq in list(self._live.values()):
            n = len(seq.tokens)
            seq.tokens.append(10 + (sum(seq.prompt) + n) % (VOCAB - 10))
            seq.logprobs.append(-0.25 * (n + 1))
            seq.versions.append(self._version)
            if len(seq.tokens) == LENGTH:
                del self._live[seq.request_id]
                finished = engines.FinishedSequence(
                    seq.request_id, seq.prompt, seq.tokens, seq.logprobs, seq.versions, "length"
                )
                finished.check()
                done.append(finished)
        return done

    def num_in_flight(self) -> int:
        return len(self._live)

    def live(self) -> set[str]:
        return set(self._live)

    def abort(self, request_id: str) -> None:
        self._live.pop(request_id, None)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        self.updating.set()
        self.updates_allowed.wait()
        engines.check_version(self._version, version, self.num_in_flight())
        got = {name: t.clone() for name, t in named_tensors}
        self.pulled.append((version, got))
        self.sync.append(f"update:{version}")
        self._version = version

    def join_weight_group(self, group: protocol.GroupInfo) -> None:
        self.sync.append("join")

    def receive_weights(self, ann: protocol.Announcement) -> None:
        self.sync.append("receive")
        if self.fail_receive is not None:
            raise self.fail_receive
        self._version = ann.version

    def leave_weight_group(self) -> None:
        self.sync.append("leave")

    def close(self) -> None:
        self.closed = True


class FakeTokenizer:
    """What the generator asks of a tokenizer: `decode` (for the reward) and `eos_token_id`."""

    eos_token_id = EOS

    def decode(self, token_ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        return " ".join(str(t) for t in token_ids if not (skip_special_tokens and t == EOS))


def reward(prompt: str, completion: str, answer: str) -> float:
    return 1.0 if completion.endswith(answer) else 0.0


# --------------------------------------------------------------------------- the rig


def prompts(n: int) -> Iterator[protocol.Prompt]:
    for i in range(n):
        yield protocol.Prompt(prompt_id=i, text=f"{i}+1=", answer=str(i + 1), token_ids=(2, 3, 4 + i % 20))


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@dataclasses.dataclass
class Rig:
    coord: coordinator.Coordinator
    store: snapshot.SnapshotStore
    engine: FakeEngine
    gen: generator.Generator
    capacity: int
    thread: threading.Thread
    errors: list[BaseException]
    server: server.Server

    def stats(self) -> protocol.Stats:
        return self.coord.stats()

    def train(self, n: int) -> list[protocol.RolloutGroup]:
        """What a trainer does: take up to `n` groups and finish a step on them (same version)."""
        taken = self.coord.take(n, timeout_s=0.0)
        self.coord.finish_step(self.coord.weight_version)
        return taken

    def train_until(self, n: int, what: str) -> list[protocol.RolloutGroup]:
        """Train whatever arrives until `n` groups were taken."""
        taken: list[protocol.RolloutGroup] = []

        def enough() -> bool:
            taken.extend(self.train(n - len(taken)))
            return len(taken) >= n

        eventually(enough, what=what)
        return taken


Start = Callable[..., Rig]


@pytest.fixture
def start() -> Iterator[Start]:
    """start(n_prompts, engine=..., capacity=..., max_unacked=..., <Config fields>) -> a running Rig.

    Teardown stops the coordinator (a Stop on the control stream), joins the generator's thread and
    re-raises whatever `run()` raised."""
    rigs: list[tuple[Rig, server.Server, client.CoordinatorClient]] = []

    def make(
        n_prompts: int,
        *,
        engine: FakeEngine | None = None,
        capacity: int = 2 * G,
        max_unacked: int = 4,
        buffer_groups: int = 64,
        submit_wait_s: float = 10.0,
        lease_timeout_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> Rig:
        cfg = coordinator.Config(
            samples_per_prompt=G,
            vocab_size=VOCAB,
            buffer_groups=buffer_groups,
            submit_wait_s=submit_wait_s,
            lease_timeout_s=lease_timeout_s,
        )
        coord = coordinator.Coordinator(prompts(n_prompts), cfg, clock=clock)
        store = snapshot.SnapshotStore()
        srv = server.serve(
            coord,
            token=TOKEN,
            snapshots=store,
            host="127.0.0.1",
            port=0,
            call_limits=limits.CallLimits(max_workers=16),
        )
        cli = client.CoordinatorClient(f"127.0.0.1:{srv.port}", TOKEN, timeout_s=10)
        eng = engine or FakeEngine()
        gen = generator.Generator(
            generator_id=GEN,
            engine=eng,
            coord=cli,
            tokenizer=FakeTokenizer(),
            reward_fn=reward,
            params=engines.SamplingParams(max_new_tokens=LENGTH, stop_token_ids=(EOS,)),
            samples_per_prompt=G,
            max_unacked_groups=max_unacked,
        )
        errors: list[BaseException] = []

        def run() -> None:
            try:
                gen.run(capacity)
            except BaseException as exc:  # surfaced by the teardown
                errors.append(exc)

        thread = threading.Thread(target=run, name="generator-under-test", daemon=True)
        rig = Rig(coord, store, eng, gen, capacity, thread, errors, srv)
        rigs.append((rig, srv, cli))
        thread.start()
        eventually(lambda: coord.stats().control_streams == 1, what="the generator's control stream")
        return rig

    yield make
    for rig, srv, cli in rigs:
        rig.coord.stop("test over")
        rig.thread.join(timeout=30)
        srv.stop(0)
        rig.server.stop(0)  # a replacement's, if the test started one
        cli.close()
        assert not rig.thread.is_alive(), "the generator did not stop"
        if rig.errors:
            raise rig.errors[0]


def announce(rig: Rig, version: int) -> None:
    """What the weight broadcaster does for a generator with a control stream: queue a WeightUpdate."""
    group = protocol.GroupInfo(host="127.0.0.1", port=1, rank=1, world_size=2, epoch=7, backend="gloo")
    ann = protocol.Announcement(
        version=version,
        epoch=7,
        params=(protocol.ParamMeta("w", "float32", (4, 3)),),
        bucket_bytes=1 << 20,
    )
    assert rig.coord.announce_weights(GEN, group, ann)


def revive(
    rig: Rig,
    saved: dict[str, object],
    version: int,
    weights: dict[str, torch.Tensor],
    max_generators: int = coordinator.Config.max_generators,
    wait: bool = True,
) -> None:
    """Trainer rank 0 dies and comes back at the same address from `saved` (its checkpoint), with
    `weights` published as `version`; returns once the generator has reconnected to it (`wait`)."""
    port = rig.server.port
    rig.server.stop(0)  # the coordinator is gone
    cfg = coordinator.Config(
        samples_per_prompt=G,
        vocab_size=VOCAB,
        buffer_groups=4,
        submit_wait_s=0.05,
        max_generators=max_generators,
    )
    revived = coordinator.Coordinator(prompts(1000), cfg, state=saved)
    store = snapshot.SnapshotStore()
    store.publish(snapshot.WeightSnapshot.from_named_tensors(version, weights.items()))
    rig.coord, rig.store = revived, store
    rig.server = server.serve(
        revived,
        token=TOKEN,
        snapshots=store,
        host="127.0.0.1",
        port=port,
        call_limits=limits.CallLimits(max_workers=16),
    )
    if wait:
        eventually(lambda: revived.stats().control_streams == 1, what="the generator to reconnect")


def decoded_after_restart(rig: Rig, version: int, carried_version: int = 0) -> list[protocol.RolloutGroup]:
    """Train until two groups decoded at `version` (with the successor's weights) arrive. Groups the
    generator finished at `carried_version` while the coordinator was away may come too (handed to
    the successor, which kept their prompts for it); no group mixes versions."""
    taken: list[protocol.RolloutGroup] = []

    def two_at_version() -> bool:
        taken.extend(rig.train(4))
        return bool(sum(g.samples[0].versions.tolist() == [version] * LENGTH for g in taken) >= 2)

    eventually(two_at_version, what=f"groups decoded at v{version}")
    versions = [{tuple(s.versions.tolist()) for s in g.samples} for g in taken]
    allowed = ({(version,) * LENGTH}, {(carried_version,) * LENGTH})
    assert all(v in allowed for v in versions), versions
    assert sum(v == {(carried_version,) * LENGTH} for v in versions) <= rig.gen.adopted
    return taken


# --------------------------------------------------------------------------- cases


def test_backpressure_stops_leasing_until_the_trainer_takes_groups(start: Start) -> None:
    max_unacked, buffer = 2, 2
    rig = start(12, max_unacked=max_unacked, buffer_groups=buffer, submit_wait_s=0.05)
    capacity_prompts = rig.capacity // G

    # Nobody trains: the buffer fills, later groups are refused (RESOURCE_EXHAUSTED) and re-sent.
    def backpressured() -> protocol.Stats | None:
        s = rig.stats()
        resent = s.refused.get("RESOURCE_EXHAUSTED", 0) >= 2 * max(1, s.accounting.leased)
        idle = rig.engine.num_in_flight() == 0
        return s if s.accounting.buffered == buffer and idle and resent else None

    waiting = eventually(backpressured, what="a full buffer, an idle engine and re-sent groups")
    a = waiting.accounting
    # Leasing stopped at max_unacked waiting groups (plus what was already in flight then).
    assert max_unacked <= a.leased <= max_unacked - 1 + capacity_prompts
    assert rig.gen.heartbeat_report(rig.capacity).queue_depth == a.leased
    assert a.issued == buffer + a.leased and a.balanced
    # It stays stopped while the coordinator keeps refusing: another full round of re-sends later,
    # not one prompt more was leased or decoded.
    refused = waiting.refused["RESOURCE_EXHAUSTED"]

    def resent_again() -> protocol.Stats | None:
        s = rig.stats()
        return s if s.refused["RESOURCE_EXHAUSTED"] >= refused + a.leased else None

    later = eventually(resent_again, what="another round of re-sends")
    assert later.accounting == a
    assert len(rig.engine.requests) == a.issued * G
    assert rig.engine.max_in_flight <= rig.capacity
    # The trainer takes groups: the waiting ones get in, and the generator leases again.
    trained = rig.train(buffer)
    eventually(lambda: rig.stats().accounting.issued > a.issued, what="leasing to resume")
    trained += rig.train_until(12 - buffer, what="every prompt's group")
    rig.thread.join(timeout=30)  # the source is used up and every group delivered: run() returns
    assert not rig.thread.is_alive()
    final = rig.stats().accounting
    assert (final.issued, final.trained, final.outstanding) == (12, 12, 0)
    assert sorted(g.prompt_id for g in trained) == list(range(12))
    assert len(rig.engine.requests) == len(set(rig.engine.requests)) == 12 * G
    assert rig.gen.refused == 0  # re-sent on backpressure, never given up


@pytest.mark.parametrize(
    ("batch_size", "group", "concurrent", "bound"),
    [
        (128, 8, 16, 2),  # the demo: one decode batch finishes 2 groups at once
        (1024, 8, 256, 8),  # a GPU job: capped at MAX_UNACKED_GROUPS
        (64, 8, 256, 4),  # capped at half an optimizer batch
        (16, 8, 8, 1),  # never below one
    ],
)
def test_finished_groups_waiting_for_a_full_buffer_are_bounded_by_one_decode_batch(
    batch_size: int, group: int, concurrent: int, bound: int
) -> None:
    """Each waiting group is trained later; at half an optimizer batch, a trainer-bound demo job
    trained its samples at a mean lag of ~1.5 steps instead of ~1.0 (BENCHMARKS.md)."""
    job = spec_mod.JobSpec.model_validate(
        {
            "model": {"name": "builtin:tiny"},
            "generation": {"samplesPerPrompt": group, "concurrentSequences": concurrent},
            "training": {"batchSize": batch_size},
        }
    )
    assert generator.max_unacked_groups(job, concurrent) == bound


def test_after_a_broadcast_failed_midway_it_pulls_the_full_weights_and_decodes_on(start: Start) -> None:
    engine = FakeEngine()
    engine.allow(1)  # one decode step at version 0, then stalled with the sequences in flight
    engine.fail_receive = RuntimeError("gloo: connection closed by peer")
    rig = start(40, engine=engine, buffer_groups=64)
    eventually(
        lambda: engine.steps == 1 and engine.num_in_flight() == rig.capacity,
        what="a decode step with every slot in flight",
    )
    first = list(engine.requests)
    published = {"w": torch.arange(12, dtype=torch.float32).reshape(4, 3), "b": torch.tensor([1.5, -2.0])}
    rig.store.publish(snapshot.WeightSnapshot.from_named_tensors(3, published.items()))
    rig.coord.finish_step(3)  # the trainer is at version 3, announces it, and the broadcast aborts
    announce(rig, 3)
    eventually(lambda: "update:3" in engine.sync, what="the full-weights pull")
    assert engine.sync == ["join", "receive", "leave", "update:3"]
    ((version, got),) = engine.pulled
    assert version == 3 and list(got) == list(published)
    assert all(torch.equal(got[n], t) for n, t in published.items())
    engine.allow(None)
    taken = rig.train_until(6, what="groups decoded after the pull")
    started_before = {r.rpartition("#")[0] for r in first}
    for g in taken:
        for s in g.samples:
            # The first token of a sequence in flight at the update is version 0; every later one is 3.
            want = [0] + [3] * (LENGTH - 1) if g.lease_id in started_before else [3] * LENGTH
            assert s.versions.tolist() == want, (g.lease_id, s.versions)
    assert {g.lease_id for g in taken} > started_before


def test_an_aborted_broadcast_is_joined_again_not_pulled(start: Start) -> None:
    """Found by the chaos soak: a peer of this generator was killed, so the broadcaster aborted v3's
    epoch and re-announced v3 to the rest at once. This generator pulled v3 instead, which the trainer
    publishes only after the broadcast: the pull waited, the re-announcement waited for it, and both
    sat out the 30 s join timeout. Now an abort (nothing received, weights intact) is left alone."""
    engine = FakeEngine()
    engine.fail_receive = groups.GroupAborted("the sender aborted this weight-sync epoch")
    rig = start(1000, engine=engine, buffer_groups=4, submit_wait_s=0.05)
    rig.coord.finish_step(3)  # v3 is not published (no snapshot): a pull could not get it
    announce(rig, 3)
    eventually(lambda: engine.sync == ["join", "receive", "leave"], what="the aborted epoch left")
    engine.fail_receive = None
    announce(rig, 3)  # the re-announcement, in the epoch without the missing peer
    eventually(lambda: engine.weight_version == 3, timeout_s=10, what="v3 received by broadcast")
    assert engine.sync == ["join", "receive", "leave", "join", "receive"] and engine.pulled == []
    rig.train_until(2, what="groups decoded after the update")
    assert rig.thread.is_alive() and not rig.errors


def test_a_stop_on_the_control_stream_ends_run_and_close_cleans_up(start: Start) -> None:
    rig = start(1000, buffer_groups=4, submit_wait_s=0.05)
    rig.coord.finish_step(1)
    announce(rig, 1)  # a broadcast that succeeds: the generator is now in the weight group
    eventually(lambda: rig.engine.weight_version == 1, what="weights v1 received in flight")
    assert rig.engine.sync == ["join", "receive"]
    eventually(lambda: rig.stats().accounting.leased > 0, what="rollouts in flight")
    rig.coord.stop("job finished")
    rig.thread.join(timeout=30)
    assert not rig.thread.is_alive() and not rig.errors
    assert rig.engine.sync == ["join", "receive", "leave"]  # close() left the broadcast group
    eventually(lambda: rig.stats().control_streams == 0, what="the control stream to close")
    eventually(
        lambda: not {"control", "plrl-rollout-acks"} & {t.name for t in threading.enumerate()},
        what="the control and rollout-stream threads to end",
    )


def test_a_refused_rollout_is_counted_and_the_generator_goes_on(start: Start) -> None:
    clock = Clock()
    engine = FakeEngine()
    engine.allow(0)  # stalled: a slow generator holding its leases
    rig = start(4, engine=engine, clock=clock, lease_timeout_s=10.0)
    eventually(lambda: rig.stats().accounting.leased == rig.capacity // G, what="leases out")
    first = list(engine.requests)
    clock.t += 11  # the leases expire; the coordinator re-queues their prompts
    s = rig.stats()
    assert (s.leases_expired, s.accounting.requeued, s.accounting.leased) == (2, 2, 0)
    engine.allow(None)
    eventually(lambda: rig.gen.refused == 2, what="the late rollouts to be refused")
    assert rig.stats().refused == {"FAILED_PRECONDITION": 2}
    taken = rig.train_until(4, what="every prompt's rollouts")
    rig.thread.join(timeout=30)
    assert not rig.thread.is_alive() and not rig.errors  # it went on to the end of the source
    assert sorted(g.prompt_id for g in taken) == [0, 1, 2, 3]  # the re-queued prompts came back
    assert not {g.lease_id for g in taken} & {r.rpartition("#")[0] for r in first}
    a = rig.stats().accounting
    assert (a.issued, a.trained, a.outstanding) == (4, 4, 0)


def test_asked_to_stop_while_backpressured_it_stops_without_waiting_for_the_trainer(start: Start) -> None:
    rig = start(100, max_unacked=2, buffer_groups=2, submit_wait_s=0.05)
    eventually(lambda: rig.stats().refused.get("RESOURCE_EXHAUSTED", 0) >= 2, what="backpressure")
    rig.gen.stop()  # SIGTERM; the trainer is stalled, the coordinator not stopping
    rig.thread.join(timeout=generator.FINISH_IN_FLIGHT_S + generator.STOP_DRAIN_S + 10)
    assert not rig.thread.is_alive() and not rig.errors
    a = rig.stats().accounting
    assert a.balanced and a.buffered == 2  # the groups it gave up on are still leased: they expire


def _stalled_mid_sequence(start: Start) -> tuple[Rig, list[str]]:
    """A generator with its slots full of sequences one token in (of `LENGTH`), its engine stalled;
    plenty of prompts left to lease. Returns the rig and the requests in flight."""
    engine = FakeEngine()
    engine.allow(1)
    rig = start(100, engine=engine)
    full = rig.capacity // G
    eventually(lambda: engine.steps == 1 and rig.stats().accounting.leased == full, what="full slots")
    return rig, list(engine.requests)


def test_asked_to_stop_it_finishes_the_sequences_in_flight_and_leases_nothing_more(start: Start) -> None:
    """Leaving a job that goes on (a scale-down): what it was decoding is delivered and trained, not
    re-queued and decoded again elsewhere."""
    rig, in_flight = _stalled_mid_sequence(start)
    rig.gen.stop()  # SIGTERM
    rig.engine.allow(None)
    taken = rig.train_until(len(in_flight) // G, what="the groups that were in flight")
    rig.thread.join(timeout=generator.FINISH_IN_FLIGHT_S + generator.STOP_DRAIN_S + 10)
    assert not rig.thread.is_alive() and not rig.errors
    assert {g.lease_id for g in taken} == {r.rpartition("#")[0] for r in in_flight}
    assert rig.engine.requests == in_flight  # its slots freed up, and it leased nothing more
    a = rig.stats().accounting
    assert (a.requeued, a.leased, a.trained) == (0, 0, len(in_flight) // G) and a.balanced, a


def test_sequences_that_do_not_finish_within_the_bound_go_back_to_the_queue(
    start: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(generator, "FINISH_IN_FLIGHT_S", 0.5)
    rig, in_flight = _stalled_mid_sequence(start)  # and it stays stalled
    rig.gen.stop()
    rig.thread.join(timeout=generator.STOP_DRAIN_S + 10)
    assert not rig.thread.is_alive() and not rig.errors
    eventually(lambda: rig.stats().accounting.requeued == len(in_flight) // G, what="the leases re-queued")
    a = rig.stats().accounting
    assert (a.leased, a.trained) == (0, 0) and a.balanced, a


def test_a_job_that_stops_while_a_generator_finishes_its_sequences_ends_that_at_once(start: Start) -> None:
    rig, _ = _stalled_mid_sequence(start)
    rig.gen.stop()
    time.sleep(0.2)  # finishing what is in flight, on a stalled engine
    assert rig.thread.is_alive()
    t0 = time.monotonic()
    rig.coord.stop("job finished")  # the Stop on the control stream
    rig.thread.join(timeout=generator.FINISH_IN_FLIGHT_S + generator.STOP_DRAIN_S + 10)
    assert not rig.thread.is_alive() and not rig.errors
    assert time.monotonic() - t0 < generator.FINISH_IN_FLIGHT_S


def test_a_generator_replaced_under_its_id_stops_and_asks_to_be_restarted(start: Start) -> None:
    """Another process registered as this generator (its replacement): the old one's control stream
    ends, so its run ends with `lost` set (its exit code then is `names.EXIT_RESTART_ME`, never
    the 0 that means "my work is done"), and the prompts it held are leased again."""
    engine = FakeEngine()
    engine.allow(0)  # holding its leases, like a hung process
    rig = start(20, engine=engine)
    eventually(lambda: rig.stats().accounting.leased > 0, what="leases out")
    rig.coord.register(GEN)  # the replacement
    rig.thread.join(timeout=30)
    assert not rig.thread.is_alive() and not rig.errors
    assert "control stream ended" in rig.gen.lost and not rig.gen.work_done
    a = rig.stats().accounting
    assert (a.leased, a.requeued) == (0, a.issued)


def test_when_its_coordinator_restarts_it_reconnects_and_decodes_with_the_resumed_weights(
    start: Start,
) -> None:
    """Trainer rank 0 dies and comes back at the same address from an earlier checkpoint: the
    generator keeps running (no restart), lets go of the groups it decoded with weights newer than
    the successor's (the new coordinator re-queues those prompts from its restored state), registers
    anew and loads the resumed version's weights, older than its own, before it decodes again."""
    rig = start(1000, buffer_groups=4, submit_wait_s=0.05)
    newer = {"w": torch.ones(4, 3)}
    rig.store.publish(snapshot.WeightSnapshot.from_named_tensors(5, newer.items()))
    rig.coord.finish_step(5)
    assert rig.coord.request_pull(GEN, 5)
    eventually(lambda: rig.engine.weight_version == 5, what="weights v5")
    rig.train_until(2, what="groups decoded at v5")
    saved = rig.coord.export_state()  # what the checkpoint holds: version 5 ...
    saved["weight_version"] = 3  # ... of an earlier checkpoint, say
    resumed = {"w": torch.full((4, 3), 3.0)}
    revive(rig, saved, 3, resumed)
    assert rig.gen.reconnects == 1 and rig.thread.is_alive() and not rig.errors
    eventually(lambda: rig.engine.weight_version == 3, what="the resumed version's weights")
    version, got = rig.engine.pulled[-1]
    assert version == 3 and torch.equal(got["w"], resumed["w"])
    decoded_after_restart(rig, 3)  # and groups finished at v0 (not v5: newer than its weights)
    a = rig.coord.stats().accounting
    assert a.balanced


def test_what_was_in_flight_when_its_coordinator_restarted_is_finished_and_delivered_to_the_successor(
    start: Start,
) -> None:
    """Trainer rank 0 restarts from a checkpoint of the version the generator decodes with (the
    elastic restart of a change of I): the generator finishes the sequences it had in flight while
    the coordinator is away, and the successor, which re-queued their prompts from its checkpoint,
    leases them back to it: the groups are trained without being decoded again."""
    rig, _ = _stalled_mid_sequence(start)
    saved = rig.coord.export_state()
    leased = {p["prompt_id"] for p in saved["pending"]}  # type: ignore[attr-defined]
    assert len(leased) == rig.capacity // G
    revive(rig, saved, 0, {"w": torch.zeros(4, 3)}, wait=False)
    rig.engine.allow(None)  # decoding goes on while the successor starts
    eventually(lambda: rig.coord.stats().control_streams == 1, what="the generator to reconnect")
    taken = rig.train_until(len(leased), what="the groups finished while the coordinator was away")
    assert {g.prompt_id for g in taken[: len(leased)]} == leased
    assert rig.gen.adopted == len(leased) and rig.coord.stats().leases_adopted == len(leased)
    # Not decoded again: no engine request was made under the leases they were delivered with.
    decoded_under = {r.rpartition("#")[0] for r in rig.engine.requests}
    assert not {g.lease_id for g in taken if g.prompt_id in leased} & decoded_under
    assert all(s.versions.tolist() == [0] * LENGTH for g in taken for s in g.samples)
    assert rig.coord.stats().accounting.balanced and not rig.errors


def test_groups_a_restarting_coordinator_refused_are_delivered_to_its_successor(start: Start) -> None:
    """The trainer, asked to stop for a resize, stops granting leases and taking groups, then saves
    its state: groups that finish meanwhile are refused (UNAVAILABLE, stopping). The generator holds
    them and hands them to the successor, which kept their prompts for it."""
    rig, _ = _stalled_mid_sequence(start)
    rig.coord.stop("the trainer is restarting", tell_generators=False)
    rig.engine.allow(None)
    n = rig.capacity // G
    eventually(lambda: rig.coord.stats().refused.get("UNAVAILABLE", 0) >= n, what="the groups refused")
    saved = rig.coord.export_state()
    leased = {p["prompt_id"] for p in saved["pending"]}  # type: ignore[attr-defined]
    assert len(leased) == n
    revive(rig, saved, 0, {"w": torch.zeros(4, 3)})
    taken = rig.train_until(n, what="the refused groups, delivered to the successor")
    assert {g.prompt_id for g in taken[:n]} == leased and rig.gen.adopted == n
    assert rig.coord.stats().accounting.balanced and not rig.errors


def test_a_generator_forgotten_while_it_pulled_its_first_weights_registers_again(start: Start) -> None:
    """Found by the hostile-client test: a flood of registrations displaced a generator that had
    registered but was still loading its first weights (no lease, no control stream yet: it looked
    abandoned). Its first lease was then refused as "not registered", which it took for being
    replaced: it exited, and the job waited for its restart. Forgotten is not replaced: it registers
    again and decodes on in the same process."""
    rig = start(1000, buffer_groups=4, submit_wait_s=0.05)
    rig.train_until(2, what="groups before the coordinator restarts")
    saved = rig.coord.export_state()
    saved["weight_version"] = 3
    rig.engine.updates_allowed.clear()  # the weight load after the reconnect takes a while
    rig.engine.updating.clear()
    revive(rig, saved, 3, {"w": torch.full((4, 3), 3.0)}, max_generators=2, wait=False)
    eventually(rig.engine.updating.is_set, what="the generator to register and pull v3")
    for i in range(2):  # the second displaces the oldest registration that never started: ours
        rig.coord.register(f"flood-{i}")
    assert rig.stats().generators == 2
    rig.engine.updates_allowed.set()
    eventually(lambda: rig.stats().control_streams == 1, what="the generator to register again")
    decoded_after_restart(rig, 3)
    assert rig.thread.is_alive() and not rig.gen.lost and not rig.errors
    assert rig.gen.reconnects == 2  # after the coordinator's restart, and after being forgotten


def test_asked_to_stop_while_it_waits_for_weights_it_stops_without_a_traceback(start: Start) -> None:
    """Found by the hostile-client test: a generator whose pull was refused (the coordinator at its
    bound on open streams) and was then sent SIGTERM at the end of the job raised the refusal."""
    rig = start(1000, buffer_groups=4, submit_wait_s=0.05)
    assert rig.coord.request_pull(GEN, 7)  # never published: the pull is refused, and asked again
    time.sleep(1.0)
    rig.gen.stop()
    rig.thread.join(timeout=30)
    assert not rig.thread.is_alive() and not rig.errors and not rig.gen.lost


def test_a_pull_the_coordinator_died_during_ends_in_a_reconnect_not_a_crash(start: Start) -> None:
    """Found by the chaos soak: rank 0 asked for v7 (an aborted broadcast), hung before publishing
    it and was restarted from a checkpoint at v3. The pull of v7 could never succeed (the successor
    says UNAVAILABLE, have 3): the generator waited out its pull timeout, then crashed, and each
    generator was charged a restart. Now the broken control stream ends the pull: it reconnects and
    takes the resumed weights."""
    rig = start(1000, buffer_groups=4, submit_wait_s=0.05)
    rig.store.publish(snapshot.WeightSnapshot.from_named_tensors(5, {"w": torch.ones(4, 3)}.items()))
    rig.coord.finish_step(5)
    assert rig.coord.request_pull(GEN, 5)
    eventually(lambda: rig.engine.weight_version == 5, what="weights v5")
    saved = rig.coord.export_state()
    saved["weight_version"] = 3
    assert rig.coord.request_pull(GEN, 7)  # never published: the generator keeps asking
    time.sleep(1.0)
    revive(rig, saved, 3, {"w": torch.full((4, 3), 3.0)})
    assert rig.gen.reconnects == 1 and rig.thread.is_alive() and not rig.errors
    eventually(lambda: rig.engine.weight_version == 3, what="the resumed version's weights")
    rig.train_until(2, what="groups for the revived coordinator")


def test_a_coordinator_replaced_while_the_generator_was_still_starting_ends_in_a_reconnect(
    start: Start,
) -> None:
    """Seen once in CI (a generator restarted for no fault of its own): trainer rank 0 died while a
    generator was still starting, registered at v7 and pulling weights not yet published. With no
    control stream yet nothing told it the coordinator was gone: it asked the successor (resumed at
    v3) for v7 until its pull timeout, then crashed and was charged a restart. The coordinator's
    session tells it that the one answering is another: it registers anew and takes v3."""
    rig = start(1000, buffer_groups=4, submit_wait_s=0.05)
    saved = rig.coord.export_state()
    ahead = dict(saved, weight_version=7)  # registers generators at v7, publishes only v5
    revive(rig, ahead, 5, {"w": torch.ones(4, 3)}, wait=False)
    eventually(
        lambda: rig.stats().refused.get("UNAVAILABLE", 0) >= 2, what="the starting generator's pull refused"
    )
    assert rig.stats().control_streams == 0
    revive(rig, dict(saved, weight_version=3), 3, {"w": torch.full((4, 3), 3.0)})
    assert rig.thread.is_alive() and not rig.errors and rig.gen.reconnects == 2
    eventually(lambda: rig.engine.weight_version == 3, what="the resumed version's weights")
    decoded_after_restart(rig, 3)  # groups finished at v0 while the first one was away may come too


def test_an_announcement_older_than_the_loaded_weights_is_not_joined(start: Start) -> None:
    """After an aborted epoch the generator pulled the newest weights; the broadcaster re-announces
    the version it was sending, older now: the generator stays out of it instead of going back."""
    rig = start(1000, buffer_groups=4, submit_wait_s=0.05)
    rig.store.publish(snapshot.WeightSnapshot.from_named_tensors(6, {"w": torch.ones(4, 3)}.items()))
    rig.coord.finish_step(6)
    assert rig.coord.request_pull(GEN, 6)
    eventually(lambda: rig.engine.weight_version == 6, what="weights v6")
    announce(rig, 4)
    rig.train_until(4, what="groups decoded after the announcement")  # it went on decoding
    assert "join" not in rig.engine.sync and rig.engine.weight_version == 6
    assert rig.thread.is_alive() and not rig.errors


def test_leases_migrated_away_from_a_slow_generator_stop_decoding_there(start: Start) -> None:
    """Seed 3.3.1, the slow generator's side: told which leases its peers took over, it drops them
    at once and fills their slots, instead of decoding them to the end to have the results refused."""
    clock = Clock()
    engine = FakeEngine()
    engine.allow(0)  # stalled: a generator completing nothing, with its slots full
    rig = start(1000, engine=engine, clock=clock)
    held = rig.capacity // G
    eventually(lambda: rig.stats().accounting.leased == held, what="its slots full")
    for peer in ("a", "b"):
        rig.coord.register(peer)
    clock.t += 30  # everyone registered long enough ago to be judged
    for peer in ("a", "b"):
        for lease in rig.coord.lease(peer, 3).leases:
            assert rig.coord.submit(group_for(lease)).ok
    before = {r.rpartition("#")[0] for r in engine.live()}
    (moved,) = rig.coord.migrate_from_slow(threshold=0.2, window_s=30.0)
    assert (moved.generator_id, moved.prompts) == (GEN, held // 2)
    eventually(lambda: rig.gen.revoked == held // 2, what="the Revoke to reach the generator")
    kept = before & {r.rpartition("#")[0] for r in engine.live()}
    assert len(kept) == held - held // 2  # the older half keeps decoding there
    eventually(lambda: engine.num_in_flight() == rig.capacity, what="the freed slots refilled")
    engine.allow(None)
    rig.train_until(held + 2, what="its rollouts, kept and new")
    assert rig.gen.refused == 0 and "FAILED_PRECONDITION" not in rig.stats().refused
    a = rig.stats().accounting
    assert a.balanced, a
