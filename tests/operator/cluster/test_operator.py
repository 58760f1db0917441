"""The operator against the real control plane, authenticated as the chart's ServiceAccount.

Cases: `kubectl apply -f examples/job.yaml` into a namespace enforcing Pod Security "restricted"
gives both StatefulSets with the right replicas, GPU
requests, affinity and tolerations, every pod on a matching (tainted, right-product) fake GPU node
and none on a decoy, the job Running, `kubectl get plrljobs` (and `-o wide`) showing the columns,
`kubectl describe` showing conditions and events, /metrics counting it; too few GPUs leaves pods
Pending and the job's condition says why; an edit of I and the image rolls into both StatefulSets;
suspend scales both to zero and resume brings them back; a running job costs no writes, and an
operator restart changes no object; a trainer that keeps crashing uses up
`failurePolicy.maxRestarts` and the job ends Failed (condition and Events naming the pod and exit
code, RESTARTS column, StatefulSets at zero), which a restarted operator keeps; a second replica
stays paused (kopf peering) and takes over when the first stops; deleting the job leaves no child
behind.
"""

from __future__ import annotations

import base64
import json
import pathlib
from collections.abc import Callable
from typing import Any

import pytest
from cryptography import x509

from plrl_api import names
from tests.infra import node_agent, nodes, tools
from tests.operator.cluster import support
from tests.operator.cluster.support import eventually

pytestmark = pytest.mark.cluster
PSA_ENFORCE = "pod-security.kubernetes.io/enforce"
ROOT = pathlib.Path(__file__).resolve().parents[3]
CHILD_KINDS = (
    "configmaps,secrets,serviceaccounts,roles,rolebindings,services,networkpolicies,statefulsets,pods"
)


def _get(kubectl: tools.Tool, *args: str) -> dict[str, Any] | None:
    out = kubectl("get", *args, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def _refused_by_pod_security(kubectl: tools.Tool, ns: str) -> str | None:
    """Why the API server refuses a plain pod (no securityContext) in `ns`, once it says PodSecurity."""
    out = kubectl("run", "plain", "--image=busybox", "--dry-run=server", "-n", ns, check=False)
    return out.stderr if out.returncode != 0 and "PodSecurity" in out.stderr else None


def _status(kubectl: tools.Tool, ns: str, name: str) -> dict[str, Any]:
    job = _get(kubectl, "plrljob", name, "-n", ns) or {}
    return dict(job.get("status", {}))


def _phase_is(kubectl: tools.Tool, ns: str, name: str, phase: str, **fields: Any) -> Callable[[], bool]:
    def check() -> bool:
        s = _status(kubectl, ns, name)
        return s.get("phase") == phase and all(s.get(k) == v for k, v in fields.items())

    return check


def _pods(kubectl: tools.Tool, ns: str, job: str) -> list[dict[str, Any]]:
    out = _get(kubectl, "pods", "-n", ns, "-l", f"pipelinerl.io/job={job}") or {"items": []}
    return [p for p in out["items"] if not p["metadata"].get("deletionTimestamp")]


def _volumes(kubectl: tools.Tool, ns: str) -> None:
    """Pre-bound hostPath volumes for the example's two claims (no provisioner here)."""
    docs = []
    for claim, mode in (("plrl-models", "ReadOnlyMany"), ("plrl-checkpoints", "ReadWriteMany")):
        pv = f"{ns}-{claim}"
        docs += [
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": pv},
                "spec": {
                    "capacity": {"storage": "10Gi"},
                    "accessModes": [mode],
                    "hostPath": {"path": f"/tmp/{pv}"},
                    "storageClassName": "",
                    "claimRef": {"namespace": ns, "name": claim},
                },
            },
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": claim, "namespace": ns},
                "spec": {
                    "accessModes": [mode],
                    "resources": {"requests": {"storage": "10Gi"}},
                    "storageClassName": "",
                    "volumeName": pv,
                },
            },
        ]
    kubectl("apply", "-f", "-", input="\n---\n".join(support.dump(d) for d in docs))


