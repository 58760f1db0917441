"""A hostile client that holds the job's token, against a live coordinator while a real `plrl run`
job trains (issue 11): the attacks the security probe found (findings 1-4) and a seeded,
time-bounded fuzz of every RPC. Done means: no worker crashed or was restarted, no RPC hung, the
job finished every step, and its prompt accounting is exact.

The attacker reads what a worker would have (the coordinator's address from the run's config, the
token and the job's CA from `<run-dir>/secret/`) and, for FUZZ_S seconds, with seed SEED:
- holds 300 SubmitRollouts streams open without sending (finding 3);
- registers 500 generator ids of 1 KB (finding 4: the registry holds at most totalGPUs);
- submits rollouts for leases it took: a reward of 1e200, a 600-token sample in a job with
  maxNewTokens 8, token ids at and past the vocabulary, 4 MB groups (findings 1-2), and random
  mutations of valid groups;
- calls every RPC with random fields, each under a deadline (a call that outlives it is a hang).
"""

from __future__ import annotations

import json
import pathlib
import random
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc

from plrl_api import names, worker_config
from plrl_operator.local import report, runner
from plrl_workers import protocol
from plrl_workers.rpc import auth, client
from plrl_workers.rpc.generated import plrl_pb2 as pb
from plrl_workers.rpc.generated import plrl_pb2_grpc as pb_grpc
from tests.infra import procs
from tests.operator.local.conftest import plrl_argv, plrl_env, write_job

SEED = 11
FUZZ_S = 10.0
CALL_DEADLINE_S = 40.0  # > the longest legitimate wait (a lease request waits up to 30 s)
STEPS = 100  # ~0.2 s a step unattacked: the job must outlive the whole attack, also on a loaded machine


