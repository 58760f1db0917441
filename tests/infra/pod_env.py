"""A container's environment and command line, resolved the way a kubelet does. Pure.

`container_env` layers, later winning: the image's ENV, the Service environment (`KUBERNETES_SERVICE_HOST`
and friends; with `enableServiceLinks` every ClusterIP Service of the pod's namespace too), `envFrom`,
then `env` in order. `env` values may be literals with `$(VAR)` references to variables defined before
them (`$$` escapes), `fieldRef` (the downward API: metadata name, namespace, uid, labels['k'],
annotations['k'], spec nodeName and serviceAccountName, status podIP(s) and hostIP(s)),
`resourceFieldRef`, `secretKeyRef` or `configMapKeyRef`. A missing object or key fails with the
kubelet's message (the runner reports it as `CreateContainerConfigError` and retries), unless the
reference is `optional`. `command_line` expands `$(VAR)` in command and args the same way.

Neighbours: pod_runner.py (supplies the lookups, reports the errors), pod_fs.py (volumes, the other half
of what a container is given).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import Any, Protocol

Pod = dict[str, Any]


class EnvError(ValueError):
    """The environment cannot be built yet; the message is the kubelet's."""


class Lookups(Protocol):
    def secret(self, namespace: str, name: str) -> Mapping[str, bytes] | None: ...

    def config_map(self, namespace: str, name: str) -> Mapping[str, str] | None: ...


@dataclasses.dataclass(frozen=True)
class Image:
    """What the runner knows of an image: it is never pulled, every name runs the local environment."""

    env: Mapping[str, str]
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    workdir: str = "/"


@dataclasses.dataclass(frozen=True)
class Service:
    name: str
    cluster_ip: str
    ports: tuple[tuple[str, int, str], ...]
    """(name, port, protocol) of each port, in order."""


@dataclasses.dataclass(frozen=True)
class PodFacts:
    """What the downward API reads from the kubelet rather than from the pod object."""

    pod_ip: str
    host_ip: str


