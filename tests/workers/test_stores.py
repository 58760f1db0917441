"""The rendezvous stores listen where they are told: a master bound to loopback cannot be reached
at another address of this machine (a store has no authentication), while one on every interface
can; clients work the same either way."""

from __future__ import annotations

import socket

import pytest

from plrl_workers import stores


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


def test_a_store_bound_to_loopback_is_not_reachable_at_another_address() -> None:
    store = stores.tcp_store("127.0.0.1", 0, is_master=True, timeout_s=10, bind_host="127.0.0.1")
    client = stores.tcp_store("127.0.0.1", store.port, is_master=False, timeout_s=10)
    client.set("k", "v")
    assert store.get("k") == b"v"
    assert _reachable("127.0.0.1", store.port)
    assert not _reachable("127.0.0.2", store.port)


@pytest.mark.parametrize("bind_host", [None, "0.0.0.0"])
def test_a_store_on_every_interface_is_reachable_at_any_address(bind_host: str | None) -> None:
    """What `plrl run` did before: the check above would fail for it."""
    store = stores.tcp_store("127.0.0.1", 0, is_master=True, timeout_s=10, bind_host=bind_host)
    assert _reachable("127.0.0.2", store.port)