def test_example_job_runs_on_matching_gpu_nodes(
    operator: support.Operator, kubectl: tools.Tool, namespace: str, gpu_nodes: Callable[..., nodes.Pool]
) -> None:
    taint = nodes.Taint("nvidia.com/gpu", "", "NoSchedule")
    pool = gpu_nodes(3, taints=(taint,))  # 24 x H100, tainted: only pods that tolerate it land here
    decoy = gpu_nodes(1, product="NVIDIA-A100-SXM4-80GB")  # GPUs, untainted, but the wrong product
    _volumes(kubectl, namespace)
    # The API server's built-in Pod Security admission judges every worker pod the StatefulSets make.
    kubectl("label", "namespace", namespace, f"{PSA_ENFORCE}=restricted")
    kubectl("apply", "-n", namespace, "-f", str(ROOT / "examples" / "job.yaml"))

    gen = eventually(
        lambda: _get(kubectl, "statefulset", "qwen-math-gen", "-n", namespace), 30, "generator StatefulSet"
    )
    train = eventually(
        lambda: _get(kubectl, "statefulset", "qwen-math-train", "-n", namespace), 30, "trainer StatefulSet"
    )
    assert (gen["spec"]["replicas"], train["spec"]["replicas"]) == (6, 5)  # I=6 x 1 GPU, 10 GPUs / 2 per pod
    for sts, gpus in ((gen, "1"), (train, "2")):
        pod = sts["spec"]["template"]["spec"]
        res = pod["containers"][0]["resources"]
        assert res["requests"]["nvidia.com/gpu"] == res["limits"]["nvidia.com/gpu"] == gpus
        terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"
        ]
        assert terms[0]["matchExpressions"] == [
            {"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}
        ]
        assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
        assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
        assert sts["metadata"]["ownerReferences"][0]["kind"] == "PipelineRLJob"
    # Accepted by the API server (enforcing it is the CNI's; this control plane has none).
    policy = _get(kubectl, "networkpolicy", "qwen-math-workers", "-n", namespace)
    assert policy is not None
    assert policy["spec"]["podSelector"] == {"matchLabels": {"pipelinerl.io/job": "qwen-math"}}
    assert policy["metadata"]["ownerReferences"][0]["kind"] == "PipelineRLJob"

    eventually(_phase_is(kubectl, namespace, "qwen-math", "Running", ready="11/11"), 90, "job Running")
    # ... and it does enforce "restricted" here: a pod with none of the workers' settings is refused.
    refused = eventually(
        lambda: _refused_by_pod_security(kubectl, namespace), 30, "PodSecurity refusing a pod"
    )
    assert 'violates PodSecurity "restricted:latest"' in refused
    placed = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in _pods(kubectl, namespace, "qwen-math")}
    assert len(placed) == 11
    assert set(placed.values()) <= set(pool.nodes), placed
    assert not set(placed.values()) & set(decoy.nodes)
    kubectl("delete", "pv", f"{namespace}-plrl-models", f"{namespace}-plrl-checkpoints", "--wait=false")

    table = kubectl("get", "plrljobs", "-n", namespace).stdout.splitlines()
    assert table[0].split() == [
        "NAME", "PHASE", "GEN", "TRAIN", "STEP", "LAG", "REWARD", "TOK/S", "RESTARTS", "AGE"
    ]  # fmt: skip
    assert table[1].split()[:4] == ["qwen-math", "Running", "6", "10"]
    wide = kubectl("get", "plrljob", "qwen-math", "-n", namespace, "-o", "wide").stdout.splitlines()
    assert wide[0].split() == [
        "NAME", "PHASE", "GEN", "TRAIN", "READY", "STEP", "WEIGHTS", "LAG", "REWARD", "TOK/S", "RESTARTS",
        "GEN-TOK/S", "SCHEDULING", "AGE",
    ]  # fmt: skip
    assert "11/11" in wide[1] and "AllPodsScheduled" in wide[1]

    describe = eventually(
        lambda: (
            (d := kubectl("describe", "plrljob", "qwen-math", "-n", namespace).stdout)
            and "PhaseChanged" in d
            and d
        ),
        30,
        "events in describe",
    )
    for text in (
        "Conditions:",
        "AllPodsReady",
        "PodsScheduled",
        "Created",
        "applied 10 objects",
        "-> Running",
    ):
        assert text in describe, describe

    assert operator.total("plrl_operator_jobs", phase="Running") >= 1
    assert operator.total("plrl_operator_reconciles_total", trigger="create") >= 1
    assert operator.total("plrl_operator_reconcile_duration_seconds_count") >= 1
    assert operator.total("plrl_operator_object_writes_total", kind="StatefulSet") >= 2

    secret = _get(kubectl, "secret", "qwen-math-token", "-n", namespace)
    assert secret is not None and len(secret["data"]["token"]) >= 40  # random, base64: not the placeholder
    # The job's own CA and the coordinator's certificate for TLS: made once, with the Secret.
    ca = x509.load_pem_x509_certificate(base64.b64decode(secret["data"][names.TLS_CA_KEY]))
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"][names.TLS_CERT_KEY]))
    assert cert.issuer == ca.subject and names.TLS_KEY_KEY in secret["data"]
    assert names.TLS_SERVER_NAME in str(cert.extensions.get_extension_for_class(x509.SubjectAlternativeName))
    can = kubectl(
        "auth", "can-i", "update", "leases.coordination.k8s.io",
        f"--as=system:serviceaccount:{namespace}:qwen-math-worker", "-n", namespace, check=False,
    )  # fmt: skip
    assert can.stdout.strip() == "yes", "workers may renew their Leases"


