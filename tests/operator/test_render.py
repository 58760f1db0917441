"""render(job, I): golden files, replica arithmetic, GPU placement, rendezvous env, hashes, CLI.

Cases: the example job and a second job exercising the other branches match their golden YAML
(regenerate with `PLRL_UPDATE_GOLDEN=1 pytest tests/operator/test_render.py` and review the diff);
replicas follow I / gpusPerGenerator and (N - I) / gpusPerTrainer; suspend scales to zero; GPU
requests equal limits; the GPU affinity term joins every user term; tolerations and
nodeSelector pass through; owner references carry the job's uid; the token changes only the
Secret; a bad I names the field; `plrl render` prints a parseable stream.
"""

from __future__ import annotations

import copy
import os
import pathlib
from typing import Any

import pytest
import yaml

from plrl_api import names, spec, worker_config
from plrl_operator import certs, jobfile, render, render_cli

ROOT = pathlib.Path(__file__).resolve().parents[2]
GOLDEN = pathlib.Path(__file__).parent / "golden"
UID = "6a1c1f8e-3b1d-4a57-9a61-2f0c5d7e9b10"


def _example() -> spec.PipelineRLJob:
    job = jobfile.load_job(ROOT / "examples" / "job.yaml")
    job.metadata.uid = UID
    job.metadata.namespace = "default"
    return job


def _second() -> spec.PipelineRLJob:
    """Defaults plus the branches the example does not take."""
    return spec.parse_job(
        {
            "apiVersion": "pipelinerl.io/v1alpha1",
            "kind": "PipelineRLJob",
            "metadata": {"name": "tiny", "namespace": "team-a", "uid": UID},
            "spec": {
                "model": {"name": "/models/tiny"},
                "task": {
                    "name": "jsonl",
                    "dataset": {"configMap": {"name": "prompts", "key": "train.jsonl"}},
                },
                "resources": {
                    "totalGPUs": 12,
                    "gpusPerGenerator": 2,
                    "gpusPerTrainer": 4,
                    "gpuResourceName": "amd.com/gpu",
                    "serviceAccountName": "shared-workers",
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [
                                    {
                                        "matchExpressions": [
                                            {"key": "zone", "operator": "In", "values": ["a"]}
                                        ]
                                    },
                                    {
                                        "matchExpressions": [
                                            {"key": "zone", "operator": "In", "values": ["b"]}
                                        ]
                                    },
                                ]
                            },
                            "preferredDuringSchedulingIgnoredDuringExecution": [
                                {
                                    "weight": 1,
                                    "preference": {
                                        "matchExpressions": [{"key": "fast", "operator": "Exists"}]
                                    },
                                }
                            ],
                        }
                    },
                },
            },
        }
    )


