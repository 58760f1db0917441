"""A pod's volumes on the host and each container's mounts, as a kubelet lays them out.

`plan_volumes(pod, pod_dir, lookups)` is pure: for each of the pod's volumes it says which host
directory backs it and what files to write there:

- `configMap` / `secret` / `downwardAPI` / `projected` (configMap, secret, downwardAPI and
  `serviceAccountToken` sources: the token the ServiceAccount admission plugin asks for in
  `kube-api-access-*`, from the TokenRequest API, bound to the pod) -> files under
  `<pod_dir>/volumes/<name>/`, honouring `items`, `defaultMode`/`mode` and `optional`; mounted read-only;
- `emptyDir` -> `<pod_dir>/volumes/<name>/` (medium Memory: a tmpfs the sandbox mounts there);
- `persistentVolumeClaim` -> the bound PersistentVolume's `hostPath` or `local` path (created if
  missing, as DirectoryOrCreate); an unbound or missing claim fails like the kubelet's FailedMount;
- `hostPath` -> its path.

`container_mounts` turns a container's `volumeMounts` into shim mounts (subPath honoured, created if
missing) plus the files a kubelet adds: /etc/hosts, /etc/hostname, /etc/resolv.conf and the
termination-message file. `write(plan)` is the only I/O.

Neighbours: pod_runner.py (caller; implements `Lookups` over the API), pod_shim.py (`Mount`), pod_env.py.
"""

from __future__ import annotations

import base64
import dataclasses
import os
import pathlib
from collections.abc import Mapping
from typing import Any, Protocol

from tests.infra import pod_env, pod_shim

Pod = dict[str, Any]
DEFAULT_MODE = 0o644
TERMINATION_LOG = "/dev/termination-log"


class VolumeError(ValueError):
    """A volume that cannot be set up yet; the message says why (reported as FailedMount)."""


@dataclasses.dataclass(frozen=True)
class Token:
    """A projected ServiceAccount token: what was asked for, so it can be refreshed."""

    path: pathlib.Path
    audience: str | None
    expiration_seconds: int


class Lookups(pod_env.Lookups, Protocol):
    def claim_path(self, namespace: str, claim: str) -> str:
        """The host directory behind a bound claim; raises VolumeError otherwise."""
        ...

    def token(self, pod: Pod, audience: str | None, expiration_seconds: int) -> str: ...


@dataclasses.dataclass
class VolumePlan:
    dirs: dict[str, pathlib.Path] = dataclasses.field(default_factory=dict)
    """Volume name -> host directory (or file, for a hostPath of a file)."""
    read_only: set[str] = dataclasses.field(default_factory=set)
    files: dict[pathlib.Path, tuple[bytes, int]] = dataclasses.field(default_factory=dict)
    tmpfs: list[pathlib.Path] = dataclasses.field(default_factory=list)
    create: list[pathlib.Path] = dataclasses.field(default_factory=list)
    tokens: list[Token] = dataclasses.field(default_factory=list)


def _items(
    data: Mapping[str, bytes],
    items: list[dict[str, Any]] | None,
    mode: int,
    where: str,
    optional: bool,
) -> dict[str, tuple[bytes, int]]:
    if not items:
        return {k: (v, mode) for k, v in data.items()}
    out = {}
    for item in items:
        key = item["key"]
        if key not in data:
            if optional:
                continue
            raise VolumeError(f"configmap references non-existent config key: {key} ({where})")
        out[item["path"]] = (data[key], int(item.get("mode", mode)))
    return out


def _downward(
    pod: Pod, items: list[dict[str, Any]], mode: int, facts: pod_env.PodFacts
) -> dict[str, tuple[bytes, int]]:
    out = {}
    for item in items:
        if "fieldRef" in item:
            value = pod_env.field_ref(pod, item["fieldRef"]["fieldPath"], facts)
        else:
            raise VolumeError(f"downwardAPI item {item.get('path')}: only fieldRef is supported")
        out[item["path"]] = (value.encode(), int(item.get("mode", mode)))
    return out


def _object(
    kind: str, namespace: str, ref: dict[str, Any], lookups: Lookups
) -> tuple[dict[str, bytes] | None, bool]:
    name, optional = ref.get("name", ""), bool(ref.get("optional"))
    if kind == "secret":
        raw = lookups.secret(namespace, name)
        data = None if raw is None else dict(raw)
    else:
        cm = lookups.config_map(namespace, name)
        data = None if cm is None else {k: v.encode() for k, v in cm.items()}
    if data is None and not optional:
        raise VolumeError(f'{kind} "{name}" not found')
    return data, optional


