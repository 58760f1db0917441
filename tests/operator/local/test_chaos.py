"""`local.chaos`: `plrl run --chaos SPEC`, parsed, checked against the job, scheduled and applied.

Cases: good specs parse (every kind, both triggers, duration units, spaces, random with and
without a seed); every bad input is refused with a message that quotes the bad item and says what
is wrong; `resolve` refuses unknown targets and steps past `totalSteps`; `random:N` is the same for
a seed, has every kind once N >= 3, keeps its steps within 10%-80% of the run and apart, draws
targets among trainers and generators and its stops and slows from their ranges, and says when a
short run has no room. The schedule (pure, time passed in) fires kills, stops and slows once their
step or time is reached, ends a stop with one SIGCONT, duty-cycles a slow (stopped 3/4 of each
period at 4x), lets no slow toggle end a stop early, forgets a restarted process, stops everything
at the end, and records what it injected. `apply` prints a fault's start and skips what is gone;
on real processes a kill reaches the whole process group, and a stop then a cont freeze and thaw.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pathlib
import signal
import subprocess
import time

import pytest

from plrl_operator.local import chaos

NAMES = ["trainer-0", "generator-0", "generator-1"]
SIGSTOP, SIGCONT, SIGKILL = signal.SIGSTOP, signal.SIGCONT, signal.SIGKILL


def _schedule(text: str, total_steps: int = 100, **kw: float) -> chaos.Schedule:
    return chaos.Schedule(chaos.resolve(chaos.parse(text), NAMES, total_steps), **kw)


def _sigs(actions: list[chaos.Action]) -> list[tuple[str, signal.Signals]]:
    return [(a.target, a.sig) for a in actions]


# ------------------------------------------------------------------ parse


def test_good_specs_parse() -> None:
    plan = chaos.parse(
        "kill:generator-0@step=20, stop:trainer-1@step=40:30s,slow:generator-1@step=10:4x,"
        "slow:generator-0@t=500ms:2.5x,stop:generator-1@t=2m:1.5s,random:5:seed=7"
    )
    kill, stop, slow, slow_t, stop_t = plan.faults
    assert (kill.kind, kill.target, kill.step, kill.at_s) == (chaos.Kind.KILL, "generator-0", 20, None)
    assert (stop.kind, stop.target, stop.step, stop.duration_s) == (chaos.Kind.STOP, "trainer-1", 40, 30.0)
    assert (slow.kind, slow.step, slow.factor) == (chaos.Kind.SLOW, 10, 4.0)
    assert (slow_t.at_s, slow_t.step, slow_t.factor) == (0.5, None, 2.5)
    assert (stop_t.at_s, stop_t.duration_s) == (120.0, 1.5)
    assert stop.source == "stop:trainer-1@step=40:30s"
    assert plan.random == chaos.RandomFaults(count=5, seed=7, source="random:5:seed=7")
    assert chaos.parse("random:3").random == chaos.RandomFaults(count=3, seed=0, source="random:3")
    assert chaos.parse("random:3").faults == ()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("kil:generator-0@step=20", "'kil:generator-0@step=20': unknown kind 'kil' (kill, stop, slow)"),
        ("stop:generator-0@step=5", "'stop:generator-0@step=5': stop needs a duration, e.g. :30s"),
        ("slow:generator-0@step=5", "'slow:generator-0@step=5': slow needs a factor, e.g. :4x"),
        ("slow:generator-0@step=5:1x", "'slow:generator-0@step=5:1x': the factor must be more than 1x"),
        ("slow:generator-0@step=5:0.5x", "the factor must be more than 1x and at most 20x, got 0.5x"),
        ("slow:generator-0@step=5:50x", "at most 20x, got 50x"),
        ("slow:generator-0@step=5:4", "the factor '4' is not a factor; write e.g. 4x"),
        ("kill:generator-0@step=0", "'kill:generator-0@step=0': the step must be at least 1, got 0"),
        ("kill:generator-0@step=-3", "the step must be at least 1, got -3"),
        ("kill:generator-0@step=two", "the step 'two' is not a whole number"),
        ("kill:generator-0@t=0s", "the time must be positive, got '0s'"),
        ("stop:generator-0@t=-5s:3s", "the time must be positive, got '-5s'"),
        ("stop:generator-0@step=5:-30s", "the duration must be positive, got '-30s'"),
        ("stop:generator-0@step=5:0s", "the duration must be positive, got '0s'"),
        (
            "stop:generator-0@step=5:30",
            "the duration '30' is not a duration; write e.g. 30s (units ms, s, m)",
        ),
        ("kill:generator-0@step=5:30s", "'kill:generator-0@step=5:30s': kill takes no argument, got '30s'"),
        ("kill:generator-0", "kill needs a trigger, e.g. kill:generator-0@step=20 or kill:generator-0@t=15s"),
        ("kill:generator-0@", "kill needs a trigger"),
        ("kill@step=3", "'kill@step=3': kill needs a target, e.g. kill:generator-0@step=20"),
        ("kill:@step=3", "'kill:@step=3': kill needs a target"),
        ("kill:Generator_0@step=3", "'Generator_0' is not a process name (e.g. trainer-0, generator-1)"),
        (
            "kill:generator-0@tick=3",
            "unknown trigger 'tick=3' (step=N, or t=15s for seconds since the start)",
        ),
        (
            "kill:generator-0@step=5,,kill:generator-1@step=5",
            "item 2 is empty (a doubled or trailing comma?)",
        ),
        ("kill:generator-0@step=5,", "item 2 is empty"),
        ("", "the spec is empty; e.g. kill:generator-0@step=20"),
        ("  ", "the spec is empty"),
        (
            "kill:generator-0@step=5,kill:generator-0@step=05",
            "'kill:generator-0@step=05': this fault is given twice (as 'kill:generator-0@step=5')",
        ),
        ("random", "'random': random needs a count, e.g. random:5"),
        ("random:0", "'random:0': the count must be at least 1, got 0"),
        ("random:x", "the count 'x' is not a whole number"),
        ("random:3:seed=x", "the seed must be a whole number from 0 to 4294967295, got 'x'"),
        ("random:3:seed=-1", "the seed must be a whole number"),
        ("random:3:sed=1", "unexpected 'sed=1'; random takes random:N or random:N:seed=S"),
        ("random:3:seed=1:x", "unexpected 'x' after the seed"),
        ("random:3@step=4", "random takes no trigger"),
        ("random:3,random:2", "'random:2': random is given twice (already 'random:3')"),
    ],
)
def test_bad_specs_are_refused_naming_the_part(text: str, message: str) -> None:
    with pytest.raises(chaos.ChaosError) as err:
        chaos.parse(text)
    assert str(err.value).startswith("--chaos: ")
    assert message in str(err.value)


# ------------------------------------------------------------------ resolve


def test_resolve_checks_targets_and_steps_against_the_job() -> None:
    plan = chaos.parse("kill:generator-9@step=5")
    with pytest.raises(chaos.ChaosError) as err:
        chaos.resolve(plan, NAMES, 20)
    assert str(err.value) == (
        "--chaos: 'kill:generator-9@step=5': unknown target 'generator-9' "
        "(this job has trainer-0, generator-0, generator-1)"
    )
    with pytest.raises(
        chaos.ChaosError, match=r"'stop:trainer-0@step=40:3s': step 40 is beyond the job's 20"
    ):
        chaos.resolve(chaos.parse("stop:trainer-0@step=40:3s"), NAMES, 20)
    ok = chaos.parse("kill:generator-0@step=20,slow:trainer-0@t=999s:2x")  # the last step; any time
    assert chaos.resolve(ok, NAMES, 20) == list(ok.faults)


def _random(count: int, seed: int, total_steps: int, names: list[str] = NAMES) -> list[chaos.Fault]:
    return chaos.resolve(
        chaos.ChaosPlan(random=chaos.RandomFaults(count=count, seed=seed)), names, total_steps
    )


def test_random_is_the_same_for_a_seed_and_differs_across_seeds() -> None:
    assert _random(6, 3, 200) == _random(6, 3, 200)
    assert _random(6, 3, 200) != _random(6, 4, 200)
    assert chaos.resolve(chaos.parse("random:6:seed=3"), NAMES, 200)[0].source == "random:6:seed=3"


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize(("count", "total_steps"), [(3, 8), (3, 100), (5, 40), (10, 400), (1, 10)])
def test_random_has_every_kind_in_range_and_apart(seed: int, count: int, total_steps: int) -> None:
    names = ["prepare", *NAMES]  # only trainers and generators are targets
    faults = _random(count, seed, total_steps, names)
    assert len(faults) == count
    if count >= 3:
        assert {f.kind for f in faults} == set(chaos.Kind)
    steps = [f.step or 0 for f in faults]
    assert all(max(1, 0.1 * total_steps) <= s <= 0.8 * total_steps for s in steps)
    gaps = [b - a for a, b in itertools.pairwise(steps)]
    assert all(g >= (3 if total_steps >= 40 else 1) for g in gaps)
    for f in faults:
        assert f.target in NAMES and f.at_s is None
        if f.kind is chaos.Kind.STOP:
            assert f.duration_s is not None and 5 <= f.duration_s <= 20
        if f.kind is chaos.Kind.SLOW:
            assert f.factor is not None and 2 <= f.factor <= 4


def test_random_says_when_a_short_run_has_no_room() -> None:
    with pytest.raises(
        chaos.ChaosError, match=r"'random:9': the job's 8 training steps leave room for at most 6"
    ):
        chaos.resolve(chaos.parse("random:9"), NAMES, 8)
    with pytest.raises(chaos.ChaosError, match="no trainer or generator"):
        chaos.resolve(chaos.parse("random:1"), ["prepare"], 8)


# ------------------------------------------------------------------ the schedule (pure)


def test_a_kill_fires_once_when_its_step_is_reached() -> None:
    s = _schedule("kill:generator-0@step=20")
    assert s.due(None, 0.0) == [] and s.due(19, 50.0) == []
    assert s.due(20, 51.0) == [chaos.Action("generator-0", SIGKILL, "chaos: kill generator-0 at step 20")]
    assert s.due(21, 52.0) == [] and s.next_at(52.0) is None
    assert [(i.fault.target, i.step, i.elapsed_s) for i in s.injected] == [("generator-0", 20, 51.0)]


def test_a_fault_records_whether_its_target_was_still_starting() -> None:
    s = _schedule("stop:generator-0@step=2:10s,stop:generator-1@step=2:10s")
    s.due(2, 5.0, starting=lambda target: target == "generator-1")
    assert [(i.fault.target, i.target_starting) for i in s.injected] == [
        ("generator-0", False),
        ("generator-1", True),
    ]


def test_a_step_trigger_fires_when_the_step_jumps_past_it() -> None:
    s = _schedule("kill:generator-0@step=20,kill:generator-1@step=22")
    assert [a.announce for a in s.due(25, 5.0)] == [
        "chaos: kill generator-0 at step 25",
        "chaos: kill generator-1 at step 25",
    ]


def test_a_stop_is_a_sigstop_then_one_sigcont_after_its_duration() -> None:
    s = _schedule("stop:trainer-0@step=40:30s")
    assert s.due(40, 100.0) == [
        chaos.Action("trainer-0", SIGSTOP, "chaos: stop trainer-0 at step 40 for 30s")
    ]
    assert s.next_at(100.0) == 130.0
    assert s.due(41, 129.0) == []
    assert s.due(41, 130.0) == [chaos.Action("trainer-0", SIGCONT)]
    assert s.due(42, 200.0) == [] and s.next_at(200.0) is None


def test_a_time_trigger_counts_seconds_since_the_start() -> None:
    s = _schedule("stop:generator-1@t=15s:2s")
    assert s.next_at(0.0) == 15.0
    assert s.due(None, 14.9) == []
    assert s.due(None, 15.0) == [
        chaos.Action("generator-1", SIGSTOP, "chaos: stop generator-1 at t=15.0s for 2s")
    ]
    assert s.due(None, 17.0) == [chaos.Action("generator-1", SIGCONT)]


def test_a_slow_is_stopped_three_quarters_of_each_period_at_4x() -> None:
    s = _schedule("slow:generator-1@step=10:4x", period_s=0.2)
    start = s.due(10, 5.0)
    assert start == [chaos.Action("generator-1", SIGSTOP, "chaos: slow generator-1 at step 10 by 4x")]
    assert s.next_at(5.0) == pytest.approx(5.15)  # stopped 0.15 s, then runs 0.05 s
    assert _sigs(s.due(10, 5.1)) == []
    assert _sigs(s.due(10, 5.15)) == [("generator-1", SIGCONT)]
    assert s.next_at(5.15) == pytest.approx(5.2)
    assert _sigs(s.due(11, 5.2)) == [("generator-1", SIGSTOP)]
    # Ticks every 5 ms for 2 s (as a runner waking at `next_at` would): the stopped share is 3/4.
    stopped, t, stopped_s = True, 5.2, 0.0
    while t < 7.2:
        for a in s.due(11, t):
            assert a.announce == "" and a.sig == (SIGCONT if stopped else SIGSTOP)  # only transitions
            stopped = a.sig == SIGSTOP
        t += 0.005
        stopped_s += 0.005 if stopped else 0.0
    assert stopped_s / 2.0 == pytest.approx(0.75, abs=0.02)


def test_a_stop_on_a_slowed_process_is_not_ended_by_the_slow() -> None:
    s = _schedule("slow:generator-0@t=1s:4x,stop:generator-0@t=2.16s:1s", period_s=0.2)
    s.due(None, 1.0)
    assert _sigs(s.due(None, 2.15)) == [("generator-0", SIGCONT)]  # the slow's running part
    assert _sigs(s.due(None, 2.16)) == [("generator-0", SIGSTOP)]  # the stop starts
    for t in (2.2, 2.35, 2.4, 2.55, 3.0):  # the slow would toggle here; the stop holds it
        assert s.due(None, t) == []
    assert _sigs(s.due(None, 3.16)) == [("generator-0", SIGCONT)]  # stop over, slow running part
    assert _sigs(s.due(None, 3.21)) == [("generator-0", SIGSTOP)]  # and the slow goes on


def test_forget_ends_the_faults_of_a_restarted_process() -> None:
    s = _schedule("slow:generator-0@step=5:4x,stop:trainer-0@step=5:60s,kill:generator-0@step=9")
    s.due(5, 10.0)
    assert s.forget("generator-0") == [chaos.Action("generator-0", SIGCONT)]
    assert s.forget("generator-0") == []
    assert _sigs(s.due(6, 10.16)) == []  # no slow toggles any more, the stop on trainer-0 holds
    assert _sigs(s.due(9, 11.0)) == [("generator-0", SIGKILL)]  # faults still to come still fire
    assert _sigs(s.due(9, 70.0)) == [("trainer-0", SIGCONT)]


def test_a_kill_ends_the_slow_on_its_process() -> None:
    s = _schedule("slow:generator-0@step=5:4x,kill:generator-0@step=6")
    s.due(5, 10.0)
    assert _sigs(s.due(6, 10.05)) == [("generator-0", SIGKILL)]
    assert s.due(7, 10.16) == [] and s.forget("generator-0") == [] and s.next_at(10.2) is None


def test_end_continues_every_stopped_process_and_injects_no_more() -> None:
    s = _schedule("stop:trainer-0@step=5:60s,slow:generator-1@step=5:3x,kill:generator-0@step=50")
    s.due(5, 1.0)
    assert _sigs(s.end()) == [("generator-1", SIGCONT), ("trainer-0", SIGCONT)]
    assert s.due(60, 100.0) == [] and s.next_at(100.0) is None
    assert [i.fault.kind for i in s.injected] == [chaos.Kind.STOP, chaos.Kind.SLOW]


def test_a_random_schedule_fires_every_fault_over_the_run() -> None:
    faults = chaos.resolve(chaos.parse("random:6:seed=1"), NAMES, 60)
    s = chaos.Schedule(faults)
    starts = [a for step in range(1, 61) for a in s.due(step, float(step)) if a.announce]
    assert len(starts) == 6 and [i.fault for i in s.injected] == faults


# ------------------------------------------------------------------ apply (I/O)


def test_apply_prints_a_fault_start_and_skips_what_is_not_running(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[tuple[int, signal.Signals]] = []

    def killpg(pid: int, sig: signal.Signals) -> None:
        sent.append((pid, sig))
        raise ProcessLookupError  # gone already: ignored

    monkeypatch.setattr(os, "killpg", killpg)
    chaos.apply(
        chaos.Action("generator-0", SIGKILL, "chaos: kill generator-0 at step 20"), {"generator-0": 42}.get
    )
    chaos.apply(chaos.Action("generator-0", SIGCONT), {"generator-0": 42}.get)
    nothing: dict[str, int] = {}
    chaos.apply(chaos.Action("generator-1", SIGKILL, "chaos: kill generator-1 at step 20"), nothing.get)
    assert sent == [(42, SIGKILL), (42, SIGCONT)]
    assert capsys.readouterr().out.splitlines() == [
        "chaos: kill generator-0 at step 20",
        "chaos: kill generator-1 at step 20 (generator-1 is not running)",
    ]


def _state(pid: int) -> str | None:
    """The process's state letter from /proc (R, S, T, Z...), None once it is gone."""
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return None