_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: Mapping[str, str]) -> str:
    """`$(VAR)` -> its value when VAR is defined, else left as written; `$$` -> `$`."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env[name] if name in env else m.group(0)

    return _REF.sub(sub, text)


def _env_name(service: str) -> str:
    return service.upper().replace("-", "_")


def service_env(services: list[Service]) -> dict[str, str]:
    """The docker-links-style variables a kubelet sets for each ClusterIP Service (headless ones: none)."""
    out: dict[str, str] = {}
    for svc in services:
        if not svc.cluster_ip or svc.cluster_ip == "None" or not svc.ports:
            continue
        n = _env_name(svc.name)
        out[f"{n}_SERVICE_HOST"] = svc.cluster_ip
        out[f"{n}_SERVICE_PORT"] = str(svc.ports[0][1])
        for port_name, port, _ in svc.ports:
            if port_name:
                out[f"{n}_SERVICE_PORT_{_env_name(port_name)}"] = str(port)
        first_port, first_proto = svc.ports[0][1], svc.ports[0][2].lower()
        out[f"{n}_PORT"] = f"{first_proto}://{svc.cluster_ip}:{first_port}"
        for _, port, proto in svc.ports:
            p = f"{n}_PORT_{port}_{proto.upper()}"
            out[p] = f"{proto.lower()}://{svc.cluster_ip}:{port}"
            out[f"{p}_PROTO"] = proto.lower()
            out[f"{p}_PORT"] = str(port)
            out[f"{p}_ADDR"] = svc.cluster_ip
    return out


_SELECTOR = re.compile(r"^metadata\.(labels|annotations)\['([^']*)'\]$")


def field_ref(pod: Pod, path: str, facts: PodFacts) -> str:
    meta, spec = pod.get("metadata", {}), pod.get("spec", {})
    m = _SELECTOR.match(path)
    if m:
        return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.podIP": facts.pod_ip,
        "status.podIPs": facts.pod_ip,
        "status.hostIP": facts.host_ip,
        "status.hostIPs": facts.host_ip,
    }
    if path not in simple:
        raise EnvError(f"unsupported fieldRef fieldPath {path!r}")
    return str(simple[path] or "")


_QUANTITY = re.compile(r"^([0-9.]+)([a-zA-Z]*)$")
_SUFFIX = {
    "": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
}  # fmt: skip


def quantity(text: str) -> float:
    m = _QUANTITY.match(str(text).strip())
    if not m or m.group(2) not in _SUFFIX:
        raise EnvError(f"cannot parse quantity {text!r}")
    return float(m.group(1)) * _SUFFIX[m.group(2)]


def resource_ref(container: dict[str, Any], ref: dict[str, Any], allocatable: Mapping[str, str]) -> str:
    """limits.X / requests.X of the container (a missing limit reads the node's allocatable), divided
    by `divisor` and rounded up, as the downward API does."""
    kind, _, res = str(ref.get("resource", "")).partition(".")
    if kind not in ("limits", "requests") or not res:
        raise EnvError(f"unsupported resourceFieldRef resource {ref.get('resource')!r}")
    values = (container.get("resources") or {}).get(kind) or {}
    raw = values.get(res)
    if raw is None:
        raw = allocatable.get(res, "0") if kind == "limits" else "0"
    divisor = quantity(str(ref.get("divisor") or "1"))
    return str(math.ceil(quantity(str(raw)) / divisor - 1e-9))


def _key_ref(kind: str, ref: dict[str, Any], namespace: str, lookups: Lookups) -> str | None:
    name, key, optional = ref.get("name", ""), ref.get("key", ""), bool(ref.get("optional"))
    data: Mapping[str, bytes] | Mapping[str, str] | None = (
        lookups.secret(namespace, name) if kind == "Secret" else lookups.config_map(namespace, name)
    )
    if data is None:
        if optional:
            return None
        raise EnvError(f'{"secret" if kind == "Secret" else "configmap"} "{name}" not found')
    if key not in data:
        if optional:
            return None
        raise EnvError(f"couldn't find key {key} in {kind} {namespace}/{name}")
    value = data[key]
    return value.decode() if isinstance(value, bytes) else value


def container_env(
    pod: Pod,
    container: dict[str, Any],
    image: Image,
    services: list[Service],
    lookups: Lookups,
    facts: PodFacts,
    allocatable: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The container's whole environment (see the module docstring for the layers)."""
    namespace = pod["metadata"]["namespace"]
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        for kind, key in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
            ref = source.get(key)
            if ref is None:
                continue
            data: Mapping[str, bytes] | Mapping[str, str] | None = (
                lookups.secret(namespace, ref["name"])
                if kind == "Secret"
                else lookups.config_map(namespace, ref["name"])
            )
            if data is None:
                if ref.get("optional"):
                    continue
                raise EnvError(f'{"secret" if kind == "Secret" else "configmap"} "{ref["name"]}" not found')
            for k, v in data.items():
                env[prefix + k] = v.decode() if isinstance(v, bytes) else v
    svc = service_env(services)
    for var in container.get("env") or []:
        name = var["name"]
        source = var.get("valueFrom")
        if source is None:
            env[name] = expand(str(var.get("value", "")), {**svc, **env})
        elif "fieldRef" in source:
            env[name] = field_ref(pod, source["fieldRef"]["fieldPath"], facts)
        elif "resourceFieldRef" in source:
            env[name] = resource_ref(container, source["resourceFieldRef"], allocatable or {})
        elif "secretKeyRef" in source or "configMapKeyRef" in source:
            kind = "Secret" if "secretKeyRef" in source else "ConfigMap"
            value = _key_ref(
                kind, source["secretKeyRef" if kind == "Secret" else "configMapKeyRef"], namespace, lookups
            )
            if value is not None:
                env[name] = value
        else:
            raise EnvError(f"env {name}: unsupported valueFrom {sorted(source)}")
    hostname = pod.get("spec", {}).get("hostname") or pod["metadata"]["name"]
    return {**image.env, "HOSTNAME": hostname[:63], **svc, **env}


def command_line(container: dict[str, Any], image: Image, env: Mapping[str, str]) -> list[str]:
    """command + args (each `$(VAR)`-expanded), falling back to the image's entrypoint and cmd."""
    command = [expand(c, env) for c in container.get("command") or []]
    args = [expand(a, env) for a in container.get("args") or []]
    if command:
        return command + args
    if args:
        return [*image.entrypoint, *args]
    return [*image.entrypoint, *image.cmd]
