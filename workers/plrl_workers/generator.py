"""The generator role: keep H sequences in flight, score them, stream rollouts, take weights in flight.

One process per generator pod (`plrl-worker --role generator --config /etc/plrl/generator.json`).
The main loop drives its engine one decode step at a time; between steps it

- applies weight updates announced on the coordinator's control stream (the engine joins the
  trainer's broadcast group and loads the new version in place: in-flight sequences keep their KV
  cache, and tokens decoded from then on carry the new version),
- refills free slots with the G samples of newly leased prompts (continuous batching), and
- scores finished samples and, once all G samples of a prompt are in, puts the group on the
  rollout stream (which re-sends on backpressure).

Leasing stops while too many groups wait for the coordinator (its buffer is full), so a generator
never runs far ahead of the trainers; the control stream is still served meanwhile, so a weight
broadcast never waits on a generator stuck in backpressure.

When its coordinator goes away (trainer rank 0 died or restarted: the control stream breaks, a
lease call is UNAVAILABLE, and no Stop came) the generator keeps its process and its model: it drops
what it was decoding (the restarted coordinator re-queues those prompts from its checkpoint), waits
for the coordinator to listen again, registers anew (a new incarnation) and loads the weights of the
version the trainer resumed at, older ones included. A generator exits 0 only when its work is done
(the coordinator said stop, or no prompt is left to lease) or when it was asked to stop (SIGTERM: it
leases nothing more, finishes what it decodes within a bound and delivers it, `FINISH_IN_FLIGHT_S`);
one the coordinator forgot (declared dead, or displaced by a flood of registrations before it
started) registers again; one that was replaced (fenced: another process registered under its id)
exits `names.EXIT_RESTART_ME`, so its controller (the kubelet, `plrl run`) starts it again: an exit 0
would read as a normal finish and leave the job without that generator.

Neighbours: `engines/` (decoding), `rpc/client.py` + `rpc/rollout_stream.py` (coordinator),
`tasks/rewards.py` (scoring), `metrics.py` (/metrics), `heartbeat.py` (the pod's Lease in a cluster),
`lifecycle.py` (in a pod, waits for SIGTERM once the work is done), `plrl_api.worker_config` (settings).
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from plrl_api import identity, names, records, worker_config
from plrl_api import spec as spec_mod
from plrl_workers import heartbeat, lifecycle, metrics, protocol
from plrl_workers.engines import base as engines
from plrl_workers.engines import factory
from plrl_workers.rpc import client as client_mod
from plrl_workers.rpc import rollout_stream
from plrl_workers.tasks import base as tasks
from plrl_workers.tasks import rewards
from plrl_workers.weight_sync import groups

log = logging.getLogger("plrl.generator")
_T = TypeVar("_T")

# Groups waiting for the coordinator before this generator stops leasing more prompts (at most; see
# `max_unacked_groups`).
MAX_UNACKED_GROUPS = 8
PULL_WAIT_S, PULL_RETRY_S = 120.0, 0.5  # how long a pull waits for weights that are not published yet
SESSION_CHECK_S = 2.0
"""How often a refused pull asks the coordinator whether it is still the one registered with."""

# Asked to stop (SIGTERM), a generator waits this long for the coordinator to take the groups it
# still holds. A stalled trainer would keep refusing them (full buffer) for ever; their leases expire
# and the prompts are leased again, so nothing is lost by giving up.
STOP_DRAIN_S = 5.0
# Asked to stop while its coordinator stays (it leaves a job that goes on: a scale-down, a deleted
# pod), a generator first decodes what it has in flight for up to this long, leasing nothing new:
# what finishes is delivered and trained, what does not goes back to the queue. With STOP_DRAIN_S
# below `lifecycle.TERM_GRACE_S`, so a generator never has to be killed to leave.
FINISH_IN_FLIGHT_S = 10.0
# When its coordinator goes away (trainer rank 0 restarts: a failover, or the elastic restart of a
# change of I), a generator decodes what it has in flight for up to this long before it reconnects,
# and delivers the finished groups to the successor under new leases (`_adopt_held`). The successor
# takes at least a few seconds to come back (seen: ~11 s for a CPU job's elastic restart), so this
# work is mostly done while nothing else could be.
CARRY_OVER_S = 30.0


class _Gone:
    """On the event queue: the control stream broke (the coordinator went away), as opposed to
    None, the coordinator closing it (this generator was replaced or declared dead)."""


_GONE = _Gone()
# A lease refused because the coordinator went away: how long to wait for the Stop that says the job
# ended (the trainer sends it just before its server stops) before taking it as the coordinator lost.
LOST_STOP_WAIT_S = 2.0
LEASE_RETRY_S = 0.5
"""How long a generator waits before asking again when the coordinator refuses a lease at its bound."""
REGISTER_WAIT_S, REGISTER_RETRY_S = 600.0, 0.5  # registrations refused at the coordinator's bounds
# What a call answers when the coordinator went away (killed: UNAVAILABLE; its server stopping:
# CANCELLED) or is at its bound on open calls (RESOURCE_EXHAUSTED): ask again, not crash.
_RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.RESOURCE_EXHAUSTED)


@dataclasses.dataclass
class _Group:
    lease: protocol.Lease
    samples: dict[int, protocol.Sample] = dataclasses.field(default_factory=dict)


class Generator:
    """The main loop of one generator. `run()` returns when the job is over or `stop()` is called."""

    def __init__(
        self,
        generator_id: str,
        engine: engines.GenerationEngine,
        coord: client_mod.CoordinatorClient,
        tokenizer: Any,
        reward_fn: rewards.RewardFn,
        params: engines.SamplingParams,
        samples_per_prompt: int,
        worker_metrics: metrics.WorkerMetrics | None = None,
        max_unacked_groups: int = MAX_UNACKED_GROUPS,
    ) -> None:
        self.generator_id = generator_id
        self.engine = engine
        self.coord = coord
        self.tokenizer = tokenizer
        self.reward_fn = reward_fn
        self.params = params
        self.g = samples_per_prompt
        self.metrics = worker_metrics
        self.max_unacked_groups = max_unacked_groups
        self._events: queue.SimpleQueue[protocol.ControlEvent | _Gone | None] = queue.SimpleQueue()
        self._groups: dict[str, _Group] = {}
        # Groups finished after the coordinator went away: delivered to its successor if it adopts them.
        self._held: list[protocol.RolloutGroup] = []  # under _delivery_lock (results arrive on a thread)
        self.adopted = 0  # held groups the successor took
        # Groups sent and not answered yet, by lease id: a coordinator that goes away meanwhile may
        # never have taken them, so they are held for its successor too.
        self._unacked: dict[str, protocol.RolloutGroup] = {}
        self._delivery_lock = threading.Lock()
        self._stop = threading.Event()
        self._source_finished = False
        self._told_to_stop = False
        self._lost = ""  # why this generator cannot go on (empty: it can)
        self._gone = ""  # why the coordinator is gone (empty: it is not): reconnect
        # Set by the control stream's reader when the stream broke: read by a pull in progress,
        # which would otherwise wait for a version the coordinator's successor may never publish.
        self._down = threading.Event()
        self._session = ""  # the coordinator's this generator registered with
        self.reconnects = 0
        self._in_weight_group = False
        self.refused = 0
        self.revoked = 0  # leases the coordinator took back while this generator decoded them
        # Said once each (at INFO) because they mark a joining generator's way in: its first
        # rollout taken, and the first version it received in flight rather than pulled.
        self._delivered_one = False
        self._received_in_flight = False

    # -------------------------------------------------------------- control

    def stop(self) -> None:
        self._stop.set()

    @property
    def stopped(self) -> threading.Event:
        """Set by `stop()` (SIGTERM)."""
        return self._stop

    @property
    def lost(self) -> str:
        """Why the run ended without the job being done: "" if it was done or asked to stop."""
        return self._lost

    @property
    def work_done(self) -> bool:
        """The job needs nothing more from this generator: every prompt is leased, or the coordinator
        said stop (not merely that the control stream closed: then the coordinator may come back)."""
        return self._source_finished or self._told_to_stop

    def _pump_control(self, stream: client_mod.ControlStream) -> None:
        try:
            for event in stream:
                self._events.put(event)
        except grpc.RpcError as err:
            if not stream.cancelled_here:
                # Broken (UNAVAILABLE: the process died; CANCELLED: its server stopped), not closed
                # by the coordinator.
                log.warning("control stream broke: %s", err.code())
                self._down.set()
                self._events.put(_GONE)
                return
        self._events.put(None)

    def _handle_events(self) -> bool:
        """Apply every queued control event; False when the job told us to stop."""
        while True:
            try:
                event = self._events.get_nowait()
            except queue.Empty:
                return True
            if event is _GONE:
                self._gone = "its control stream broke"
                return False
            if event is None or isinstance(event, protocol.Stop):
                log.info("stopping: %s", "control stream closed" if event is None else event.reason)
                self._told_to_stop = event is not None
                if event is None and not self._stop.is_set():
                    self._lost = "the coordinator's control stream ended without a Stop"
                return False
            if isinstance(event, protocol.WeightUpdate):
                self._receive(event)
            elif isinstance(event, protocol.PullWeights):
                self._pull(event.version)
            elif isinstance(event, protocol.Revoke):
                self._revoke(event)

    def _revoke(self, event: protocol.Revoke) -> None:
        """Stop decoding leases the coordinator took back: their results would be refused, and the
        slots they hold are better spent on the leases this generator kept."""
        revoked = [lease_id for lease_id in event.lease_ids if lease_id in self._groups]
        for lease_id in revoked:
            for j in range(self.g):
                self.engine.abort(f"{lease_id}#{j}")  # finished samples are ignored by the engine
            del self._groups[lease_id]
        self.revoked += len(revoked)
        if revoked:
            log.info("stopped decoding %d lease(s): %s", len(revoked), event.reason)

    def _stop_was_sent(self, wait_s: float) -> bool:
        """Whether the control stream says Stop within `wait_s` (other events are dropped: the
        coordinator is gone). Sets `work_done` if it does."""
        deadline = time.monotonic() + wait_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                event = self._events.get(timeout=left)
            except queue.Empty:
                return False
            if event is None or event is _GONE:
                return False
            if isinstance(event, protocol.Stop):
                log.info("stopping: %s", event.reason)
                self._told_to_stop = True
                return True
        return False

    def _receive(self, event: protocol.WeightUpdate) -> None:
        if event.announcement.version < self.engine.weight_version:
            # Re-announced after an epoch this generator left: it pulled a newer version since.
            # Not joining costs the broadcaster one join timeout; it then goes on without us.
            log.warning(
                "weight v%d announced, but v%d is loaded already: not joining that broadcast",
                event.announcement.version,
                self.engine.weight_version,
            )
            return
        t0 = time.perf_counter()
        try:
            self.engine.join_weight_group(event.group)
            self._in_weight_group = True
            self.engine.receive_weights(event.announcement)
        except RuntimeError as err:
            # Aborted before any tensor (GroupAborted): the weights are intact, and the broadcaster
            # re-announces the version in a new epoch within the same call, or (if it left us out)
            # asks for a pull once it has published it. Pulling now would block this loop on a
            # version not yet published while the re-announcement waits for us: both sides would sit
            # out the join timeout. Failed midway: the weights may be a mix of two versions, so load
            # a full set first.
            midway = not isinstance(err, groups.GroupAborted)
            then = "; pulling" if midway else ""
            log.warning("weight version %d not received (%s)%s", event.announcement.version, err, then)
            self.engine.leave_weight_group()
            self._in_weight_group = False
            if midway:
                self._pull(event.announcement.version)
            return
        if self.metrics is not None:
            self.metrics.weight_version.set(self.engine.weight_version)
            self.metrics.weight_sync_seconds.observe(time.perf_counter() - t0)
        if not self._received_in_flight:
            self._received_in_flight = True
            log.info("in the weight-sync group: weights v%d applied in flight", self.engine.weight_version)
        else:
            log.debug("weights v%d applied in flight", self.engine.weight_version)

    def _pull(self, version: int, exact: bool = False) -> None:
        """Load the full weights of `version` or newer (`exact`: also when older than the engine's)."""
        if version <= self.engine.weight_version and version != 0 and not exact:
            return
        asked_session_at = -SESSION_CHECK_S

        def abandon(err: grpc.RpcError) -> bool:
            nonlocal asked_session_at
            if self._stop.is_set():
                return True  # asked to stop (SIGTERM): the loop ends before it decodes again
            # Without a control stream yet (still starting) only the session tells whether the
            # coordinator was replaced; asking it on every retry would double the calls.
            replaced = False
            if time.monotonic() - asked_session_at >= SESSION_CHECK_S:
                asked_session_at = time.monotonic()
                replaced = self._coordinator_replaced()
            if self._down.is_set() or replaced:
                # The coordinator that asked for `version` is gone; its successor (resumed from a
                # checkpoint) may be older and never publish it: reconnect and take its weights.
                self._gone = f"it went away while weights v{version} were pulled"
                return True
            return False

        # A trainer that resumed from a checkpoint registers generators at its weight version a
        # moment before it has published those weights: UNAVAILABLE, so wait and ask again.
        pulled = self._retrying(
            lambda: self.coord.pull_weights(self.generator_id, min_version=version),
            "pull",
            PULL_WAIT_S,
            PULL_RETRY_S,
            abandon,
        )
        if pulled is None:
            return
        self.engine.update_weights(pulled.named_tensors, pulled.version)
        log.info("pulled full weights v%d", pulled.version)

    def _coordinator_replaced(self) -> bool:
        """Whether the coordinator answering now is another than the one this generator registered
        with (trainer rank 0 restarted). False while none answers: it may still come back."""
        try:
            return self.coord.status().session != self._session
        except grpc.RpcError:
            return False

    # -------------------------------------------------------------- rollouts

    def _on_result(self, result: protocol.SubmitResult) -> None:
        with self._delivery_lock:
            group = self._unacked.pop(result.lease_id, None)
            if group is not None and result.code is protocol.Code.UNAVAILABLE:
                # Refused by a coordinator that is stopping (the trainer restarts): its successor
                # may take the group (`_adopt_held`).
                self._held.append(group)
        if result.ok and not self._delivered_one:
            self._delivered_one = True
            log.info("first rollout group taken by the coordinator")
        if not result.ok:
            # The coordinator keeps the prompt (re-queued or already done), so nothing is lost;
            # say so loudly because it means this generator's view of the lease was stale.
            self.refused += 1
            log.warning(
                "rollout for lease %s refused: %s %s", result.lease_id, result.code.name, result.message
            )

    def _fill(self, capacity: int) -> int:
        """Lease prompts for the free slots; returns how many were leased."""
        free_prompts = (capacity - self.engine.num_in_flight()) // self.g
        with self._delivery_lock:
            backlog = len(self._unacked)
        if free_prompts <= 0 or backlog >= self.max_unacked_groups or self._source_finished:
            return 0
        idle = self.engine.num_in_flight() == 0
        try:
            batch = self.coord.lease_prompts(self.generator_id, free_prompts, wait_s=0.5 if idle else 0.0)
        except grpc.RpcError as err:
            code = err.code()
            if code is grpc.StatusCode.FAILED_PRECONDITION:
                # Fenced: replaced by a newer registration of this id. Nothing this process still
                # holds will be accepted; its prompts were re-queued.
                self._lost = f"the coordinator refused this generator: {err.details()}"
            elif code is grpc.StatusCode.NOT_FOUND:
                # Forgotten, not replaced (displaced by a flood of registrations while it was still
                # pulling its first weights, or declared dead): register again, as after a restart.
                self._gone = f"the coordinator forgot this generator ({err.details()})"
            elif code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                # The coordinator went away: either the job is ending (its Stop is on the control
                # stream, or about to be) or trainer rank 0 died.
                if not self._stop_was_sent(LOST_STOP_WAIT_S):
                    self._gone = f"a lease request failed ({code.name})"
            elif code is grpc.StatusCode.RESOURCE_EXHAUSTED:
                # The coordinator is at its bound on open calls (`rpc/limits.py`: someone holds
                # many): wait a moment (this delays the next decode step too), then decode what is
                # in flight and ask again.
                log.warning("lease request refused, retrying: %s", err.details())
                time.sleep(LEASE_RETRY_S)
            else:
                raise
            return 0
        self._source_finished = batch.finished and not batch.leases
        for lease in batch.leases:
            self._groups[lease.lease_id] = _Group(lease)
            ids = list(lease.prompt.token_ids)
            for j in range(self.g):
                # Distinct, reproducible seeds per sample, so the G samples of a prompt differ.
                seed = (
                    None
                    if self.params.seed is None
                    else _sample_seed(self.params.seed, lease.prompt.prompt_id, j)
                )
                self.engine.add_request(
                    f"{lease.lease_id}#{j}", ids, dataclasses.replace(self.params, seed=seed)
                )
        return len(batch.leases)

    def _collect(
        self, finished: list[engines.FinishedSequence], stream: rollout_stream.RolloutStream | None
    ) -> None:
        """Score finished sequences; a prompt's group, once whole, goes on `stream`, or is held for
        the coordinator's successor when there is none (None) or it broke."""
        for seq in finished:
            lease_id, _, j = seq.request_id.rpartition("#")
            group = self._groups.get(lease_id)
            if group is None:
                continue
            prompt = group.lease.prompt
            text = tasks.completion_text(self.tokenizer, seq.token_ids)
            reward = rewards.score(self.reward_fn, prompt.text, text, prompt.answer)
            group.samples[int(j)] = protocol.Sample(
                token_ids=seq.token_ids,
                logprobs=seq.logprobs,
                versions=seq.versions,
                reward=reward,
                finish_reason=seq.finish_reason,
            )
            if self.metrics is not None:
                self.metrics.add_generated_tokens(len(seq.token_ids))
                self.metrics.reward.set(reward)
            if len(group.samples) == self.g:
                del self._groups[lease_id]
                whole = protocol.RolloutGroup(
                    lease_id=lease_id,
                    prompt_id=prompt.prompt_id,
                    prompt_token_ids=list(prompt.token_ids),
                    samples=[group.samples[k] for k in range(self.g)],
                    generator_id=self.generator_id,
                )
                if stream is None or stream.error is not None:
                    # The coordinator is gone; its successor re-queues the prompt, and may adopt this.
                    if stream is not None:
                        self._gone = "the rollout stream broke"
                    with self._delivery_lock:
                        self._held.append(whole)
                    continue
                with self._delivery_lock:
                    self._unacked[whole.lease_id] = whole
                stream.put(whole)

    # -------------------------------------------------------------- main loop

    def start(self) -> bool:
        """Register, catch up on weights, open the control and rollout streams. False when asked to
        stop meanwhile, or (with `gone` set) when the coordinator went away meanwhile: nothing is
        open then, and `run` reconnects or returns."""
        self._down.clear()  # a new session: the last one's stream was closed by `close()`
        reg = self._register()
        if reg is None:
            return False
        self._session = reg.session
        if reg.samples_per_prompt != self.g:
            raise RuntimeError(
                f"coordinator expects {reg.samples_per_prompt} samples per prompt, this generator {self.g}"
            )
        if reg.weight_version > self.engine.weight_version:
            self._pull(reg.weight_version)
        elif reg.weight_version < self.engine.weight_version:
            # A coordinator that resumed from an earlier checkpoint: decode with its weights (the
            # engine is idle after a reconnect, so it may go back a version).
            self._pull(reg.weight_version, exact=True)
        if self._gone or self._stop.is_set():
            return False
        self._control = self.coord.control(self.generator_id)
        threading.Thread(
            target=self._pump_control, args=(self._control,), daemon=True, name="control"
        ).start()
        self._stream = rollout_stream.RolloutStream(self.coord, on_result=self._on_result)
        return True

    def _register(self) -> protocol.Registration | None:
        """None when asked to stop while registrations are refused."""
        # Refused at its bound on open calls, or on registered generators that all work (someone
        # floods it, or a generator that is leaving still holds its place), or it died during the
        # call (a listening successor is waited for): ask again.
        return self._retrying(
            lambda: self.coord.register(self.generator_id),
            "registration",
            REGISTER_WAIT_S,
            REGISTER_RETRY_S,
            lambda err: self._stop.is_set(),
        )

    def _retrying(
        self,
        call: Callable[[], _T],
        what: str,
        wait_s: float,
        retry_s: float,
        abandon: Callable[[grpc.RpcError], bool],
    ) -> _T | None:
        """`call()`, asked again every `retry_s` while the coordinator refuses it with a retryable
        code, for up to `wait_s`; None once `abandon(refusal)` says the answer is no longer wanted."""
        deadline = time.monotonic() + wait_s
        warned = False
        while True:
            try:
                return call()
            except grpc.RpcError as err:
                if abandon(err):
                    return None
                if err.code() not in _RETRYABLE or time.monotonic() > deadline:
                    raise
                if not warned:
                    log.warning("%s refused, asking again for up to %.0f s: %s", what, wait_s, err.details())
                    warned = True
                time.sleep(retry_s)

    def _decode(self, deliver: bool = True) -> None:
        """One engine step; finished groups are delivered (or, `deliver` False, held)."""
        t0 = time.perf_counter()
        finished = self.engine.step()
        if self.metrics is not None:
            dt = time.perf_counter() - t0
            self.metrics.step_seconds.observe(dt)
            self.metrics.add_decoding_seconds(dt)
            self.metrics.in_flight.set(self.engine.num_in_flight())
        self._collect(finished, self._stream if deliver else None)

    def run(self, capacity: int) -> None:
        """Pipeline mode: decode until the job stops (or the prompt source is exhausted), through
        restarts of the coordinator."""
        while True:
            self._run_session(capacity)
            if not self._gone or self._stop.is_set() or self._lost:
                return
            log.warning("the coordinator is gone (%s); reconnecting", self._gone)
            self._carry_over()
            self._reset_session()
            # A coordinator that refuses this generator's streams at once (at its bound on open
            # calls) would otherwise be asked to register again in a tight loop.
            self._stop.wait(REGISTER_RETRY_S)

    def _carry_over(self) -> None:
        """The coordinator is gone: decode what is in flight (for at most `CARRY_OVER_S`, leasing
        nothing) and hold the groups that finish for its successor."""
        left = self.engine.num_in_flight()
        if left == 0 or self._stop.is_set():
            return
        log.info(
            "decoding the %d sequence(s) in flight while the coordinator is away (at most %.0f s)",
            left,
            CARRY_OVER_S,
        )
        deadline = time.monotonic() + CARRY_OVER_S
        while self.engine.num_in_flight() > 0 and time.monotonic() < deadline and not self._stop.is_set():
            self._decode(deliver=False)

    def _adopt_held(self) -> None:
        """Deliver the groups finished for the previous coordinator to this one, under leases of
        their prompts (which it re-queued from its checkpoint). Those decoded with weights newer
        than its own (it resumed from an earlier checkpoint) would be refused, and those whose
        prompts it already leased again, trained or dropped are not wanted: they are let go, and
        nothing is lost (the prompt is decoded again, or its work is done)."""
        with self._delivery_lock:
            held, self._held = self._held, []
        if not held:
            return
        version = self.engine.weight_version
        usable = [g for g in held if all(int(s.versions.max(initial=0)) <= version for s in g.samples)]
        leases: list[protocol.Lease] = []
        if usable:
            try:
                batch = self.coord.lease_prompts(
                    self.generator_id, len(usable), prompt_ids=[g.prompt_id for g in usable]
                )
                leases = batch.leases
            except grpc.RpcError as err:
                log.warning(
                    "could not deliver the groups finished while the coordinator was away: %s", err.code()
                )
        lease_of = {lease.prompt.prompt_id: lease.lease_id for lease in leases}
        for g in usable:
            if g.prompt_id in lease_of:
                adopted = dataclasses.replace(g, lease_id=lease_of[g.prompt_id])
                with self._delivery_lock:
                    self._unacked[adopted.lease_id] = adopted
                self._stream.put(adopted)
        self.adopted += len(lease_of)
        log.info(
            "%d group(s) finished while the coordinator was away: %d delivered to its successor, "
            "%d decoded with weights newer than its v%d, %d whose prompts it does not keep for this "
            "generator (given out again, or leased after its checkpoint): decoded again, nothing lost",
            len(held),
            len(lease_of),
            len(held) - len(usable),
            version,
            len(usable) - len(lease_of),
        )

    def _reset_session(self) -> None:
        """Forget a session whose coordinator is gone: what still decodes for it is dropped (its
        successor re-queues those prompts; finished groups are held, `_adopt_held`), and the next
        `start()` registers anew."""
        for lease_id in list(self._groups):
            for j in range(self.g):
                self.engine.abort(f"{lease_id}#{j}")
        self._groups.clear()
        with self._delivery_lock:
            self._held += self._unacked.values()  # never answered: the successor may take them
            self._unacked.clear()
        while True:
            try:
                self._events.get_nowait()
            except queue.Empty:
                break
        self._gone = ""
        self._source_finished = False
        self.reconnects += 1

    def _run_session(self, capacity: int) -> None:
        if not self.start():
            return
        try:
            self._adopt_held()
            while not self._stop.is_set():
                if not self._handle_events():
                    break
                self._fill(capacity)
                if self._lost or self._gone or self._told_to_stop:
                    break
                if self.engine.num_in_flight() == 0:
                    if self._source_finished:
                        break
                    time.sleep(0.01)  # waiting on leases (backpressure or an empty queue)
                    continue
                self._decode()
            if self._stop.is_set():
                self._finish_in_flight()
        finally:
            self.close()

    def _finish_in_flight(self) -> None:
        """Asked to stop: decode the sequences in flight, for at most `FINISH_IN_FLIGHT_S`, without
        leasing more. Ends early when the coordinator goes (the job is stopping as a whole: its
        successor re-queues those prompts) or tells this generator to stop."""
        deadline = time.monotonic() + FINISH_IN_FLIGHT_S
        left = self.engine.num_in_flight()
        if left == 0 or self._gone or self._lost:
            return
        log.info(
            "asked to stop: finishing %d sequence(s) in flight (at most %.0f s)", left, FINISH_IN_FLIGHT_S
        )
        while self.engine.num_in_flight() > 0 and time.monotonic() < deadline:
            if not self._handle_events() or self._gone or self._lost:
                return
            self._decode()
        if self.engine.num_in_flight() > 0:
            log.info(
                "%d sequence(s) still in flight after %.0f s: their prompts go back to the queue",
                self.engine.num_in_flight(),
                FINISH_IN_FLIGHT_S,
            )

    def generate_round(self, capacity: int) -> None:
        """Conventional mode: decode until no prompt is left to lease and every group is delivered."""
        self._source_finished = False  # the coordinator opens a new round's budget before each call
        while not self._stop.is_set():
            if not self._handle_events():
                return
            leased = self._fill(capacity)
            if self._lost or self._gone or self._told_to_stop:
                return
            if self.engine.num_in_flight() == 0:
                with self._delivery_lock:
                    delivered = not self._unacked
                if leased == 0 and delivered:
                    return
                time.sleep(0.01)
                continue
            self._decode()

    def heartbeat_report(self, capacity: int) -> records.WorkerReport:
        """Weight version, tokens/s, groups awaiting the coordinator and slots in use (another thread)."""
        with self._delivery_lock:
            backlog = len(self._unacked)
        return heartbeat.generator_report(
            weight_version=self.engine.weight_version,
            tokens_per_second=self.metrics.generated_tokens_per_second() if self.metrics else 0.0,
            capacity_tokens_per_second=self.metrics.generated_tokens_per_decoding_second()
            if self.metrics
            else None,
            in_flight=self.engine.num_in_flight(),
            capacity=capacity,
            queue_depth=backlog,
        )

    def close(self) -> None:
        # Deliver what is finished first: closing the control stream tells the coordinator this
        # generator is gone, and it re-queues whatever is still leased to it.
        leaving = self._stop.is_set() or self._lost or self._gone
        self._stream.close(timeout_s=STOP_DRAIN_S if leaving else None)
        self._control.cancel()
        if self._in_weight_group:
            self.engine.leave_weight_group()
            self._in_weight_group = False


def build(
    cfg: worker_config.WorkerConfig,
    ident: identity.Identity,
    *,
    name: str | None = None,
    gpus: int | None = None,
) -> tuple[Generator, int]:
    """The generator of this pod and its capacity (H per accelerator x accelerators per pod).

    Conventional mode builds one per trainer rank (`name`, one accelerator each).
    """
    import transformers

    spec = cfg.spec
    model_dir = cfg.paths.model_dir
    tp = spec.resources.gpus_per_generator if gpus is None else gpus
    capacity = spec.generation.concurrent_sequences * tp
    options = engines.EngineOptions(
        model_dir=model_dir,
        max_concurrent=capacity,
        max_model_len=spec.generation.max_model_len,
        dtype=spec.model.dtype,
        device=_device(),
        seed=spec.training.seed + 1000 * (ident.pod_index + 1),
        gpu_memory_utilization=spec.generation.gpu_memory_utilization,
        tensor_parallel_size=tp,
    )
    engine = factory.generation_engine(spec.generation.engine, options)
    tokenizer = transformers.AutoTokenizer.from_pretrained(spec.model.tokenizer or model_dir)
    params = engines.SamplingParams(
        max_new_tokens=spec.generation.max_new_tokens,
        temperature=spec.generation.temperature,
        top_p=spec.generation.top_p,
        seed=spec.training.seed + ident.pod_index,
        stop_token_ids=(tokenizer.eos_token_id,) if tokenizer.eos_token_id is not None else (),
    )
    coord = client_mod.CoordinatorClient(
        cfg.endpoints.coordinator, ident.token, tls_ca=ident.tls.ca if ident.tls else None
    )
    worker_metrics = metrics.WorkerMetrics("generator")
    gen = Generator(
        generator_id=name or names.Names(cfg.job.name).pod(names.GENERATOR, ident.pod_index),
        engine=engine,
        coord=coord,
        tokenizer=tokenizer,
        reward_fn=rewards.load(spec.task.reward),
        params=params,
        samples_per_prompt=spec.generation.samples_per_prompt,
        worker_metrics=worker_metrics,
        max_unacked_groups=max_unacked_groups(spec, capacity),
    )
    return gen, capacity


def max_unacked_groups(spec: spec_mod.JobSpec, capacity: int) -> int:
    """How many finished groups may wait for the coordinator's answer before leasing stops.

    Groups wait only while the rollout buffer is full (otherwise the answer takes milliseconds), and
    every waiting group is trained later: its samples' lag grows. So the bound is what one decode
    batch finishes at once (`capacity` sequences), at most half an optimizer batch (with B = 2
    groups, 8 waiting groups were 4 batches of extra lag, past maxLag) and `MAX_UNACKED_GROUPS`. At
    half an optimizer batch, a trainer-bound demo job trained its samples ~0.4 steps later.
    """
    g = spec.generation.samples_per_prompt
    return max(1, min(MAX_UNACKED_GROUPS, spec.training.batch_size // g // 2, capacity // g))


def _sample_seed(base_seed: int, prompt_id: int, j: int) -> int:
    return (base_seed * 1_000_003 + prompt_id * 1_009 + j) % (1 << 31)


def _device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def main(cfg: worker_config.WorkerConfig, ident: identity.Identity) -> int:
    """The generator role (`plrl-worker --role generator`)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    gen, capacity = build(cfg, ident)
    if gen.metrics is not None:
        gen.metrics.serve(ident.metrics_port or cfg.endpoints.metrics_port, host=ident.bind_host)
    lifecycle.on_sigterm(gen.stop)
    beat = heartbeat.start(cfg, ident, lambda: gen.heartbeat_report(capacity))
    try:
        gen.run(capacity)
        if gen.work_done:
            lifecycle.park(beat, gen.stopped, f"generator {gen.generator_id} has no more prompts to generate")
    finally:
        if beat is not None:
            beat.stop()
        gen.engine.close()
        gen.coord.close()
    if gen.lost:
        log.error("generator %s cannot go on: %s; exiting to be restarted", gen.generator_id, gen.lost)
        return names.EXIT_RESTART_ME
    log.info("generator %s done (%d refused rollouts)", gen.generator_id, gen.refused)
    return 0