def _wait_state(pid: int, ok: set[str | None], timeout: float = 1.0) -> str | None:
    deadline = time.monotonic() + timeout
    while (state := _state(pid)) not in ok and time.monotonic() < deadline:
        time.sleep(0.01)
    return state


def test_a_kill_reaches_the_whole_process_group() -> None:
    with subprocess.Popen(
        ["sh", "-c", "sleep 30 & echo $!; wait"], stdout=subprocess.PIPE, start_new_session=True
    ) as proc:
        try:
            assert proc.stdout is not None
            child = int(proc.stdout.readline())  # sleep, in the group that sh leads
            chaos.apply(chaos.Action("generator-0", SIGKILL), {"generator-0": proc.pid}.get)
            assert proc.wait(timeout=5) == -SIGKILL
            assert _wait_state(child, {None, "Z"}) in {None, "Z"}  # dead (a zombie until reaped)
        finally:
            _kill_group(proc.pid)


def test_a_stop_freezes_a_process_and_a_cont_thaws_it() -> None:
    with subprocess.Popen(["sleep", "30"], start_new_session=True) as proc:
        try:
            pid_of = {"trainer-1": proc.pid}.get
            chaos.apply(chaos.Action("trainer-1", SIGSTOP, "chaos: stop trainer-1 at step 4 for 1s"), pid_of)
            assert _wait_state(proc.pid, {"T"}) == "T"
            chaos.apply(chaos.Action("trainer-1", SIGCONT), pid_of)
            assert _wait_state(proc.pid, {"S", "R"}) in {"S", "R"}
            assert proc.poll() is None  # stopped and continued, not killed
        finally:
            _kill_group(proc.pid)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, SIGKILL)
