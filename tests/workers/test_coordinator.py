"""The coordinator's promises, without gRPC: what a generator and the trainer can rely on.

Cases: a prompt is out with one generator at a time; expired, dead and replaced generators' leases
are re-queued and their late returns refused; duplicates refused; every malformed group refused with
its status code while the lease stays usable; backpressure (blocks, then RESOURCE_EXHAUSTED, lease
renewed); the lag policy drops and counts; accounting balances exactly, also under concurrency;
export/restore loses and repeats nothing; stop; control channels; IdRanges is a set; a slow
generator's newest leases migrate to its peers (once per window; new generators are not judged).
"""

from __future__ import annotations

import itertools
import json
import math
import random
import threading
import time
from collections.abc import Iterator

import hypothesis
import hypothesis.strategies as st
import numpy
import pydantic
import pytest

from plrl_api import records
from plrl_workers import protocol
from plrl_workers.coordinator import core as coordinator
from plrl_workers.coordinator import state as restart
from tests.workers.rollouts import G, group_for, sample


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def prompts(n: int, start: int = 0) -> Iterator[protocol.Prompt]:
    for i in range(start, start + n):
        yield protocol.Prompt(prompt_id=i, text=f"q{i}", answer=str(i), token_ids=(1, 2, i % 50))


def make(n: int = 10, clock: Clock | None = None, **kw: object) -> coordinator.Coordinator:
    config = coordinator.Config(samples_per_prompt=G, **kw)  # type: ignore[arg-type]
    c = coordinator.Coordinator(prompts(n), config, clock=clock or Clock())
    c.register("a")
    c.register("b")
    return c


def assert_balanced(c: coordinator.Coordinator) -> records.PromptCounts:
    a = c.stats().accounting
    assert a.balanced, a
    return a


def test_lease_submit_take_finish_accounts_every_prompt_once() -> None:
    c = make(n=3)
    batch = c.lease("a", 10)
    assert [x.prompt.prompt_id for x in batch.leases] == [0, 1, 2]
    assert all(c.submit(group_for(x)).ok for x in batch.leases)
    taken = c.take(3, timeout_s=1)
    assert sorted(g.prompt_id for g in taken) == [0, 1, 2]
    assert assert_balanced(c).in_training == 3
    c.finish_step(1)
    a = assert_balanced(c)
    assert (a.issued, a.trained, a.in_training) == (3, 3, 0)
    assert c.stats().finished
    assert c.lease("b", 1).finished


def test_a_prompt_is_out_with_one_generator_until_its_lease_expires() -> None:
    clock = Clock()
    c = make(n=1, clock=clock, lease_timeout_s=10.0)
    (lease_a,) = c.lease("a", 5).leases
    again = c.lease("b", 5)
    assert again.leases == [] and not again.finished  # a holds it; it may still come back
    clock.t += 11
    (lease_b,) = c.lease("b", 5).leases
    assert lease_b.prompt == lease_a.prompt and lease_b.lease_id != lease_a.lease_id
    late = c.submit(group_for(lease_a))
    assert late.code is protocol.Code.FAILED_PRECONDITION
    assert c.submit(group_for(lease_b)).ok
    assert c.submit(group_for(lease_b)).code is protocol.Code.ALREADY_EXISTS
    c.take(1, timeout_s=1)
    c.finish_step(1)
    a = assert_balanced(c)
    assert (a.issued, a.trained) == (1, 1)
    assert c.stats().leases_expired == 1


def test_dead_or_replaced_generators_lose_their_leases_to_the_queue() -> None:
    c = make(n=4)
    a_leases = c.lease("a", 2).leases
    b_leases = c.lease("b", 2).leases
    c.generator_dead("a")
    assert c.stats().accounting.requeued == 2
    with pytest.raises(protocol.Refused) as err:
        c.lease("a", 1)
    assert err.value.code is protocol.Code.NOT_FOUND  # forgotten: it must register again to lease
    c.register("b")  # b restarted under the same name: its old leases go back too
    assert c.stats().accounting.requeued == 4
    assert all(c.submit(group_for(x)).code is protocol.Code.FAILED_PRECONDITION for x in a_leases + b_leases)
    fresh = c.lease("b", 10).leases
    assert sorted(x.prompt.prompt_id for x in fresh) == [0, 1, 2, 3]
    assert c.stats().leases_revoked == 4
    assert_balanced(c)


