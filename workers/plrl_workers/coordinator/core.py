"""The job's coordinator (runs in trainer rank 0): prompt leases, rollout intake, accounting, control.

Every prompt drawn from the source is *issued* once and then lives in exactly one state until it is
*trained* or *dropped by the lag policy*:

    leased (out with one generator) -> buffered (accepted, waiting) -> in_training (taken) -> trained
        |  lease deadline passed, generator dead or replaced           \\-> dropped_by_lag (finish_step)
        v
    requeued (front of the queue, leased again before new prompts)

so `issued == trained + dropped_by_lag + leased + requeued + buffered + in_training` always holds
(`protocol.Stats.accounting`). A lease id is used once: a second submit of an accepted lease is
ALREADY_EXISTS, a late submit of a lease that was re-queued is FAILED_PRECONDITION, so no prompt is
trained twice.

Generators are fenced by incarnation: every `register` of a generator id returns a new incarnation
token and revokes the leases of the one before, and a lease request or control stream that carries
an older token is refused (FAILED_PRECONDITION), so a process that was replaced (hung, then resumed;
or a pod the kubelet thought dead) can neither lease prompts nor deliver rollouts again. A generator
whose control stream ends without it being replaced (the process died, or its connection broke) is
declared dead at once: its leases go back to the queue without waiting for `lease_timeout_s`. A
generator id that is not registered (declared dead, or displaced by a flood of registrations before
it leased or attached) is refused NOT_FOUND: that process was not replaced, so it registers again.

Slow generators (seed 3.3.1): `migrate_from_slow` compares the generators' completion rates (groups
accepted over a recent window) with `plrl_api.peers.slow`, and moves the newest half of a slow one's
leases back to the front of the queue, where its peers lease them next; the slow one's late results
for those prompts are refused like any re-queued lease's ("lease migrated"), and a Revoke on its
control stream tells it to stop decoding them (their slots go to new leases). `slow_generators`
says which are slow now and for how long without a break (trainer rank 0 reports it in its Lease;
the controllers replace one that stays slow, `plrl_operator.policy.health.stays_slow`).

Backpressure: the rollout buffer holds `buffer_groups` groups. `submit` blocks up to `submit_wait_s`
for space (while it blocks the gRPC stream is not read, so HTTP/2 flow control stalls the generator);
after that it returns RESOURCE_EXHAUSTED and renews the lease, and the generator re-sends the same
group later. Blocking first keeps the common case (a short stall) free of retries; the timeout keeps a
stalled trainer from pinning generator threads forever.

No grpc, no torch: `rpc/server.py` maps these calls to RPCs; `checks.py` validates
rollouts; `state.py` is the restart record; `control.py` queues control
events for generators (weight updates, pull requests, stop), drained by the server's control stream.

Usage (trainer rank 0):

    coord = coordinator.Coordinator(task_prompts, coordinator.Config(samples_per_prompt=8))
    server = rpc.server.serve(coord, snapshots, port=0, token=token)
    while not coord.stats().finished:
        groups = coord.take(batch_groups, timeout_s=60)
        ... train one step on groups ...
        coord.finish_step(step)           # marks them trained; tokens up to version `step` accepted
        bc.broadcast(
            step, model.named_parameters(), coord.weight_members(), coord.announce_weights,
            coord.weight_member_connected,
        )
    state = coord.export_state()          # into the checkpoint
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import itertools
import logging
import math
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterator

from plrl_api import peers, records
from plrl_workers import protocol
from plrl_workers.coordinator import checks, control
from plrl_workers.coordinator import state as restart

log = logging.getLogger(__name__)

MAX_GENERATOR_ID_CHARS = 253  # a DNS subdomain's limit: every pod name fits


@dataclasses.dataclass(frozen=True)
class Config:
    samples_per_prompt: int
    """G: samples every rollout group must hold."""
    buffer_groups: int = 64
    """Capacity of the rollout buffer, in groups; full means submits wait (backpressure)."""
    buffer_bytes: int = 1 << 30
    """...and in bytes of token data (`RolloutGroup.nbytes`), so a few huge groups cannot exhaust
    memory below the group count. A group larger than this alone still enters an empty buffer."""
    lease_timeout_s: float = 600.0
    """A lease not returned within this many seconds (renewed by every submit attempt) is re-queued."""
    submit_wait_s: float = 10.0
    """How long a submit waits for buffer space before it is refused with RESOURCE_EXHAUSTED."""
    vocab_size: int | None = None
    """If set, token ids must lie in [0, vocab_size)."""
    max_new_tokens: int | None = None
    """If set, a sample holds at most this many tokens (the job's generation.maxNewTokens): a longer
    one cannot come from the job's sampling settings and would not fit the trainer's packing."""
    max_abs_reward: float = checks.MAX_ABS_REWARD
    """Rewards beyond +-this are refused: the advantage's variance of larger ones overflows."""
    max_generators: int = 1024
    """Registrations kept at most. A new id past it displaces the oldest registration that holds no
    lease and has no control stream (registered, never started); with none such it is refused."""
    prompt_budget: int | None = None
    """Groups the job's optimizer steps take in all (total steps x B/G). New prompts are issued only
    while trained + dropped within a step + outstanding < budget, so a finished run leaves no prompt
    issued and untrained: a prompt the lag policy drops from a step that happened used its place in
    that step; the prompts of a batch skipped whole (every sample too old, no step) are replaced.
    None: issue while the source lasts."""
    closed_lease_memory: int = 100_000
    """How many finished lease ids are remembered to tell duplicates/late returns from unknown ones."""
    adopt_grace_s: float = 60.0
    """After a restore, a prompt that was leased when the state was saved is leased to no other
    generator for this long, or until its holder has registered and asked for ordinary leases: the
    holder finishes what it had in flight while the coordinator was away (`generator.CARRY_OVER_S`)
    and adopts those prompts to deliver it."""


class Coordinator:
    """Thread-safe; every public method may be called from any gRPC handler thread.

    `source` yields `protocol.Prompt`s with unique, restart-stable ids; with `state` (from
    `export_state()`), the first `state["next_index"]` items are skipped unless `skip_source=False`
    (pass a source already positioned there), and unfinished prompts are re-queued.
    `clock` is injectable for tests; waits use real time.
    """

    def __init__(
        self,
        source: Iterator[protocol.Prompt],
        config: Config,
        *,
        state: dict[str, object] | None = None,
        skip_source: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self._clock = clock
        self._cond = threading.Condition()
        self._session = uuid.uuid4().hex[:12]
        self._lease_seq = itertools.count(1)
        self._source = source
        self._source_exhausted = False
        self._stopping = False
        self._restarting = False  # stopping, and a successor takes over: the job is not over
        self._version = 0
        self._next_index = 0
        self._issued = self._trained = self._dropped = 0
        self._dropped_in_steps = 0  # dropped from batches that still made a step (used the budget)
        self._budget = config.prompt_budget
        self._completed = restart.IdRanges()
        self._pending: dict[int, protocol.Prompt] = {}  # issued, not yet trained or dropped
        self._queue: collections.deque[protocol.Prompt] = collections.deque()  # re-queued prompts
        # Restored prompts kept for the generator that held them (`Config.adopt_grace_s`): id -> holder.
        self._reserved: dict[int, str] = {}
        self._reserved_until = 0.0
        self._leases: dict[str, protocol.Lease] = {}
        self._deadlines: list[tuple[float, str]] = []  # heap; stale entries skipped
        self._closed: collections.OrderedDict[str, str] = collections.OrderedDict()  # lease id -> outcome
        self._buffer: collections.deque[protocol.RolloutGroup] = collections.deque()
        self._buffer_bytes = 0
        self._in_training: list[protocol.RolloutGroup] = []
        self._generators: dict[str, set[str]] = {}  # generator id -> its lease ids
        self._incarnations: dict[str, str] = {}  # generator id -> its current registration's token
        self._registered_at: dict[str, float] = {}
        self._accepted_at: dict[str, collections.deque[float]] = {}  # generator id -> accept times
        self._migrated_at: dict[str, float] = {}
        self._migrated = 0
        self._migrated_from: collections.Counter[str] = collections.Counter()
        # generator id -> (since when it has been slow, its rate, its peers' median) at the last look
        self._slow: dict[str, tuple[float, float, float]] = {}
        self._registrations = itertools.count(1)
        self._control = control.ControlHub()
        self._expired = self._revoked = self._displaced = self._adopted = 0
        self._refused: collections.Counter[str] = collections.Counter()
        if state is not None:
            self._restore(restart.CoordinatorState.model_validate(state), skip_source)

    # ---- generators ------------------------------------------------------------------------

    def register(self, generator_id: str) -> protocol.Registration:
        """Admit a generator under a new incarnation; a known id is a replaced process: its old leases
        are re-queued and its old incarnation is refused from now on."""
        if not 0 < len(generator_id) <= MAX_GENERATOR_ID_CHARS or not generator_id.isprintable():
            raise protocol.Refused(
                protocol.Code.INVALID_ARGUMENT,
                f"generator_id must be 1-{MAX_GENERATOR_ID_CHARS} printable characters",
            )
        with self._cond:
            if generator_id not in self._generators and len(self._generators) >= self.config.max_generators:
                self._make_room_locked()
            if generator_id in self._generators:
                self._revoke_locked(generator_id, "re-registered (replaced)")
                self._control.close(generator_id)  # the old process's stream, if still open
            self._generators[generator_id] = set()
            incarnation = f"{self._session}.{next(self._registrations)}"
            self._incarnations[generator_id] = incarnation
            self._registered_at[generator_id] = self._clock()
            self._accepted_at[generator_id] = collections.deque()
            self._slow.pop(generator_id, None)  # a new process is judged afresh
            log.info("generator %s registered (incarnation %s)", generator_id, incarnation)
            return protocol.Registration(
                self._version,
                self.config.samples_per_prompt,
                self.config.lease_timeout_s,
                self._session,
                incarnation,
            )

    def _check_incarnation_locked(self, generator_id: str, incarnation: str | None) -> None:
        """Refuse a caller that is not `generator_id`'s current registration (None: in-process caller
        that does not fence). NOT_FOUND (forgotten: displaced by a registration flood before it
        started, or its control stream was lost) tells the process to register again;
        FAILED_PRECONDITION (another process holds the id now) tells it to exit."""
        if generator_id not in self._generators:
            raise protocol.Refused(
                protocol.Code.NOT_FOUND,
                f"generator {generator_id!r} is not registered (forgotten); register again",
            )
        current = self._incarnations.get(generator_id)
        if incarnation is not None and incarnation != current:
            raise protocol.Refused(
                protocol.Code.FAILED_PRECONDITION,
                f"generator {generator_id!r} incarnation {incarnation or '(none)'} was replaced by "
                f"{current}; this process must exit",
            )

    def generator_dead(
        self, generator_id: str, reason: str = "declared dead", incarnation: str | None = None
    ) -> None:
        """Forget a generator (only if `incarnation`, when given, is still its current one): its
        leases are re-queued, its control stream ends, its incarnation is refused from now on."""
        with self._cond:
            if incarnation is not None and self._incarnations.get(generator_id) != incarnation:
                return  # a newer registration replaced it already
            if generator_id in self._generators:
                self._revoke_locked(generator_id, reason)
            self._forget_locked(generator_id)
        self._control.close(generator_id)

    def _forget_locked(self, generator_id: str) -> None:
        """Drop everything kept per generator id (its leases must be re-queued already)."""
        for per_id in (
            self._generators,
            self._incarnations,
            self._registered_at,
            self._accepted_at,
            self._migrated_at,
            self._migrated_from,
            self._slow,
        ):
            per_id.pop(generator_id, None)

    def _make_room_locked(self) -> None:
        """Forget the oldest registration that never started (no lease, no control stream), or refuse
        the new one: a flood of registrations must not grow the registry without bound."""
        streaming = set(self._control.members())
        idle = [g for g, leases in self._generators.items() if not leases and g not in streaming]
        if not idle:
            raise protocol.Refused(
                protocol.Code.RESOURCE_EXHAUSTED,
                f"{len(self._generators)} generators are registered and working, the most this "
                f"coordinator admits (max_generators={self.config.max_generators})",
            )
        oldest = min(idle, key=lambda g: self._registered_at.get(g, 0.0))
        self._displaced += 1
        if math.log10(self._displaced).is_integer():  # 1st, 10th, 100th...: a flood logs a few lines
            log.warning(
                "forgot generator %.80s (registered, never started) to admit a new one (%d so far)",
                oldest,
                self._displaced,
            )
        self._forget_locked(oldest)

    def _revoke_locked(self, generator_id: str, reason: str) -> None:
        lease_ids = self._generators.get(generator_id, set())
        if lease_ids:
            log.warning("generator %s %s: re-queueing %d leases", generator_id, reason, len(lease_ids))
        for lease_id in sorted(lease_ids):
            self._requeue_locked(self._leases[lease_id], "revoked")
            self._revoked += 1
        lease_ids.clear()

    # ---- leases ----------------------------------------------------------------------------

    def lease(
        self,
        generator_id: str,
        max_prompts: int,
        wait_s: float = 0.0,
        incarnation: str | None = None,
        prompt_ids: Collection[int] = (),
    ) -> protocol.LeaseBatch:
        """Lease up to `max_prompts` prompts (re-queued ones first), waiting up to `wait_s` for any.

        With `prompt_ids`, adopt: lease those of them that wait in the queue, and nothing else, at
        once. A generator that finished their groups for this coordinator's predecessor delivers
        them under the new leases instead of decoding them again; a prompt already leased again,
        trained or dropped is simply not returned (its work is done or under way elsewhere)."""
        if prompt_ids:
            return self._adopt(generator_id, max_prompts, incarnation, set(prompt_ids))
        end = time.monotonic() + wait_s
        with self._cond:
            self._release_reserved_locked(generator_id)  # it asks for new work: it adopted what it had
            while True:
                # Checked on every wake-up: the generator may be replaced or declared dead meanwhile.
                self._check_incarnation_locked(generator_id, incarnation)
                self._expire_locked()
                out: list[protocol.Lease] = []
                while len(out) < max_prompts:
                    prompt = self._next_prompt_locked(generator_id)
                    if prompt is None:
                        break
                    out.append(self._grant_locked(prompt, generator_id))
                finished = (
                    (self._stopping and not self._restarting)
                    or self._finished_locked()
                    or (self._source_exhausted and not self._queue and not self._leases)
                )
                remaining = end - time.monotonic()
                # With the budget used up only a re-queued lease could arrive: do not make the
                # caller wait for one (conventional rounds end on this answer).
                spent = not self._queue and not self._budget_left_locked()
                if out or finished or spent or remaining <= 0:
                    return protocol.LeaseBatch(out, finished)
                self._cond.wait(min(remaining, 1.0))

    def _adopt(
        self, generator_id: str, max_prompts: int, incarnation: str | None, wanted: set[int]
    ) -> protocol.LeaseBatch:
        with self._cond:
            self._check_incarnation_locked(generator_id, incarnation)
            out: list[protocol.Lease] = []
            waiting: collections.deque[protocol.Prompt] = collections.deque()
            for prompt in self._queue:
                mine = self._leasable_by_locked(prompt.prompt_id, generator_id)
                if prompt.prompt_id in wanted and mine and len(out) < max_prompts and not self._stopping:
                    out.append(self._grant_locked(prompt, generator_id))
                    self._reserved.pop(prompt.prompt_id, None)
                else:
                    waiting.append(prompt)
            self._queue = waiting
            self._adopted += len(out)
            return protocol.LeaseBatch(out, False)

    def _leasable_by_locked(self, prompt_id: int, generator_id: str) -> bool:
        """Whether `generator_id` may lease queued `prompt_id`: it is kept for no other generator."""
        return self._reserved.get(prompt_id, generator_id) == generator_id

    def _release_reserved_locked(self, holder: str | None = None) -> None:
        """End the reservations of `holder` (None: of every holder, once the grace is over)."""
        if not self._reserved:
            return
        if holder is None and self._clock() < self._reserved_until:
            return
        self._reserved = {p: h for p, h in self._reserved.items() if holder is not None and h != holder}
        if not self._reserved:
            log.info("re-queued prompts kept for their previous generators are open to all")
        self._cond.notify_all()

    def _next_prompt_locked(self, generator_id: str) -> protocol.Prompt | None:
        if self._stopping:
            return None
        self._release_reserved_locked()
        for k, queued in enumerate(self._queue):
            if self._leasable_by_locked(queued.prompt_id, generator_id):
                del self._queue[k]
                self._reserved.pop(queued.prompt_id, None)
                return queued
        while not self._source_exhausted and self._budget_left_locked():
            prompt = next(self._source, None)
            if prompt is None:
                self._source_exhausted = True
                break
            self._next_index += 1
            if prompt.prompt_id in self._completed or prompt.prompt_id in self._pending:
                log.warning("source repeated prompt id %d; skipped", prompt.prompt_id)
                continue
            self._issued += 1
            self._pending[prompt.prompt_id] = prompt
            return prompt
        return None

    def _grant_locked(self, prompt: protocol.Prompt, generator_id: str) -> protocol.Lease:
        lease = protocol.Lease(
            lease_id=f"{self._session}-{next(self._lease_seq)}",
            prompt=prompt,
            generator_id=generator_id,
            deadline=self._clock() + self.config.lease_timeout_s,
        )
        self._leases[lease.lease_id] = lease
        self._generators[generator_id].add(lease.lease_id)
        heapq.heappush(self._deadlines, (lease.deadline, lease.lease_id))
        return lease

    def _expire_locked(self) -> None:
        now = self._clock()
        while self._deadlines and self._deadlines[0][0] <= now:
            _, lease_id = heapq.heappop(self._deadlines)
            lease = self._leases.get(lease_id)
            if lease is None or lease.deadline > now:
                continue  # finished, or renewed (a newer heap entry exists)
            log.warning(
                "lease %s (prompt %d, %s) expired", lease_id, lease.prompt.prompt_id, lease.generator_id
            )
            self._generators.get(lease.generator_id, set()).discard(lease_id)
            self._requeue_locked(lease, "expired")
            self._expired += 1

    def _requeue_locked(self, lease: protocol.Lease, outcome: str) -> None:
        del self._leases[lease.lease_id]
        self._remember_locked(lease.lease_id, outcome)
        self._queue.appendleft(lease.prompt)
        self._cond.notify_all()

    def _remember_locked(self, lease_id: str, outcome: str) -> None:
        self._closed[lease_id] = outcome
        while len(self._closed) > self.config.closed_lease_memory:
            self._closed.popitem(last=False)

    # ---- slow generators -------------------------------------------------------------------

    def migrate_from_slow(self, threshold: float, window_s: float) -> list[protocol.Migration]:
        """Re-queue the newest half of the leases of each generator whose completion rate over the
        last `window_s` is more than `threshold` below its peers' median. Generators registered
        for less than `window_s` are not judged (nor counted as peers), and a generator's work is
        migrated at most once per window, so a slow one keeps the leases it is finishing."""
        with self._cond:
            now = self._clock()
            rates: dict[str, float] = {}
            for gid in self._generators:
                accepted = self._accepted_at.setdefault(gid, collections.deque())
                while accepted and accepted[0] < now - window_s:
                    accepted.popleft()
                if now - self._registered_at.get(gid, now) >= window_s:
                    rates[gid] = len(accepted) / window_s
            out = []
            slow = peers.slow(rates, threshold)
            for gid in rates:
                if gid in slow:
                    median = statistics.median(r for g, r in rates.items() if g != gid)
                    since = self._slow[gid][0] if gid in self._slow else now
                    self._slow[gid] = (since, rates[gid], median)
                else:
                    self._slow.pop(gid, None)
            for gid in slow:
                if now - self._migrated_at.get(gid, now - window_s) < window_s:
                    continue
                newest = sorted(self._generators[gid], key=_lease_seq, reverse=True)
                moved = newest[: len(newest) // 2]
                if not moved:
                    continue
                for lease_id in moved:
                    self._generators[gid].discard(lease_id)
                    self._requeue_locked(self._leases[lease_id], "migrated")
                self._migrated += len(moved)
                self._migrated_from[gid] += len(moved)
                self._migrated_at[gid] = now
                median = self._slow[gid][2]
                out.append(protocol.Migration(gid, len(moved), rates[gid], median))
                # Only queued (never blocks), so safe under the lock; its Control stream sends it.
                self._control.send(gid, protocol.Revoke(tuple(moved), "migrated to its peers"))
                log.warning(
                    "generator %s is slow (%.2f groups/s, peers' median %.2f): %d of its leases "
                    "migrated to its peers",
                    gid,
                    rates[gid],
                    median,
                    len(moved),
                )
            return out

    def slow_generators(self) -> list[records.SlowGenerator]:
        """The generators `migrate_from_slow` found slow at its last look, and for how long they
        have been slow without a break (what their controllers replace one that stays slow by)."""
        with self._cond:
            now = self._clock()
            return [
                records.SlowGenerator(
                    generator=gid,
                    slow_for_seconds=max(0.0, now - since),
                    rate=rate,
                    peers_median=median,
                    migrated=self._migrated_from[gid],
                )
                for gid, (since, rate, median) in sorted(self._slow.items())
            ]

    # ---- rollouts --------------------------------------------------------------------------

    def submit(self, group: protocol.RolloutGroup) -> protocol.SubmitResult:
        """Validate and buffer one group; blocks up to `Config.submit_wait_s` while the buffer is full."""
        with self._cond:
            self._expire_locked()
            lease = self._leases.get(group.lease_id)
            refusal = self._lease_refusal_locked(group, lease)
            version = self._version
        if refusal is None and lease is not None:
            refusal = checks.check_group(
                group,
                lease.prompt,
                samples_per_prompt=self.config.samples_per_prompt,
                current_version=version,
                vocab_size=self.config.vocab_size,
                max_new_tokens=self.config.max_new_tokens,
                max_abs_reward=self.config.max_abs_reward,
            )
        if refusal is not None:
            return self.refuse(group.lease_id, group.generator_id, *refusal)
        assert lease is not None
        end = time.monotonic() + self.config.submit_wait_s
        size = group.nbytes
        with self._cond:
            self._renew_locked(lease)
            while (
                self._buffer_full_locked(size)
                and not self._stopping
                and self._leases.get(group.lease_id) is lease  # else settled below
            ):
                remaining = end - time.monotonic()
                if remaining <= 0:
                    return self.refuse(
                        group.lease_id,
                        group.generator_id,
                        protocol.Code.RESOURCE_EXHAUSTED,
                        "rollout buffer full; retry later",
                    )
                self._cond.wait(remaining)
            self._expire_locked()
            current = self._leases.get(group.lease_id)
            if current is not lease:  # accepted (a duplicate raced us) or re-queued while we waited
                code, reason = self._lease_refusal_locked(group, current) or (
                    protocol.Code.FAILED_PRECONDITION,
                    "lease was re-queued while waiting",
                )
                return self.refuse(group.lease_id, group.generator_id, code, reason)
            if self._stopping:
                return self.refuse(
                    group.lease_id, group.generator_id, protocol.Code.UNAVAILABLE, "coordinator is stopping"
                )
            del self._leases[lease.lease_id]
            self._generators.get(lease.generator_id, set()).discard(lease.lease_id)
            self._remember_locked(lease.lease_id, "accepted")
            self._accepted_at.setdefault(lease.generator_id, collections.deque()).append(self._clock())
            self._buffer.append(group)
            self._buffer_bytes += size
            self._cond.notify_all()
        return protocol.SubmitResult(group.lease_id, protocol.Code.OK)

    def _buffer_full_locked(self, incoming_bytes: int) -> bool:
        if len(self._buffer) >= self.config.buffer_groups:
            return True
        return bool(self._buffer) and self._buffer_bytes + incoming_bytes > self.config.buffer_bytes

    def _lease_refusal_locked(
        self, group: protocol.RolloutGroup, lease: protocol.Lease | None
    ) -> tuple[protocol.Code, str] | None:
        if lease is None:
            outcome = self._closed.get(group.lease_id)
            if outcome == "accepted":
                return protocol.Code.ALREADY_EXISTS, "this lease's rollouts were already accepted"
            if outcome is not None:
                return protocol.Code.FAILED_PRECONDITION, f"lease {outcome}; its prompt was re-queued"
            return protocol.Code.NOT_FOUND, "unknown lease"
        if group.generator_id != lease.generator_id:
            return protocol.Code.FAILED_PRECONDITION, f"lease belongs to {lease.generator_id!r}"
        return None

    def _renew_locked(self, lease: protocol.Lease) -> None:
        lease.deadline = self._clock() + self.config.lease_timeout_s
        heapq.heappush(self._deadlines, (lease.deadline, lease.lease_id))

    def refuse(
        self, lease_id: str, generator_id: str, code: protocol.Code, reason: str
    ) -> protocol.SubmitResult:
        """Count and log a refused group (also for groups the RPC layer could not even decode)."""
        with self._cond:
            self._refused[code.name] += 1
        level = logging.INFO if code is protocol.Code.RESOURCE_EXHAUSTED else logging.WARNING
        log.log(
            level, "refused rollouts of lease %s from %s: %s: %s", lease_id, generator_id, code.name, reason
        )
        return protocol.SubmitResult(lease_id, code, reason)

    def count_refusal(self, reason: str) -> None:
        """Count a refusal decided elsewhere (e.g. the RPC layer's auth check)."""
        with self._cond:
            self._refused[reason] += 1

    # ---- trainer ---------------------------------------------------------------------------

    def take(self, n_groups: int, timeout_s: float | None = None) -> list[protocol.RolloutGroup]:
        """Up to `n_groups` groups, oldest first; fewer only on timeout, stop, or a finished job.

        Taken groups are in training until `finish_step()`. The lag policy is the trainer's
        (`rl/lag.py`): it reports the prompts it dropped to `finish_step`.
        """
        end = None if timeout_s is None else time.monotonic() + timeout_s
        out: list[protocol.RolloutGroup] = []
        with self._cond:
            while len(out) < n_groups:
                while self._buffer and len(out) < n_groups:
                    group = self._buffer.popleft()
                    self._buffer_bytes -= group.nbytes
                    self._in_training.append(group)
                    out.append(group)
                self._cond.notify_all()
                if len(out) >= n_groups or self._stopping or self._finished_locked():
                    break
                remaining = None if end is None else end - time.monotonic()
                if remaining is not None and remaining <= 0:
                    break
                self._cond.wait(1.0 if remaining is None else min(remaining, 1.0))
                self._expire_locked()
        return out

    def _complete_locked(self, prompt_id: int) -> None:
        del self._pending[prompt_id]
        self._completed.add(prompt_id)

    def finish_step(self, version: int, dropped: Collection[int] = (), stepped: bool = True) -> None:
        """The trainer finished an optimizer step; weights are now `version`.

        Taken groups count as trained, except the prompt ids in `dropped`, which the trainer's lag
        policy dropped (every sample too old). `stepped=False`: the whole batch was dropped and no
        step was made, so its prompts are replaced. Call before broadcasting `version`, so
        rollouts carrying it are accepted.
        """
        with self._cond:
            if version < self._version:
                raise ValueError(f"weight version {version} is older than the current {self._version}")
            taken = {g.prompt_id for g in self._in_training}
            if not set(dropped) <= taken:
                raise ValueError(
                    f"dropped prompts {sorted(set(dropped) - taken)} were not taken for this step"
                )
            self._version = version
            for group in self._in_training:
                self._complete_locked(group.prompt_id)
            self._dropped += len(set(dropped))
            if stepped:
                self._dropped_in_steps += len(set(dropped))
            self._trained += len(self._in_training) - len(set(dropped))
            self._in_training.clear()
            self._cond.notify_all()

    def now(self) -> float:
        """The coordinator's clock (lease deadlines are on it)."""
        return self._clock()

    @property
    def weight_version(self) -> int:
        with self._cond:
            return self._version

    def stop(self, reason: str = "job finished", tell_generators: bool = True) -> None:
        """Refuse new leases and submits, wake every waiter, and send Stop on every control stream
        (not if `tell_generators` is False: the coordinator restarts, and its generators, seeing
        their streams end, reconnect to the next one)."""
        with self._cond:
            again = self._stopping
            self._stopping = True
            self._restarting = not tell_generators
            self._cond.notify_all()
        if tell_generators:
            self._control.stop_all(reason)
        elif not again:
            log.info("stopping (%s); generators are not told to stop", reason)

    # ---- control streams -------------------------------------------------------------------

    def attach_control(self, generator_id: str, incarnation: str | None = None) -> control.Channel:
        """Open `generator_id`'s control channel (replacing an older one, which gets None = closed)."""
        with self._cond:
            self._check_incarnation_locked(generator_id, incarnation)
        return self._control.attach(generator_id)

    def detach_control(
        self, generator_id: str, channel: control.Channel, incarnation: str | None = None
    ) -> None:
        """The control stream ended. If it was the generator's current one and the job is not
        stopping, the generator is gone (process dead, connection lost): re-queue its leases now."""
        if self._control.detach(generator_id, channel):
            with self._cond:
                stopping = self._stopping
            if not stopping:
                self.generator_dead(generator_id, "lost its control stream", incarnation)

    def weight_members(self) -> list[str]:
        """Generators that can take part in a weight broadcast now (those with an open control stream)."""
        return self._control.members()

    def announce_weights(
        self, generator_id: str, group: protocol.GroupInfo, announcement: protocol.Announcement
    ) -> bool:
        """`sender.Announce` callback: queue a WeightUpdate; False if the generator has no control stream."""
        return self._control.send(generator_id, protocol.WeightUpdate(group, announcement))

    def weight_member_connected(self, generator_id: str) -> bool:
        """`sender.Connected` probe: the stream that carried this generator's latest weight
        announcement is still open (a killed generator's ends within the server's 0.5 s poll)."""
        return self._control.announced_stream_open(generator_id)

    def request_pull(self, generator_id: str, version: int) -> bool:
        return self._control.send(generator_id, protocol.PullWeights(version))

    # ---- reporting and restart -------------------------------------------------------------

    def _budget_left_locked(self) -> bool:
        budget = self._budget
        return budget is None or self._trained + self._dropped_in_steps + len(self._pending) < budget

    def set_prompt_budget(self, budget: int | None) -> None:
        """Raise (or set) the prompt budget; conventional mode opens one round's worth at a time."""
        with self._cond:
            self._budget = budget
            self._cond.notify_all()

    def _finished_locked(self) -> bool:
        """Nothing outstanding and nothing more to issue (source exhausted or budget trained)."""
        return not self._pending and (self._source_exhausted or not self._budget_left_locked())

    def stats(self) -> protocol.Stats:
        with self._cond:
            self._expire_locked()
            return protocol.Stats(
                accounting=records.PromptCounts(
                    issued=self._issued,
                    trained=self._trained,
                    dropped_by_lag=self._dropped,
                    leased=len(self._leases),
                    requeued=len(self._queue),
                    buffered=len(self._buffer),
                    in_training=len(self._in_training),
                ),
                weight_version=self._version,
                buffer_capacity=self.config.buffer_groups,
                generators=len(self._generators),
                control_streams=len(self._control.members()),
                leases_expired=self._expired,
                leases_revoked=self._revoked,
                leases_migrated=self._migrated,
                session=self._session,
                leases_adopted=self._adopted,
                refused=dict(self._refused),
                source_exhausted=self._source_exhausted,
                finished=self._finished_locked(),
            )

    def export_state(self) -> dict[str, object]:
        """The restart record (JSON-able; see `state.CoordinatorState`)."""
        with self._cond:
            holders = {lease.prompt.prompt_id: lease.generator_id for lease in self._leases.values()}
            record = restart.CoordinatorState(
                weight_version=self._version,
                next_index=self._next_index,
                issued=self._issued,
                trained=self._trained,
                dropped_by_lag=self._dropped,
                dropped_in_steps=self._dropped_in_steps,
                completed=self._completed.ranges(),
                pending=[
                    restart.PendingPrompt(
                        prompt_id=p.prompt_id,
                        text=p.text,
                        answer=p.answer,
                        token_ids=p.token_ids,
                        holder=holders.get(p.prompt_id, ""),
                    )
                    for _, p in sorted(self._pending.items())
                ],
            )
            return record.model_dump(mode="json")

    def _restore(self, state: restart.CoordinatorState, skip_source: bool) -> None:
        self._version = state.weight_version
        self._next_index = state.next_index
        self._issued, self._trained, self._dropped = state.issued, state.trained, state.dropped_by_lag
        self._dropped_in_steps = state.dropped_in_steps
        self._completed = restart.IdRanges(state.completed)
        for p in state.pending:
            prompt = protocol.Prompt(p.prompt_id, p.text, p.answer, tuple(p.token_ids))
            self._queue.append(prompt)
            self._pending[p.prompt_id] = prompt
            if p.holder:
                self._reserved[p.prompt_id] = p.holder
        self._reserved_until = self._clock() + self.config.adopt_grace_s
        if skip_source:
            for _ in itertools.islice(self._source, state.next_index):
                pass
        log.info(
            "coordinator restored: version %d, %d trained, %d dropped, %d re-queued",
            self._version,
            self._trained,
            self._dropped,
            len(self._queue),
        )


def _lease_seq(lease_id: str) -> int:
    """A lease id's grant order (`<session>-<n>`)."""
    return int(lease_id.rsplit("-", 1)[1])