def _wait(predicate: Any, proc: subprocess.Popen[str], what: str, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert proc.poll() is None, f"plrl run ended before {what}"
        assert time.monotonic() < deadline, f"no {what} within {timeout_s:.0f} s"
        time.sleep(0.2)


class Attacker:
    """Everything a worker of the job holds, used against it."""

    def __init__(self, run_dir: pathlib.Path) -> None:
        secret = runner.token_path(run_dir).parent
        self.token = runner.token_path(run_dir).read_text()
        cfg = json.loads((run_dir / "config" / "trainer.json").read_text())
        self.target = worker_config.WorkerConfig.model_validate(cfg).endpoints.coordinator
        ca = (secret / names.TLS_CA_KEY).read_bytes()
        options = [("grpc.ssl_target_name_override", names.TLS_SERVER_NAME)]
        self.channel = grpc.secure_channel(self.target, grpc.ssl_channel_credentials(ca), options=options)
        self.stub = pb_grpc.CoordinatorStub(self.channel)
        self.md = auth.metadata(self.token)
        self.client = client.CoordinatorClient(self.target, self.token, tls_ca=ca, timeout_s=CALL_DEADLINE_S)
        self.hangs: list[str] = []
        self.crashes: list[str] = []
        self.last_error = ""

    def call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """One RPC: refusals are expected; a deadline means the server hung; anything else, a bug."""
        try:
            return fn(*args, **kwargs)
        except grpc.RpcError as err:
            self.last_error = f"{what}: {err.code().name} {err.details()}"
            if err.code() is grpc.StatusCode.DEADLINE_EXCEEDED:
                self.hangs.append(what)
            elif err.code() in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL):
                self.crashes.append(f"{what}: {err.code().name} {err.details()}")
            return None

    def stall(self, n: int, until: threading.Event) -> list[Any]:
        def never() -> Iterator[pb.RolloutGroup]:
            until.wait()
            yield from ()

        return [self.stub.SubmitRollouts(never(), metadata=self.md) for _ in range(n)]

    def register_flood(self, n: int) -> None:
        for i in range(n):
            gid = f"x{i:05d}" + "a" * 1018
            self.register(gid)

    def register(self, gid: str) -> None:
        req = pb.RegisterRequest(generator_id=gid)
        self.call("Register", self.stub.Register, req, metadata=self.md, timeout=CALL_DEADLINE_S)

    def bad_groups(self, rng: random.Random, lease: protocol.Lease) -> Iterator[protocol.RolloutGroup]:
        def group(samples: list[protocol.Sample]) -> protocol.RolloutGroup:
            return protocol.RolloutGroup(
                lease.lease_id,
                lease.prompt.prompt_id,
                list(lease.prompt.token_ids),
                samples,
                lease.generator_id,
            )

        ok = protocol.Sample([5, 6, 7], [-1.0, -1.0, -1.0], [0, 0, 0], 1.0, "stop")
        yield group([protocol.Sample([5], [-1.0], [0], 1e200, "stop")] * 4)  # finding 1: reward
        yield group(
            [protocol.Sample([5] * 600, [-1.0] * 600, [0] * 600, 0.0, "length")] * 4
        )  # past maxNewTokens
        yield group([protocol.Sample([2**31 - 1], [-1.0], [0], 0.0, "stop")] * 4)  # past the vocabulary
        yield group(
            [protocol.Sample([5] * 1_000_000, [-1.0] * 1_000_000, [0] * 1_000_000, 0.0, "length")] * 4
        )  # 4 MB x4
        for _ in range(20):  # random mutations of a valid group
            s = [ok] * 4
            k = rng.randrange(6)
            if k == 0:
                s = [
                    protocol.Sample(
                        ok.token_ids, ok.logprobs, [rng.randrange(-5, 10**6)] * 3, ok.reward, "stop"
                    )
                ] * 4
            elif k == 1:
                s = [protocol.Sample(ok.token_ids, [float("nan")] * 3, ok.versions, ok.reward, "stop")] * 4
            elif k == 2:
                s = s[: rng.randrange(4)]
            elif k == 3:
                s = [protocol.Sample(ok.token_ids, ok.logprobs[:1], ok.versions, ok.reward, "stop")] * 4
            elif k == 4:
                s = [
                    protocol.Sample(
                        ok.token_ids,
                        ok.logprobs,
                        ok.versions,
                        rng.uniform(-1e9, 1e9),
                        "?" * rng.randrange(500),
                    )
                ] * 4
            yield group(s)

    def fuzz(self, rng: random.Random, until: float) -> int:
        """Random calls of every RPC until `until`; returns how many were made."""
        n = 0
        while time.monotonic() < until:
            n += 1
            gid = rng.choice(["gen-x", "generator-0", "", "\x00", "é" * rng.randrange(300)])
            k = rng.randrange(6)
            if k == 0:
                self.register(gid)
            elif k == 1:
                req = pb.LeaseRequest(
                    generator_id=gid,
                    max_prompts=rng.randrange(-5, 10**6),
                    wait_s=rng.uniform(-1, 100),
                    incarnation=rng.choice(["", "bogus"]),
                )
                self.call(
                    "LeasePrompts", self.stub.LeasePrompts, req, metadata=self.md, timeout=CALL_DEADLINE_S
                )
            elif k == 2:
                raw = pb.RolloutGroup(
                    lease_id=rng.choice(["", "l-1", "nope"]),
                    prompt_id=rng.randrange(-10, 10),
                    prompt_token_ids=rng.randbytes(rng.randrange(9)),
                    generator_id=gid,
                )
                raw.samples.add(
                    token_ids=rng.randbytes(rng.randrange(13)),
                    logprobs=rng.randbytes(rng.randrange(13)),
                    versions=rng.randbytes(rng.randrange(13)),
                    reward=rng.uniform(-1e308, 1e308),
                )
                self.call(
                    "SubmitRollouts",
                    lambda m=raw: list(
                        self.stub.SubmitRollouts(iter([m]), metadata=self.md, timeout=CALL_DEADLINE_S)
                    ),
                )
            elif k == 3:
                req = pb.ControlRequest(generator_id=gid, incarnation=rng.choice(["", "bogus"]))
                # A stream that outlives its deadline is fine here: Control streams are long-lived.
                try:
                    list(self.stub.Control(req, metadata=self.md, timeout=2.0))
                except grpc.RpcError as err:
                    if err.code() in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL):
                        self.crashes.append(f"Control: {err.code().name} {err.details()}")
            elif k == 4:
                req = pb.PullRequest(generator_id=gid, min_version=rng.randrange(-3, 10**9))
                self.call(
                    "PullWeights",
                    lambda r=req: sum(
                        len(c.data)
                        for c in self.stub.PullWeights(r, metadata=self.md, timeout=CALL_DEADLINE_S)
                    ),
                )
            else:
                self.call(
                    "Status", self.stub.Status, pb.StatusRequest(), metadata=self.md, timeout=CALL_DEADLINE_S
                )
        return n

    def rollout_attacks(self, rng: random.Random) -> None:
        gid = "attacker-0"
        if self.call("Register", self.client.register, gid, ready_timeout_s=CALL_DEADLINE_S) is None:
            return
        batch = self.call("LeasePrompts", self.client.lease_prompts, gid, 2)
        for lease in batch.leases if batch else []:
            self.call("SubmitRollouts", self.client.submit, list(self.bad_groups(rng, lease)))


