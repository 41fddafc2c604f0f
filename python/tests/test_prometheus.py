"""The Prometheus extra: the client's figures in a prometheus_client registry."""

from __future__ import annotations

import pytest
import redis

import dlock
from conftest import Server, cmd

prometheus_client = pytest.importorskip("prometheus_client")

import dlock.prometheus  # noqa: E402


def test_figures_reach_the_registry(server: Server) -> None:
    registry = prometheus_client.CollectorRegistry()
    metrics = dlock.prometheus.PrometheusMetrics(registry)
    r = redis.Redis(port=server.port)
    locks = dlock.Locks(r, metrics=metrics)
    with locks.hold("counted", ttl=5, timeout=0) as lease:
        lease.fenced("SET", "counted:x", "1")
    cmd(r, "DLOCK.ACQUIRE", "counted", "someone-else", 30000)
    with pytest.raises(dlock.NotAcquired), locks.hold("counted", ttl=5, timeout=0):
        pytest.fail("the body must not run")
    with pytest.raises(dlock.LeaseLost), locks.hold("lost", ttl=1.5) as lost:
        r.delete("lost")
        assert lost.lost.wait(1.5)

    def sample(name: str, **labels: str) -> float | None:
        value: float | None = registry.get_sample_value(name, labels)
        return value

    assert sample("dlock_client_acquire_attempts_total") == 3
    assert sample("dlock_client_acquire_failures_total", reason="held") == 1
    assert sample("dlock_client_acquire_seconds_count") == 2
    assert sample("dlock_client_hold_seconds_count") == 2
    assert sample("dlock_client_leases_lost_total", reason="renewal_refused") == 1
    assert sample("dlock_client_renewal_failures_total", reason="refused") == 1
    # The lost lease's RELEASE (answered 0) is no release failure: the loss was counted once.
    assert sample("dlock_client_release_failures_total") == 0
    assert sample("dlock_client_stale_writes_total") == 0
    # The plain counters say the same.
    assert metrics.get("leases_lost", "renewal_refused") == 1
    r.close()