def test_too_few_gpus_stays_pending_and_says_why(
    operator: support.Operator, kubectl: tools.Tool, namespace: str, gpu_nodes: Callable[..., nodes.Pool]
) -> None:
    pool = gpu_nodes(1, gpus=3)  # the job needs 4
    doc = support.small_job("starved", resources={"nodeSelector": {nodes.POOL_LABEL: pool.name}})
    kubectl("apply", "-n", namespace, "-f", "-", input=support.dump(doc))

    def unschedulable() -> dict[str, Any] | None:
        s = _status(kubectl, namespace, "starved")
        cond = next((c for c in s.get("conditions", []) if c["type"] == "PodsScheduled"), None)
        return cond if cond and cond["reason"] == "Unschedulable" else None

    cond = eventually(unschedulable, 60, "PodsScheduled=False/Unschedulable")
    assert cond["status"] == "False"
    assert "Insufficient nvidia.com/gpu" in cond["message"] and "needs 4 x nvidia.com/gpu" in cond["message"]
    assert _status(kubectl, namespace, "starved")["phase"] == "Pending"
    pending = [p for p in _pods(kubectl, namespace, "starved") if not p["spec"].get("nodeName")]
    assert pending and all(p["status"]["phase"] == "Pending" for p in pending)
    describe = eventually(
        lambda: (
            (d := kubectl("describe", "plrljob", "starved", "-n", namespace).stdout) and "Warning" in d and d
        ),
        30,
        "the Unschedulable event",
    )
    assert "Unschedulable" in describe and "Insufficient nvidia.com/gpu" in describe
    wide = kubectl("get", "plrljob", "starved", "-n", namespace, "-o", "wide").stdout
    assert "Unschedulable" in wide


def _running_small_job(
    kubectl: tools.Tool,
    namespace: str,
    gpu_nodes: Callable[..., nodes.Pool],
    name: str,
    resources: dict[str, Any] | None = None,
    ready: str = "4/4",
    **spec: Any,
) -> dict[str, Any]:
    pool = gpu_nodes(1)
    placed = {"totalGPUs": 6, "nodeSelector": {nodes.POOL_LABEL: pool.name}, **(resources or {})}
    doc = support.small_job(name, resources=placed, **spec)
    kubectl("apply", "-n", namespace, "-f", "-", input=support.dump(doc))
    eventually(_phase_is(kubectl, namespace, name, "Running", ready=ready), 60, f"{name} Running")
    return doc