def _by_kind(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def _sts(objects: list[dict[str, Any]], role: str) -> dict[str, Any]:
    return next(
        o for o in objects if o["kind"] == "StatefulSet" and o["metadata"]["labels"][names.LABEL_ROLE] == role
    )


def _container(sts: dict[str, Any]) -> dict[str, Any]:
    c: dict[str, Any] = sts["spec"]["template"]["spec"]["containers"][0]
    return c


@pytest.mark.parametrize(("name", "make", "generators"), [("example", _example, 6), ("second", _second, 4)])
def test_golden(name: str, make: Any, generators: int) -> None:
    text = render_cli.dump(render.render(make(), generators))
    path = GOLDEN / f"render-{name}.yaml"
    if os.environ.get("PLRL_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"render output changed; review and regenerate {path.name}"


def test_example_job_is_valid_and_sized_as_documented() -> None:
    job = jobfile.load_job(ROOT / "examples" / "job.yaml")
    assert job.spec.resources.total_gpus == 16 and job.spec.pipeline.generators == 6
    assert job.metadata.namespace is None  # `kubectl apply -n NS` must be able to place it


def test_render_is_deterministic_and_does_not_mutate_the_job() -> None:
    job = _example()
    before = job.model_dump()
    assert render.render(job, 6) == render.render(copy.deepcopy(job), 6)
    assert job.model_dump() == before


def test_order_puts_dependencies_first() -> None:
    kinds = [o["kind"] for o in render.render(_example(), 6)]
    assert kinds == [
        "ConfigMap", "Secret", "Secret", "ServiceAccount", "RoleBinding",
        "Service", "Service", "NetworkPolicy", "StatefulSet", "StatefulSet",
    ]  # fmt: skip


@pytest.mark.parametrize(("generators", "gen_pods", "train_pods"), [(6, 6, 5), (2, 2, 7), (12, 12, 2)])
def test_replicas_follow_i_and_gpus_per_pod(generators: int, gen_pods: int, train_pods: int) -> None:
    objects = render.render(_example(), generators)  # N=16, 1 GPU per generator, 2 per trainer
    assert _sts(objects, "generator")["spec"]["replicas"] == gen_pods
    assert _sts(objects, "trainer")["spec"]["replicas"] == train_pods
    # The trainers read the plan: their world size is N - I. Generators need none.
    pods = _worker_config(objects, "trainer").pods()
    assert (pods.trainer_pods, pods.trainer_gpus) == (train_pods, 16 - generators)
    assert pods.generator_pods == gen_pods
    assert _worker_config(objects, "generator").plan is None


def test_a_change_of_i_rolls_the_trainers_and_leaves_the_generators_alone() -> None:
    # What the autoscaler relies on: generator pods that stay are not restarted when I changes.
    six, eight = render.render(_example(), 6), render.render(_example(), 8)
    gen6, gen8 = _sts(six, "generator")["spec"], _sts(eight, "generator")["spec"]
    assert gen6["template"] == gen8["template"]
    assert (gen6["replicas"], gen8["replicas"]) == (6, 8)
    assert _sts(six, "trainer")["spec"]["template"] != _sts(eight, "trainer")["spec"]["template"]


def test_suspend_scales_both_to_zero_and_changes_only_replicas() -> None:
    job = _example()
    running = render.render(job, 6)
    job.spec.suspend = True
    suspended = render.render(job, 6)
    for role in names.ROLES:
        a, b = _sts(running, role), _sts(suspended, role)
        assert b["spec"]["replicas"] == 0
        assert a["spec"]["template"] == b["spec"]["template"], "suspend must not roll the pods"
        assert (
            a["metadata"]["annotations"][names.ANNOTATION_DESIRED_HASH]
            != b["metadata"]["annotations"][names.ANNOTATION_DESIRED_HASH]
        )


def test_gpu_requests_equal_limits_per_role() -> None:
    objects = render.render(_second(), 4)
    for role, gpus in (("generator", "2"), ("trainer", "4")):
        res = _container(_sts(objects, role))["resources"]
        assert res["requests"]["amd.com/gpu"] == res["limits"]["amd.com/gpu"] == gpus
    assert _sts(objects, "generator")["spec"]["replicas"] == 2
    assert _sts(objects, "trainer")["spec"]["replicas"] == 2


def test_gpu_affinity_is_added_to_every_user_term_and_preferences_kept() -> None:
    affinity = _sts(render.render(_second(), 4), "trainer")["spec"]["template"]["spec"]["affinity"]
    terms = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert len(terms) == 2
    for term, zone in zip(terms, ["a", "b"], strict=True):
        assert {"key": "zone", "operator": "In", "values": [zone]} in term["matchExpressions"]
        assert {"key": "amd.com/gpu.present", "operator": "In", "values": ["true"]} in term[
            "matchExpressions"
        ]
    assert affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["weight"] == 1


def test_placement_fields_pass_through() -> None:
    pod = _sts(render.render(_example(), 6), "generator")["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert terms == [
        {"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}]}
    ]


def test_every_child_is_owned_by_the_job_and_labelled() -> None:
    objects = render.render(_example(), 6)
    # But the checkpoint key, which outlives the job (as its checkpoint volume does).
    (key,) = [o for o in objects if o["metadata"]["name"] == "qwen-math-checkpoint-key"]
    assert "ownerReferences" not in key["metadata"] and names.LABEL_JOB not in key["metadata"]["labels"]
    assert key["metadata"]["labels"] == {names.LABEL_CHECKPOINT_KEY_OF: "qwen-math"}
    for obj in objects:
        if obj is key:
            continue
        assert obj["metadata"]["ownerReferences"] == [
            {
                "apiVersion": "pipelinerl.io/v1alpha1",
                "kind": "PipelineRLJob",
                "name": "qwen-math",
                "uid": UID,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        assert obj["metadata"]["labels"][names.LABEL_JOB] == "qwen-math"
        assert obj["metadata"]["namespace"] == "default"


def test_a_job_from_a_file_has_no_owner() -> None:
    job = _example()
    job.metadata.uid = None
    assert all("ownerReferences" not in o["metadata"] for o in render.render(job, 6))


def _worker_config(objects: list[dict[str, Any]], role: names.Role) -> worker_config.WorkerConfig:
    cm = next(o for o in objects if o["kind"] == "ConfigMap")
    return worker_config.WorkerConfig.model_validate_json(cm["data"][f"{role}.json"])


def test_roles_start_the_worker_with_their_config_file() -> None:
    objects = render.render(_example(), 6)
    for role in names.ROLES:
        c = _container(_sts(objects, role))
        assert c["command"] == ["plrl-worker", "--role", role, "--config", f"/etc/plrl/{role}.json"]
        assert {"name": "config", "mountPath": "/etc/plrl", "readOnly": True} in c["volumeMounts"]
        assert _worker_config(objects, role).role == role


def test_peers_come_from_services_and_the_pod_index_not_hostfiles() -> None:
    objects = render.render(_example(), 6)
    trainer0 = "qwen-math-train-0.qwen-math-train.default.svc"
    for role in names.ROLES:
        ep = _worker_config(objects, role).endpoints
        assert ep.coordinator == f"{trainer0}:50051" and ep.rendezvous == f"{trainer0}:29500"
        assert ep.weight_sync == f"{trainer0}:29600"
        env = {e["name"]: e for e in _container(_sts(objects, role))["env"]}
        # Who the pod is comes from the downward API; everything else is in the config file (but
        # where to write: the root filesystem is read-only).
        assert sorted(env) == sorted(
            [
                names.ENV_NAMESPACE,
                names.ENV_POD_NAME,
                names.ENV_POD_UID,
                names.ENV_POD_INDEX,
                names.ENV_TOKEN_FILE,
                "HOME",
                "TMPDIR",
            ]
        )
        assert env["HOME"]["value"] == env["TMPDIR"]["value"] == names.SCRATCH_DIR
        assert env["PLRL_POD_UID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"
        assert env["PLRL_POD_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"] == (
            "metadata.labels['apps.kubernetes.io/pod-index']"
        )
        # The token is a file from the job's Secret, never an env var (env is readable in /proc
        # and inherited by every child process).
        assert env["PLRL_TOKEN_FILE"] == {"name": "PLRL_TOKEN_FILE", "value": names.TOKEN_FILE}
        pod = _sts(objects, role)["spec"]["template"]["spec"]
        (secret,) = [v for v in pod["volumes"] if v["name"] == "secret"]
        assert secret["projected"]["sources"] == [
            {"secret": {"name": "qwen-math-token"}},
            {"secret": {"name": "qwen-math-checkpoint-key"}},
        ]
        mounts = {m["name"]: m for m in _container(_sts(objects, role))["volumeMounts"]}
        assert mounts[secret["name"]] == {"name": "secret", "mountPath": names.SECRET_DIR, "readOnly": True}
        assert not any("secretKeyRef" in str(e) for e in env.values())
    svc = _by_kind(objects)[("Service", "qwen-math-train")]
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    assert _sts(objects, "trainer")["spec"]["serviceName"] == "qwen-math-train"
    assert _sts(objects, "trainer")["spec"]["podManagementPolicy"] == "Parallel"


def test_token_and_tls_files_change_only_the_secret() -> None:
    tls = certs.job_tls()
    a, b = render.render(_example(), 6, token="one"), render.render(_example(), 6, token="two", tls=tls)
    differ = [x["metadata"]["name"] for x, y in zip(a, b, strict=True) if x != y]
    assert differ == ["qwen-math-token"]
    secret = _by_kind(b)[("Secret", "qwen-math-token")]
    assert secret["stringData"] == {"token": "two"} | {k: v.decode() for k, v in tls.items()}
    assert set(tls) == {names.TLS_CA_KEY, names.TLS_CERT_KEY, names.TLS_KEY_KEY}
    assert names.ANNOTATION_DESIRED_HASH not in secret["metadata"]["annotations"], "no digest of the token"


def test_edits_change_the_hash_of_what_they_touch() -> None:
    job = _example()
    base = {
        k: o["metadata"]["annotations"].get(names.ANNOTATION_DESIRED_HASH)
        for k, o in _by_kind(render.render(job, 6)).items()
    }
    job.spec.resources.image = "ghcr.io/pipelinerl/plrl-worker:0.2.0"
    after = {
        k: o["metadata"]["annotations"].get(names.ANNOTATION_DESIRED_HASH)
        for k, o in _by_kind(render.render(job, 6)).items()
    }
    assert {k for k in base if base[k] != after[k]} == {
        ("StatefulSet", "qwen-math-gen"),
        ("StatefulSet", "qwen-math-train"),
        ("ConfigMap", "qwen-math-config"),
    }


def test_the_network_policy_admits_the_job_s_workers_and_only_the_named_scrapers() -> None:
    job = _example()
    (policy,) = [o for o in render.render(job, 6) if o["kind"] == "NetworkPolicy"]
    workers = {"matchLabels": {names.LABEL_JOB: "qwen-math"}}
    assert policy["metadata"]["name"] == "qwen-math-workers"
    # Every worker pod of this job, and only this job's pods, on every port (the rendezvous stores
    # and NCCL/gloo use ports chosen at run time); egress is not restricted.
    assert policy["spec"] == {
        "podSelector": workers,
        "policyTypes": ["Ingress"],
        "ingress": [{"from": [{"podSelector": workers}]}],
    }

    job.spec.network = spec.NetworkSpec.model_validate(
        {
            "metricsFrom": [
                {"namespaceSelector": {"name": "monitoring"}, "podSelector": {"app": "prometheus"}},
                {},
            ]
        }
    )
    (policy,) = [o for o in render.render(job, 6) if o["kind"] == "NetworkPolicy"]
    scrape = policy["spec"]["ingress"][1]
    assert scrape == {
        "from": [
            {
                "podSelector": {"matchLabels": {"app": "prometheus"}},
                "namespaceSelector": {"matchLabels": {"name": "monitoring"}},
            },
            {"podSelector": {"matchLabels": {}}},  # any pod of the job's namespace
        ],
        "ports": [{"protocol": "TCP", "port": names.PORT_METRICS}],
    }

    # Only the policy changed: workers never read `network`, so a new scraper rolls no pod.
    before = _by_kind(render.render(_example(), 6))
    after = _by_kind(render.render(job, 6))
    assert [k for k in before if before[k] != after[k]] == [("NetworkPolicy", "qwen-math-workers")]

    job.spec.network.network_policy = False  # the cluster's own policies apply instead
    assert not [o for o in render.render(job, 6) if o["kind"] == "NetworkPolicy"]


def test_workers_are_bound_to_the_chart_s_cluster_role_in_their_namespace_only() -> None:
    """The operator writes no Role (it could only grant what it holds, but a Role it writes is
    still a role it can change): a RoleBinding in the job's namespace grants the chart's ClusterRole."""
    objects = render.render(_example(), 6, worker_role="team-plrl-worker")
    assert not [o for o in objects if o["kind"] in ("Role", "ClusterRole", "ClusterRoleBinding")]
    (binding,) = [o for o in objects if o["kind"] == "RoleBinding"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "team-plrl-worker",
    }
    pod = _sts(objects, "generator")["spec"]["template"]["spec"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": "default"}
    ]


def test_own_service_account_skips_worker_rbac() -> None:
    objects = render.render(_second(), 4)
    assert not [o for o in objects if o["kind"] in ("ServiceAccount", "Role", "RoleBinding")]
    assert _sts(objects, "generator")["spec"]["template"]["spec"]["serviceAccountName"] == "shared-workers"


@pytest.mark.parametrize(
    ("generators", "message"), [(16, "between 1 and"), (0, "between 1 and"), (5, "tile")]
)
def test_bad_generators_are_refused(generators: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        render.render(_example(), generators)


def test_render_cli_prints_a_stream(capsys: pytest.CaptureFixture[str]) -> None:
    job = str(ROOT / "examples" / "job.yaml")
    assert render_cli.main([job, "--generators", "8", "--worker-cluster-role", "plrl-worker"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert len(docs) == 10
    assert next(d for d in docs if d["kind"] == "RoleBinding")["roleRef"]["name"] == "plrl-worker"
    assert _sts(docs, "generator")["spec"]["replicas"] == 8
    assert _sts(docs, "trainer")["spec"]["replicas"] == 4


def test_render_cli_names_the_problem(capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path) -> None:
    assert render_cli.main([str(ROOT / "examples" / "job.yaml"), "--generators", "7"]) == 2
    assert "--generators" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: pipelinerl.io/v1alpha1\nkind: PipelineRLJob\nmetadata: {name: x}\nspec: {suspnd: true}\n"
    )
    assert render_cli.main([str(bad)]) == 2
    assert "spec.suspnd: unknown field" in capsys.readouterr().err