def _bad(kind: str, g: protocol.RolloutGroup) -> None:
    s = g.samples[0]
    if kind == "lengths":
        s.logprobs = numpy.append(s.logprobs, -1.0)
    elif kind == "nan_logprob":
        s.logprobs[1] = math.nan
    elif kind == "inf_logprob":
        s.logprobs[1] = -math.inf
    elif kind == "positive_logprob":
        s.logprobs[0] = 0.25
    elif kind == "decreasing_versions":
        s.versions[:] = [1, 0, 0]
    elif kind == "future_version":
        s.versions[:] = [0, 0, 7]
    elif kind == "negative_version":
        s.versions[:] = [-1, 0, 0]
    elif kind == "sample_count":
        g.samples.pop()
    elif kind == "reward":
        s.reward = math.inf
    elif kind == "finish_reason":
        s.finish_reason = "eaten"
    elif kind == "prompt_id":
        g.prompt_id += 1
    elif kind == "prompt_tokens":
        g.prompt_token_ids.append(9)
    elif kind == "token_range":
        s.token_ids[0] = 10_000
    elif kind == "unknown_lease":
        g.lease_id = "nope-1"
    elif kind == "other_generator":
        g.generator_id = "b"


BAD = {
    "lengths": protocol.Code.INVALID_ARGUMENT,
    "nan_logprob": protocol.Code.INVALID_ARGUMENT,
    "inf_logprob": protocol.Code.INVALID_ARGUMENT,
    "positive_logprob": protocol.Code.INVALID_ARGUMENT,
    "decreasing_versions": protocol.Code.INVALID_ARGUMENT,
    "future_version": protocol.Code.FAILED_PRECONDITION,
    "negative_version": protocol.Code.INVALID_ARGUMENT,
    "sample_count": protocol.Code.INVALID_ARGUMENT,
    "reward": protocol.Code.INVALID_ARGUMENT,
    "finish_reason": protocol.Code.INVALID_ARGUMENT,
    "prompt_id": protocol.Code.INVALID_ARGUMENT,
    "prompt_tokens": protocol.Code.INVALID_ARGUMENT,
    "token_range": protocol.Code.INVALID_ARGUMENT,
    "unknown_lease": protocol.Code.NOT_FOUND,
    "other_generator": protocol.Code.FAILED_PRECONDITION,
}