def _replicas(kubectl: tools.Tool, ns: str, job: str) -> tuple[int, int]:
    gen = _get(kubectl, "statefulset", f"{job}-gen", "-n", ns) or {}
    train = _get(kubectl, "statefulset", f"{job}-train", "-n", ns) or {}
    return gen.get("spec", {}).get("replicas", -1), train.get("spec", {}).get("replicas", -1)


def test_edit_rolls_into_both_statefulsets(
    operator: support.Operator, kubectl: tools.Tool, namespace: str, gpu_nodes: Callable[..., nodes.Pool]
) -> None:
    _running_small_job(kubectl, namespace, gpu_nodes, "edited")
    assert _replicas(kubectl, namespace, "edited") == (2, 2)
    patch = {
        "spec": {
            "pipeline": {"generators": 4},
            "resources": {"image": "ghcr.io/pipelinerl/plrl-worker:0.2.0"},
        }
    }
    kubectl("patch", "plrljob", "edited", "-n", namespace, "--type=merge", "-p", json.dumps(patch))
    eventually(
        lambda: _replicas(kubectl, namespace, "edited") == (4, 1), 30, "replicas 4 generators, 1 trainer"
    )
    for role in ("gen", "train"):
        sts = _get(kubectl, "statefulset", f"edited-{role}", "-n", namespace) or {}
        assert sts["spec"]["template"]["spec"]["containers"][0]["image"].endswith(":0.2.0")
    eventually(
        _phase_is(kubectl, namespace, "edited", "Running", generators=4, trainers=2, ready="5/5"),
        60,
        "rolled out",
    )
    images = {p["spec"]["containers"][0]["image"] for p in _pods(kubectl, namespace, "edited")}
    assert images == {"ghcr.io/pipelinerl/plrl-worker:0.2.0"}
    assert "Updated" in kubectl("describe", "plrljob", "edited", "-n", namespace).stdout


def test_suspend_and_resume(
    operator: support.Operator, kubectl: tools.Tool, namespace: str, gpu_nodes: Callable[..., nodes.Pool]
) -> None:
    _running_small_job(kubectl, namespace, gpu_nodes, "pausable")
    kubectl(
        "patch", "plrljob", "pausable", "-n", namespace, "--type=merge", "-p", '{"spec":{"suspend":true}}'
    )
    eventually(lambda: _replicas(kubectl, namespace, "pausable") == (0, 0), 30, "both StatefulSets at 0")
    eventually(lambda: not _pods(kubectl, namespace, "pausable"), 60, "pods gone")
    eventually(_phase_is(kubectl, namespace, "pausable", "Suspended", ready="0/0"), 30, "Suspended")
    kubectl(
        "patch", "plrljob", "pausable", "-n", namespace, "--type=merge", "-p", '{"spec":{"suspend":false}}'
    )
    eventually(lambda: _replicas(kubectl, namespace, "pausable") == (2, 2), 30, "replicas restored")
    eventually(_phase_is(kubectl, namespace, "pausable", "Running", ready="4/4"), 60, "Running again")
    describe = eventually(
        lambda: (
            (d := kubectl("describe", "plrljob", "pausable", "-n", namespace).stdout) and "Resumed" in d and d
        ),
        30,
        "the Resumed event",
    )
    assert "Suspended" in describe