def plan_volumes(pod: Pod, pod_dir: pathlib.Path, lookups: Lookups, facts: pod_env.PodFacts) -> VolumePlan:
    """Where each volume lives and what to write (see the module docstring). Raises VolumeError."""
    ns = pod["metadata"]["namespace"]
    plan = VolumePlan()
    for vol in pod.get("spec", {}).get("volumes") or []:
        name = vol["name"]
        here = pod_dir / "volumes" / name
        files: dict[str, tuple[bytes, int]] = {}
        if "configMap" in vol or "secret" in vol:
            kind = "configMap" if "configMap" in vol else "secret"
            src = vol[kind]
            ref = {"name": src.get("name", src.get("secretName", "")), "optional": src.get("optional")}
            data, optional = _object("secret" if kind == "secret" else "configmap", ns, ref, lookups)
            mode = int(src.get("defaultMode", DEFAULT_MODE))
            files = _items(data or {}, src.get("items"), mode, f"{kind} {ref['name']}", optional)
            plan.read_only.add(name)
        elif "downwardAPI" in vol:
            src = vol["downwardAPI"]
            files = _downward(pod, src.get("items") or [], int(src.get("defaultMode", DEFAULT_MODE)), facts)
            plan.read_only.add(name)
        elif "projected" in vol:
            src = vol["projected"]
            mode = int(src.get("defaultMode", DEFAULT_MODE))
            for source in src.get("sources") or []:
                if "serviceAccountToken" in source:
                    t = source["serviceAccountToken"]
                    seconds = int(t.get("expirationSeconds", 3600))
                    token = lookups.token(pod, t.get("audience"), seconds)
                    files[t["path"]] = (token.encode(), mode)
                    plan.tokens.append(Token(here / t["path"], t.get("audience"), seconds))
                elif "configMap" in source or "secret" in source:
                    kind = "configMap" if "configMap" in source else "secret"
                    data, optional = _object(
                        "secret" if kind == "secret" else "configmap", ns, source[kind], lookups
                    )
                    files |= _items(data or {}, source[kind].get("items"), mode, kind, optional)
                elif "downwardAPI" in source:
                    files |= _downward(pod, source["downwardAPI"].get("items") or [], mode, facts)
                else:
                    raise VolumeError(f"volume {name}: unsupported projected source {sorted(source)}")
            plan.read_only.add(name)
        elif "emptyDir" in vol:
            if (vol["emptyDir"] or {}).get("medium") == "Memory":
                plan.tmpfs.append(here)
        elif "persistentVolumeClaim" in vol:
            claim = vol["persistentVolumeClaim"]
            here = pathlib.Path(lookups.claim_path(ns, claim["claimName"]))
            if claim.get("readOnly"):
                plan.read_only.add(name)
        elif "hostPath" in vol:
            here = pathlib.Path(vol["hostPath"]["path"])
            if vol["hostPath"].get("type", "") in ("", "DirectoryOrCreate"):
                plan.create.append(here)
        else:
            kinds = sorted(k for k in vol if k != "name")
            raise VolumeError(f"volume {name}: unsupported volume type {kinds}")
        plan.dirs[name] = here
        if here.is_relative_to(pod_dir):
            plan.create.append(here)
        for rel, content in files.items():
            plan.files[here / rel] = content
    return plan


def write(plan: VolumePlan) -> None:
    for d in plan.create:
        if not d.exists():
            d.mkdir(parents=True, exist_ok=True)
    for path, (content, mode) in plan.files.items():
        write_file(path, content, mode)


def write_file(path: pathlib.Path, content: bytes, mode: int = DEFAULT_MODE) -> None:
    """Atomically (a rename inside the volume directory, which is what containers have bound)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(content)
    tmp.chmod(mode)
    os.replace(tmp, path)


@dataclasses.dataclass(frozen=True)
class PodFiles:
    """The per-pod files a kubelet generates and binds into every container."""

    hosts: pathlib.Path
    hostname: pathlib.Path
    resolv_conf: pathlib.Path


def container_mounts(
    container: dict[str, Any],
    plan: VolumePlan,
    pod_files: PodFiles,
    termination_log: pathlib.Path,
) -> list[pod_shim.Mount]:
    """The shim mounts of one container: its volumeMounts, then the kubelet's own files."""
    out = []
    targets = set()
    for m in container.get("volumeMounts") or []:
        name = m["name"]
        if name not in plan.dirs:
            raise VolumeError(f"volumeMount {name}: no volume of that name in the pod")
        source = plan.dirs[name]
        if m.get("subPath"):
            source = source / m["subPath"]
            if not source.exists():
                source.mkdir(parents=True)
        ro = bool(m.get("readOnly")) or name in plan.read_only
        out.append(pod_shim.Mount(str(source), m["mountPath"], ro))
        targets.add(m["mountPath"].rstrip("/"))
    for source, target in (
        (pod_files.hosts, "/etc/hosts"),
        (pod_files.hostname, "/etc/hostname"),
        (pod_files.resolv_conf, "/etc/resolv.conf"),
    ):
        if target not in targets:
            out.append(pod_shim.Mount(str(source), target, False))
    path = container.get("terminationMessagePath") or TERMINATION_LOG
    out.append(pod_shim.Mount(str(termination_log), path, False))
    return out


def decode_secret(data: Mapping[str, str] | None) -> dict[str, bytes]:
    """A Secret's `data` (base64, as the API returns it) as bytes."""
    return {k: base64.b64decode(v) for k, v in (data or {}).items()}