@pytest.mark.parametrize("kind", sorted(BAD))
def test_malformed_group_is_refused_and_the_lease_stays_usable(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    c = make(n=1, vocab_size=100)
    (lease,) = c.lease("a", 1).leases
    bad = group_for(lease)
    _bad(kind, bad)
    result = c.submit(bad)
    assert result.code is BAD[kind], result
    assert result.message
    assert any(BAD[kind].name in r.getMessage() for r in caplog.records)
    assert c.stats().refused == {BAD[kind].name: 1}
    assert c.submit(group_for(lease)).ok
    assert_balanced(c)


@pytest.mark.parametrize(
    ("field", "at_limit", "past_it"),
    [
        ("token_id", 99, 100),  # vocab_size 100: ids 0..99
        ("version", 2, 3),  # the trainer is at version 2
        ("length", 3, 4),  # maxNewTokens 3
        ("reward", 10.0, 10.5),
        ("reward", -10.0, -1e200),  # 1e200 used to overflow the trainer's advantage step
    ],
)
def test_each_limit_admits_its_edge_and_refuses_one_past(field: str, at_limit: float, past_it: float) -> None:
    """Probed at the limits, not far from them: the edge value passes, the next one is refused and
    named, and a refused group never reaches the trainer."""

    def submit(value: float) -> protocol.SubmitResult:
        (lease,) = c.lease("a", 1).leases
        g = group_for(lease)
        s = g.samples[0]
        if field == "token_id":
            s.token_ids[0] = int(value)
        elif field == "version":
            s.versions[:] = [0, 0, int(value)]
        elif field == "length":
            g.samples[0] = sample(n=int(value))
        else:
            s.reward = value
        return c.submit(g)

    c = make(n=4, vocab_size=100, max_new_tokens=3, max_abs_reward=10.0)
    c.finish_step(2)
    assert submit(at_limit).ok
    refused = submit(past_it)
    expected = protocol.Code.FAILED_PRECONDITION if field == "version" else protocol.Code.INVALID_ARGUMENT
    assert refused.code is expected, refused
    words = {
        "token_id": "token ids outside [0, 100)",
        "version": "newer than the trainer's 2",
        "length": "generation.maxNewTokens=3",
        "reward": "outside [-10, 10]",
    }
    assert words[field] in refused.message, refused.message
    assert len(c.take(4, timeout_s=0.1)) == 1  # only the group at the limit


def test_a_registration_flood_neither_grows_the_registry_nor_displaces_working_generators() -> None:
    """Found by a probe: 20,000 Register calls with 1 KB ids were all kept. Ids are bounded, and
    past `max_generators` a new id displaces only a registration that never started."""
    c = make(n=10, max_generators=3)  # a and b registered by `make`
    for bad in ("x" * 254, "gen\n0", ""):
        with pytest.raises(protocol.Refused, match="1-253 printable characters"):
            c.register(bad)
    assert c.lease("a", 1).leases  # a works (holds a lease)
    c.attach_control("b")  # b has its control stream
    for i in range(20_000):
        c.register(f"flood-{i}-" + "y" * 200)  # each displaces the previous one, never a or b
    assert c.stats().generators == 3
    with pytest.raises(protocol.Refused, match="not registered") as forgotten:
        c.lease("flood-0-" + "y" * 200, 1)  # displaced: it can lease nothing
    assert forgotten.value.code is protocol.Code.NOT_FOUND  # ...until it registers again
    c.register("c")  # displaces the last of the flood
    assert c.lease("c", 1).leases
    with pytest.raises(protocol.Refused) as full:  # all three work: nobody is displaced
        c.register("one-too-many")
    assert full.value.code is protocol.Code.RESOURCE_EXHAUSTED and "max_generators=3" in str(full.value)
    c.generator_dead("a")  # a dead generator is forgotten: its place is free again
    c.register("one-too-many")
    assert c.stats().generators == 3
    assert_balanced(c)


def test_full_buffer_blocks_a_submit_until_the_trainer_takes() -> None:
    c = make(n=3, buffer_groups=1, submit_wait_s=10.0)
    leases = c.lease("a", 2).leases
    assert c.submit(group_for(leases[0])).ok
    results: list[protocol.SubmitResult] = []
    t = threading.Thread(target=lambda: results.append(c.submit(group_for(leases[1]))))
    t.start()
    # Part of the scenario, not a wait for a result: the submit gets time to reach its wait, and what
    # is checked is that it has NOT returned (no poll can show that; a slow machine only makes
    # this check weaker, never wrong).
    time.sleep(0.2)
    assert results == [] and c.stats().accounting.buffered == 1  # still waiting for space
    assert [g.prompt_id for g in c.take(1, timeout_s=1)] == [leases[0].prompt.prompt_id]
    t.join(timeout=5)
    assert results[0].ok
    assert_balanced(c)


def test_full_buffer_refuses_after_the_wait_and_the_group_can_be_sent_again() -> None:
    clock = Clock()
    c = make(n=3, clock=clock, buffer_groups=1, submit_wait_s=0.05, lease_timeout_s=10.0)
    leases = c.lease("a", 2).leases
    assert c.submit(group_for(leases[0])).ok
    clock.t += 9
    refused = c.submit(group_for(leases[1]))
    assert refused.code is protocol.Code.RESOURCE_EXHAUSTED
    clock.t += 9  # 18 s after the lease, but the refused submit renewed it
    c.take(1, timeout_s=1)
    assert c.submit(group_for(leases[1])).ok
    assert c.stats().leases_expired == 0
    assert_balanced(c)


def test_the_buffer_is_bounded_in_bytes_as_well_as_groups() -> None:
    """Found by a probe: five accepted 96 MB groups took a coordinator from 627 to 1,473 MB, the
    group count allowing ~8 GB. Past `buffer_bytes` a submit waits like one into a full buffer."""
    size = group_for(make(n=1).lease("a", 1).leases[0]).nbytes
    c = make(n=4, buffer_groups=100, buffer_bytes=2 * size, submit_wait_s=0.05)
    leases = c.lease("a", 4).leases
    assert c.submit(group_for(leases[0])).ok and c.submit(group_for(leases[1])).ok
    refused = c.submit(group_for(leases[2]))  # 3 groups' bytes > 2 groups' worth
    assert refused.code is protocol.Code.RESOURCE_EXHAUSTED, refused
    assert len(c.take(1, timeout_s=0.1)) == 1  # taking one frees its bytes
    assert c.submit(group_for(leases[2])).ok
    # One group larger than the whole bound still gets in, once the buffer is empty.
    tiny = make(n=2, buffer_bytes=1, submit_wait_s=0.05)
    first, second = tiny.lease("a", 2).leases
    assert tiny.submit(group_for(first)).ok
    assert tiny.submit(group_for(second)).code is protocol.Code.RESOURCE_EXHAUSTED
    tiny.take(1, timeout_s=0.1)
    assert tiny.submit(group_for(second)).ok
    assert_balanced(c)


def test_two_racing_submits_of_one_lease_accept_it_once() -> None:
    c = make(n=3, buffer_groups=1, submit_wait_s=10.0)
    first, second = c.lease("a", 2).leases
    assert c.submit(group_for(first)).ok  # the buffer is now full: both racers wait
    results: list[protocol.SubmitResult] = []
    racers = [threading.Thread(target=lambda: results.append(c.submit(group_for(second)))) for _ in range(2)]
    for t in racers:
        t.start()
    time.sleep(
        0.2
    )  # the scenario: let both racers reach the wait before space frees up (either way one wins)
    c.take(1, timeout_s=1)
    for t in racers:
        t.join(timeout=5)
    assert sorted(r.code for r in results) == [protocol.Code.OK, protocol.Code.ALREADY_EXISTS]
    assert_balanced(c)


def test_prompts_the_trainer_dropped_for_lag_are_counted_as_dropped() -> None:
    c = make(n=2)
    old, new = c.lease("a", 2).leases
    assert c.submit(group_for(old, version=0)).ok
    assert c.submit(group_for(new, version=0)).ok
    assert len(c.take(2, timeout_s=0.2)) == 2
    c.finish_step(3, dropped=[old.prompt.prompt_id])
    a = assert_balanced(c)
    assert (a.issued, a.trained, a.dropped_by_lag) == (2, 1, 1)


def test_finish_step_refuses_dropping_a_prompt_it_was_not_given() -> None:
    c = make(n=2)
    (x,) = c.lease("a", 1).leases
    assert c.submit(group_for(x)).ok
    c.take(1, timeout_s=0.2)
    with pytest.raises(ValueError, match="not taken"):
        c.finish_step(1, dropped=[x.prompt.prompt_id + 1])


def test_finish_step_refuses_to_go_back() -> None:
    c = make()
    c.finish_step(3)
    with pytest.raises(ValueError, match="older"):
        c.finish_step(2)


def test_export_and_restore_lose_and_repeat_nothing() -> None:
    c = make(n=6)
    leases = c.lease("a", 3).leases
    for x in leases[:2]:
        assert c.submit(group_for(x)).ok
    c.take(1, timeout_s=1)
    c.finish_step(1)
    c.take(1, timeout_s=1)  # taken but its step never finished: must be trained again after restore
    state = json.loads(json.dumps(c.export_state()))
    assert state["pending"] and state["weight_version"] == 1

    r = coordinator.Coordinator(prompts(6), coordinator.Config(samples_per_prompt=G), state=state)
    assert r.weight_version == 1
    r.register("a")  # the generator that held prompt 2 (kept for it a while: `adopt_grace_s`)
    again = r.lease("a", 10).leases
    trained_before = {i for lo, hi in state["completed"] for i in range(lo, hi + 1)}
    assert len(trained_before) == 1
    got = [x.prompt.prompt_id for x in again]
    assert sorted(got) == sorted(set(range(6)) - trained_before)
    for x in again:
        assert r.submit(group_for(x, version=1)).ok
    r.take(len(again), timeout_s=1)
    r.finish_step(2)
    a = assert_balanced(r)
    assert (a.issued, a.trained) == (6, 6)
    assert r.stats().finished


def test_a_restored_coordinator_lets_a_generator_adopt_the_prompts_it_finished_and_nothing_else() -> None:
    """A generator finished groups for the previous coordinator: the successor keeps the prompts that
    were leased to it for a while and leases them back to it, so they are delivered instead of decoded
    again; a prompt already given out again, or never issued, is not leased; accounting stays exact."""
    c = make(n=6)
    c.lease("a", 4)  # prompts 0-3 out with "a" when the checkpoint is taken
    state = json.loads(json.dumps(c.export_state()))
    assert [p["holder"] for p in state["pending"]] == ["a"] * 4
    state["pending"][0]["holder"] = ""  # say prompt 0 was re-queued before: anyone's
    clock = Clock()
    config = coordinator.Config(samples_per_prompt=G, adopt_grace_s=30.0)
    r = coordinator.Coordinator(prompts(6), config, state=state, clock=clock)
    r.register("a")
    r.register("b")
    # While "a" may still come back with its groups, "b" gets prompt 0 and fresh ones, not a's.
    assert [x.prompt.prompt_id for x in r.lease("b", 2).leases] == [0, 4]
    adopted = r.lease("a", 10, prompt_ids=[0, 2, 3, 5]).leases
    assert sorted(x.prompt.prompt_id for x in adopted) == [2, 3]  # 0 is out with b, 5 was never issued
    assert r.stats().leases_adopted == 2
    for x in adopted:
        assert r.submit(group_for(x)).ok
    a = assert_balanced(r)
    assert (a.issued, a.leased, a.buffered, a.requeued) == (5, 2, 2, 1)
    # Once its holder asks for ordinary leases (it adopted what it had), the rest is anyone's.
    assert [x.prompt.prompt_id for x in r.lease("a", 1).leases] == [1]
    assert [x.prompt.prompt_id for x in r.lease("b", 10).leases] == [5]


def test_prompts_kept_for_a_generator_that_does_not_come_back_are_anyones_after_the_grace() -> None:
    c = make(n=3)
    c.lease("a", 2)
    clock = Clock()
    config = coordinator.Config(samples_per_prompt=G, adopt_grace_s=30.0)
    r = coordinator.Coordinator(prompts(3), config, state=c.export_state(), clock=clock)
    r.register("b")
    assert [x.prompt.prompt_id for x in r.lease("b", 10).leases] == [2]  # only the fresh one
    clock.t += 30.0
    assert [x.prompt.prompt_id for x in r.lease("b", 10).leases] == [0, 1]


def test_restore_skips_prompts_the_source_repeats_after_completion() -> None:
    c = make(n=2)
    for x in c.lease("a", 2).leases:
        c.submit(group_for(x))
    c.take(2, timeout_s=1)
    c.finish_step(1)
    state = c.export_state()
    # A source that starts over from the beginning (skip_source=False): completed ids are skipped.
    r = coordinator.Coordinator(
        prompts(3), coordinator.Config(samples_per_prompt=G), state=state, skip_source=False
    )
    r.register("a")
    assert [x.prompt.prompt_id for x in r.lease("a", 10).leases] == [2]


def test_restore_rejects_an_unbalanced_record_naming_the_fields() -> None:
    c = make(n=2)
    c.lease("a", 1)
    state = c.export_state()
    state["issued"] = 5
    with pytest.raises(pydantic.ValidationError, match="issued=5"):
        coordinator.Coordinator(prompts(2), coordinator.Config(samples_per_prompt=G), state=state)


def _take_in_a_thread(c: coordinator.Coordinator, n: int) -> tuple[threading.Thread, list[object]]:
    """A trainer waiting for `n` groups with no timeout: only a stop (or the groups) ends its take."""
    out: list[object] = []
    t = threading.Thread(target=lambda: out.append(c.take(n)), daemon=True)
    t.start()
    return t, out


def test_stop_ends_leasing_and_wakes_the_trainer() -> None:
    c = make(n=5)
    channel = c.attach_control("a")
    waiting, got = _take_in_a_thread(c, 4)
    c.stop("done")
    assert channel.get(timeout=1) == protocol.Stop("done")
    assert c.lease("a", 3) == protocol.LeaseBatch([], True)
    waiting.join(timeout=30)
    assert got == [[]]  # woken, empty-handed
    after, got_after = _take_in_a_thread(c, 4)  # a take after the stop does not wait at all
    after.join(timeout=30)
    assert got_after == [[]]


def test_a_coordinator_stopping_for_a_restart_leases_nothing_and_does_not_say_the_job_is_over() -> None:
    """A generator told "finished" would leave the job; this coordinator's successor has work for it."""
    c = make(n=5)
    channel = c.attach_control("a")
    c.stop("the trainer is restarting", tell_generators=False)
    assert c.lease("a", 3) == protocol.LeaseBatch([], False)
    assert channel.empty()  # no Stop: its stream just ends, and it reconnects to the successor
    c.stop("training finished")  # the last word: now it is over
    assert c.lease("a", 3) == protocol.LeaseBatch([], True)


def test_control_channels_carry_weight_announcements_to_members_only() -> None:
    c = make()
    group = protocol.GroupInfo("127.0.0.1", 1234, 1, 2, 1, "gloo")
    ann = protocol.Announcement(3, 1, (protocol.ParamMeta("w", "float32", (2,)),), 1 << 20)
    assert c.weight_members() == []
    assert not c.announce_weights("a", group, ann)
    channel = c.attach_control("a")
    assert c.weight_members() == ["a"]
    assert c.announce_weights("a", group, ann)
    assert c.request_pull("a", 3)
    assert channel.get(timeout=1) == protocol.WeightUpdate(group, ann)
    assert channel.get(timeout=1) == protocol.PullWeights(3)
    newer = c.attach_control("a")
    assert channel.get(timeout=1) is None  # the older stream is told to end
    c.detach_control("a", channel)  # a late detach of the old stream leaves the new one alone
    assert c.weight_members() == ["a"]
    c.detach_control("a", newer)
    assert c.weight_members() == []
    with pytest.raises(protocol.Refused):
        c.attach_control("stranger")


def test_accounting_is_exact_with_concurrent_generators_and_a_death() -> None:
    n = 120
    c = make(n=n, buffer_groups=8, submit_wait_s=5.0, lease_timeout_s=60.0)
    for g in ("c", "d"):
        c.register(g)
    trained: list[int] = []
    stop = threading.Event()

    def generator(name: str, die_after: int | None) -> None:
        rng = random.Random(name)
        done = 0
        while not stop.is_set():
            try:
                batch = c.lease(name, rng.randint(1, 4), wait_s=0.05)
            except protocol.Refused:
                return  # declared dead
            if batch.finished:
                return
            for lease in batch.leases:
                if die_after is not None and done >= die_after:
                    c.generator_dead(name, "test kill")
                    return
                c.submit(group_for(lease))
                done += 1

    def trainer() -> None:
        step = 0
        while not c.stats().finished:
            groups = c.take(4, timeout_s=0.2)
            trained.extend(g.prompt_id for g in groups)
            step += 1
            c.finish_step(step)
            assert_balanced(c)

    threads = [threading.Thread(target=generator, args=(g, 7 if g == "b" else None)) for g in "abcd"]
    threads.append(threading.Thread(target=trainer))
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    stop.set()
    assert not any(t.is_alive() for t in threads)
    assert sorted(trained) == list(range(n))  # every prompt trained, none twice
    a = assert_balanced(c)
    assert (a.issued, a.trained) == (n, n)


@hypothesis.given(st.lists(st.integers(min_value=-50, max_value=50), max_size=80))
def test_id_ranges_behave_like_a_set(xs: list[int]) -> None:
    r = restart.IdRanges()
    seen: set[int] = set()
    for x in xs:
        assert r.add(x) == (x not in seen)
        seen.add(x)
    assert len(r) == len(seen)
    assert all((x in r) == (x in seen) for x in range(-52, 53))
    ranges = r.ranges()
    assert all(lo <= hi for lo, hi in ranges)
    assert all(h + 1 < lo for (_, h), (lo, _) in itertools.pairwise(ranges))
    assert restart.IdRanges(ranges).ranges() == ranges


def test_a_prompt_budget_leaves_nothing_issued_and_untrained() -> None:
    """The budget is the groups the job's steps take: a batch the lag policy dropped whole (no step)
    is replaced; a prompt dropped from a step that happened used its place in that step."""
    c = make(n=100, prompt_budget=3)
    leases = c.lease("a", 10).leases
    assert len(leases) == 3  # no more than the job will train
    for x in leases:
        assert c.submit(group_for(x)).ok
    taken = c.take(3, timeout_s=0.2)
    c.finish_step(0, dropped=[g.prompt_id for g in taken], stepped=False)  # skipped whole: replaced
    replacements = c.lease("b", 10).leases
    assert len(replacements) == 3
    for x in replacements:
        assert c.submit(group_for(x)).ok
    taken = c.take(3, timeout_s=0.2)
    c.finish_step(1, dropped=[taken[0].prompt_id])  # one dropped from a real step: not replaced
    assert c.lease("b", 10).finished
    a = assert_balanced(c)
    assert (a.issued, a.trained, a.dropped_by_lag, a.outstanding) == (6, 2, 4, 0)
    assert c.stats().finished
    # The restart record keeps what the budget has used.
    again = coordinator.Coordinator(
        prompts(100), coordinator.Config(samples_per_prompt=G, prompt_budget=3), state=c.export_state()
    )
    again.register("a")
    assert again.stats().finished and again.lease("a", 10).leases == []


def test_a_slow_generator_s_newest_leases_migrate_to_its_peers() -> None:
    """Seed 3.3.1: a generator completing well below its peers' rate loses the newest half of its
    leases to the queue (its peers lease them next), and its late results for them are refused; it
    is reported slow, with how long it has been, until a new process takes its name."""
    clock = Clock()
    c = make(n=100, clock=clock, buffer_groups=100)
    c.register("c")
    clock.t += 30  # all three registered long enough ago to be judged
    for gid, done in (("a", 10), ("b", 9), ("c", 2)):  # c completes at a fifth of its peers' rate
        for lease in c.lease(gid, done).leases:
            assert c.submit(group_for(lease)).ok
    held = c.lease("c", 4).leases
    control = c.attach_control("c")
    assert c.migrate_from_slow(threshold=0.2, window_s=30.0) == [
        protocol.Migration("c", 2, pytest.approx(2 / 30), pytest.approx(9.5 / 30))  # type: ignore[arg-type]
    ]
    newest = sorted(held, key=lambda x: int(x.lease_id.rsplit("-", 1)[1]))[2:]
    # It is told to stop decoding them, on its control stream.
    revoke = control.get_nowait()
    assert isinstance(revoke, protocol.Revoke) and revoke.reason == "migrated to its peers"
    assert sorted(revoke.lease_ids) == sorted(x.lease_id for x in newest)
    s = c.stats()
    assert (s.leases_migrated, s.accounting.requeued, s.accounting.leased) == (2, 2, 2)
    late = c.submit(group_for(newest[0]))
    assert late.code is protocol.Code.FAILED_PRECONDITION and "lease migrated" in late.message
    again = c.lease("a", 2).leases  # the migrated prompts come first
    assert {x.prompt.prompt_id for x in again} == {x.prompt.prompt_id for x in newest}
    # Once per window: still slow a moment later, but keeps what it is finishing.
    clock.t += 1
    assert c.migrate_from_slow(threshold=0.2, window_s=30.0) == []
    assert_balanced(c)
    # Slow for 1 s now, without a break (what its controller replaces it by, once long enough).
    (slow,) = c.slow_generators()
    assert (slow.generator, slow.slow_for_seconds, slow.migrated) == ("c", 1.0, 2)
    assert slow.rate == pytest.approx(2 / 30) and slow.peers_median == pytest.approx(9.5 / 30)
    clock.t += 5
    assert c.slow_generators()[0].slow_for_seconds == 6.0
    # A new process under its name is judged afresh; one that catches up is slow no more.
    c.register("c")
    assert c.slow_generators() == []
    clock.t += 31  # the window forgets every completion: nobody has a rate above the others'
    c.migrate_from_slow(threshold=0.2, window_s=30.0)
    assert c.slow_generators() == []


def test_generators_too_new_to_judge_keep_their_leases() -> None:
    clock = Clock()
    c = make(n=20, clock=clock)
    for lease in c.lease("a", 5).leases:
        assert c.submit(group_for(lease)).ok
    c.lease("b", 4)
    assert c.migrate_from_slow(threshold=0.2, window_s=30.0) == []  # registered 0 s ago
    assert c.stats().leases_migrated == 0