def _versions(kubectl: tools.Tool, ns: str, job: str) -> dict[str, str]:
    """resourceVersion of the job and of every child the operator writes (not pods: the agent's)."""
    out = {"job": (_get(kubectl, "plrljob", job, "-n", ns) or {})["metadata"]["resourceVersion"]}
    items = (
        _get(kubectl, CHILD_KINDS.replace(",pods", ""), "-n", ns, "-l", f"pipelinerl.io/job={job}") or {}
    )["items"]
    for item in items:
        out[f"{item['kind']}/{item['metadata']['name']}"] = item["metadata"]["resourceVersion"]
    return out


def _timer_ticks(operator: support.Operator, n: int) -> None:
    """Wait until the operator's timer has reconciled `n` more times (its own counter says so)."""
    start = operator.total("plrl_operator_reconciles_total", trigger="timer")
    eventually(
        lambda: operator.total("plrl_operator_reconciles_total", trigger="timer") >= start + n,
        30,
        f"{n} timer ticks",
    )


def _settled(operator: support.Operator, kubectl: tools.Tool, ns: str, job: str) -> dict[str, str]:
    """The job's objects once two timer ticks in a row changed none of them."""

    def unchanged() -> dict[str, str] | None:
        before = _versions(kubectl, ns, job)
        _timer_ticks(operator, 2)
        return before if _versions(kubectl, ns, job) == before else None

    settled: dict[str, str] = eventually(unchanged, 60, f"{job}'s objects to stop changing")
    return settled


def test_steady_job_and_operator_restart_issue_no_writes(
    operator: support.Operator, kubectl: tools.Tool, namespace: str, gpu_nodes: Callable[..., nodes.Pool]
) -> None:
    _running_small_job(kubectl, namespace, gpu_nodes, "steady")
    before = _settled(operator, kubectl, namespace, "steady")
    # Other tests' jobs may still be terminating with their namespaces: count only this one's writes.
    writes = operator.writes_to(namespace)
    assert writes, "the log must show this job's creation writes, or the check below proves nothing"
    _timer_ticks(operator, 4)
    assert operator.writes_to(namespace) == writes, "a steady job must cost no write"
    assert _versions(kubectl, namespace, "steady") == before
    operator.restart()
    ticks = operator.total("plrl_operator_reconciles_total", trigger="timer")
    eventually(
        lambda: operator.total("plrl_operator_reconciles_total", trigger="timer") >= ticks + 3, 30, "ticks"
    )
    assert operator.total("plrl_operator_reconciles_total", trigger="resume") >= 1
    assert operator.writes_to(namespace) == [], "the restarted operator wrote to this job's namespace"
    assert _versions(kubectl, namespace, "steady") == before, "the restarted operator changed an object"


def test_two_replicas_one_active_and_failover(
    operator: support.Operator, kubectl: tools.Tool, namespace: str, gpu_nodes: Callable[..., nodes.Pool]
) -> None:
    """kopf peering: a second replica with lower priority pauses, and takes over when the first stops."""
    standby = support.Operator(operator.kubeconfig, operator.log_dir, "--priority=0", name="standby")
    standby.start()
    try:

        def peers() -> int:
            peering = _get(kubectl, "clusterkopfpeering", support.PEERING) or {}
            return len(peering.get("status") or {})

        eventually(lambda: peers() == 2, 30, "both replicas in the peering object")
        # kopf starts paused and stays so (silently) once it sees a live peer of higher priority.
        _running_small_job(kubectl, namespace, gpu_nodes, "ha")
        assert operator.writes_to(namespace) and not standby.writes_to(namespace), "the standby must pause"
        operator.stop()  # a graceful exit removes its peering record: the standby resumes at once
        eventually(lambda: peers() == 1, 30, "the stopped replica to leave the peering object")
        eventually(lambda: "Resuming operations" in standby.log.read_text(), 30, "the standby to resume")
        kubectl("patch", "plrljob", "ha", "-n", namespace, "--type=merge", "-p", '{"spec":{"suspend":true}}')
        eventually(lambda: _replicas(kubectl, namespace, "ha") == (0, 0), 30, "the standby to act")
        assert standby.writes_to(namespace)
    finally:
        standby.stop()
        operator.restart()