def test_a_hostile_client_with_the_token_does_not_take_the_job_down(tmp_path: pathlib.Path) -> None:
    run_dir = tmp_path / "run"
    job = write_job(
        tmp_path / "job.yaml",
        resources={"totalGPUs": 3},
        pipeline={"maxLag": 8, "generators": 2},
        training={"totalSteps": STEPS, "checkpoint": {"everySteps": 25}},
    )
    argv = plrl_argv("run", str(job), "--run-dir", str(run_dir))
    log = tmp_path / "plrl-run.log"
    with (
        log.open("w") as sink,
        procs.Tree(argv, env=plrl_env(), stdout=sink, stderr=subprocess.STDOUT) as tree,
    ):
        _wait(lambda: len(report.read_records(run_dir)) >= 2, tree.proc, "2 steps trained")
        attacker = Attacker(run_dir)
        rng = random.Random(SEED)
        release = threading.Event()
        held = attacker.stall(300, release)
        try:
            attacker.register_flood(500)
            attacker.rollout_attacks(rng)
            status = attacker.call("Status", attacker.client.status)
            assert status is not None, f"Status must answer while 300 streams are held: {attacker.last_error}"
            assert tree.proc.poll() is None, "the job ended before the fuzzing (make STEPS larger)"
            calls = attacker.fuzz(rng, time.monotonic() + FUZZ_S)
            assert tree.proc.poll() is None, "the job ended during the fuzzing (make STEPS larger)"
            # The attacks reached the coordinator and were refused there, one by one.
            assert status.refused.get("RESOURCE_EXHAUSTED", 0) > 0, status.refused
            assert status.refused.get("INVALID_ARGUMENT", 0) > 0, status.refused
            assert status.generators <= 3, status  # the registry did not grow with the flood
        finally:
            release.set()
            for call in held:
                call.cancel()
            # The prompts attacker-0 leased would hold the last step until their leases expire (two
            # minutes here); registering its id again re-queues them at once, as for any replaced
            # generator.
            attacker.call("Register", attacker.client.register, "attacker-0", ready_timeout_s=CALL_DEADLINE_S)
            attacker.channel.close()
            attacker.client.close()
        tree.proc.wait(timeout=600)
    out = log.read_text()
    assert tree.proc.returncode == 0, out[-5000:]
    assert attacker.hangs == [] and attacker.crashes == [], (attacker.hangs, attacker.crashes)
    assert calls > 100, calls
    assert "restarting" not in out, out[-5000:]  # no worker crashed (nor was judged hung)
    for worker_log in sorted((run_dir / "logs").glob("*.log")):
        assert "Traceback" not in worker_log.read_text(), worker_log  # nor at the job's end
    rows = report.read_records(run_dir)
    assert [r.step for r in rows] == list(range(1, STEPS + 1))
    a = rows[-1].prompts
    assert a.outstanding == 0 and a.issued == a.trained + a.dropped_by_lag, a
