"""pod_net's pure parts: subnets per agent, pod addresses, /etc/hosts and resolv.conf, in-place writes.

Cases: each agent takes the first /23 of 198.18.0.0/15 that no interface uses, never loopback; the
pool hands out distinct addresses after the gateway and reuses released ones last; a pod's hosts file
names itself as a kubelet does and every peer with a hostname and subdomain in its namespace, in a
stable order, and nothing from other namespaces; resolv.conf has the cluster's search path and no
reachable server; rewriting keeps the inode (bind mounts follow it) and skips unchanged content.
"""

from __future__ import annotations

import ipaddress
import pathlib

from tests.infra import pod_net


def test_subnets_avoid_networks_in_use() -> None:
    k, net = pod_net.pick_subnet(
        [ipaddress.IPv4Network("127.0.0.0/8"), ipaddress.IPv4Network("192.0.2.0/24")]
    )
    assert (k, str(net)) == (0, "198.18.0.0/23")
    k, net = pod_net.pick_subnet([ipaddress.IPv4Network("198.18.0.1/23", strict=False)])
    assert (k, str(net)) == (1, "198.18.2.0/23")
    assert net.subnet_of(pod_net.POD_RANGE) and not net.is_loopback


def test_address_pool() -> None:
    pool = pod_net.AddressPool(ipaddress.IPv4Network("198.18.2.0/23"))
    assert str(pool.gateway) == "198.18.2.1"
    a, b = pool.take("uid-a"), pool.take("uid-b")
    assert (str(a), str(b)) == ("198.18.2.2", "198.18.2.3")
    assert pool.take("uid-a") == a  # idempotent per owner
    pool.release("uid-a")
    assert str(pool.take("uid-c")) == "198.18.2.4"  # the released address is reused last


def test_hosts_file_names_peers_of_the_same_namespace() -> None:
    me = pod_net.PeerRecord("ns", "job-train-0", "job-train", "198.18.0.2")
    peers = [
        me,
        pod_net.PeerRecord("ns", "job-gen-0", "job-gen", "198.18.0.3"),
        pod_net.PeerRecord("ns", "job-train-1", "job-train", "198.18.0.4"),
        pod_net.PeerRecord("other", "job-gen-0", "job-gen", "198.18.0.9"),
        pod_net.PeerRecord("ns", "loner", None, "198.18.0.5"),
    ]
    text = pod_net.hosts_file(me, peers)
    lines = text.splitlines()
    assert lines[1:3] == ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    assert (
        lines[3]
        == "198.18.0.2\tjob-train-0.job-train.ns.svc.cluster.local job-train-0.job-train.ns.svc job-train-0"
    )
    assert lines[4:] == [
        "198.18.0.3\tjob-gen-0.job-gen.ns.svc.cluster.local job-gen-0.job-gen.ns.svc",
        "198.18.0.4\tjob-train-1.job-train.ns.svc.cluster.local job-train-1.job-train.ns.svc",
    ]
    assert pod_net.hosts_file(me, list(reversed(peers))) == text


def test_resolv_conf_and_veth_names() -> None:
    conf = pod_net.resolv_conf("ns")
    assert "search ns.svc.cluster.local svc.cluster.local cluster.local" in conf
    assert "nameserver 127.0.0.1" in conf  # a pod's own loopback: no server, lookups fail at once
    name = pod_net.veth_name(ipaddress.IPv4Address("198.19.255.254"))
    assert len(name) <= 15 and name == "plvc613fffe"


def test_write_in_place_keeps_the_inode(tmp_path: pathlib.Path) -> None:
    f = tmp_path / "hosts"
    assert pod_net.write_in_place(f, "a long first version\n")
    inode = f.stat().st_ino
    assert pod_net.write_in_place(f, "short\n")
    assert f.read_text() == "short\n" and f.stat().st_ino == inode
    assert not pod_net.write_in_place(f, "short\n")