def test_a_trainer_that_keeps_failing_uses_up_its_restarts_and_the_job_fails(
    operator: support.Operator, kubectl: tools.Tool, namespace: str, gpu_nodes: Callable[..., nodes.Pool]
) -> None:
    # One trainer pod (of 4 GPUs): the kubelet's restart of its container restarts the whole trainer
    # group. With several trainer pods the operator would replace them all after the first crash
    # (`decide.trainer_group`), and the replacements would not carry this test's crash annotation.
    _running_small_job(
        kubectl,
        namespace,
        gpu_nodes,
        "crashy",
        resources={"gpusPerTrainer": 4},
        ready="3/3",
        failurePolicy={"maxRestarts": 2},
    )
    trainer = "crashy-train-0"
    # The fake kubelet now reports the trainer's container crash-looping with exit code 3, one
    # more restart a second (tests/infra/node_agent.py), as a real kubelet would for a bad worker.
    kubectl("annotate", "pod", trainer, "-n", namespace, f"{node_agent.StatusOnlyRunner.CRASH_ANNOTATION}=3")
    eventually(_phase_is(kubectl, namespace, "crashy", "Failed"), 60, "crashy Failed")
    s = _status(kubectl, namespace, "crashy")
    assert s["restarts"] == 2  # the two allowed restarts; the third failure ended the job
    failed = next(c for c in s["conditions"] if c["type"] == "Failed")
    assert failed["status"] == "True" and failed["reason"] == "RestartsExhausted"
    assert failed["message"].startswith(f"trainer {trainer} exited with code 3: container trainer: Error: ")
    assert "spec.failurePolicy.maxRestarts=2 restarts are used up" in failed["message"]
    assert s.get("completionTime")
    # A failed job holds no accelerators: both StatefulSets scale to zero and the pods go.
    eventually(lambda: _replicas(kubectl, namespace, "crashy") == (0, 0), 30, "both StatefulSets at 0")
    eventually(lambda: not _pods(kubectl, namespace, "crashy"), 60, "pods gone")
    describe = kubectl("describe", "plrljob", "crashy", "-n", namespace).stdout
    assert describe.count("WorkerRestarted") >= 1 and "JobFailed" in describe
    table = kubectl("get", "plrljob", "crashy", "-n", namespace).stdout.splitlines()
    column = table[0].index("RESTARTS")  # empty cells (STEP, LAG, ...) are blanks: read by position
    assert table[1][column:].split()[0] == "2", table
    # The outcome lives in the API server: a restarted operator neither repeats nor forgets it.
    operator.restart()
    _timer_ticks(operator, 3)
    again = _status(kubectl, namespace, "crashy")
    assert (again["phase"], again["restarts"]) == ("Failed", 2)
    assert _replicas(kubectl, namespace, "crashy") == (0, 0)


def test_delete_leaves_nothing_behind(
    operator: support.Operator, kubectl: tools.Tool, namespace: str, gpu_nodes: Callable[..., nodes.Pool]
) -> None:
    _running_small_job(kubectl, namespace, gpu_nodes, "doomed")
    assert (
        len((_get(kubectl, CHILD_KINDS, "-n", namespace, "-l", "pipelinerl.io/job=doomed") or {})["items"])
        == 13
    )
    kubectl("delete", "plrljob", "doomed", "-n", namespace, "--wait=true", "--timeout=60s")

    def leftovers() -> list[str]:
        items = (_get(kubectl, CHILD_KINDS, "-n", namespace, "-l", "pipelinerl.io/job=doomed") or {})["items"]
        return [f"{i['kind']}/{i['metadata']['name']}" for i in items]

    eventually(lambda: not leftovers(), 60, "garbage collection of every child")
    # Only the checkpoint key stays, as the checkpoint volume does: applied again, the job resumes.
    key = _get(kubectl, "secret", "doomed-checkpoint-key", "-n", namespace)
    assert key is not None and "ownerReferences" not in key["metadata"]
