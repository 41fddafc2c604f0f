"""dlock's client figures as Prometheus metrics (``pip install dlock-redis[prometheus]``).

    import dlock, dlock.prometheus
    locks = dlock.Locks(r, metrics=dlock.prometheus.PrometheusMetrics())

Metric names (counters unless noted), the same as the Rust client's:

- ``dlock_client_acquire_attempts_total``
- ``dlock_client_acquire_failures_total{reason}``: ``held``, ``unreachable``, ``unknown``,
  ``server`` (see :class:`dlock.Metrics`)
- ``dlock_client_acquire_seconds`` (histogram): from the first send to the grant
- ``dlock_client_hold_seconds`` (histogram): from the grant to the release or the loss
- ``dlock_client_renewal_failures_total{reason}``: ``refused``, ``error``
- ``dlock_client_release_failures_total``: RELEASEs whose outcome is unknown for a lease still
  believed live
- ``dlock_client_leases_lost_total{reason}``: ``renewal_refused``, ``unreachable``,
  ``stalled``, ``max_hold``, ``ended``, ``revoked``
- ``dlock_client_stale_writes_total``: fenced writes the server refused
"""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram

from ._metrics import Metrics

__all__ = ["PrometheusMetrics"]

_COUNTERS = {
    "acquire_attempts": ("ACQUIREs started by hold()", False),
    "acquire_failures": ("holds that got no lease, by reason", True),
    "renewal_failures": ("renewals refused or unanswered, by reason", True),
    "release_failures": ("releases of a live lease whose outcome is unknown", False),
    "leases_lost": ("leases lost while their block ran, by reason", True),
    "stale_writes": ("fenced writes the server refused", False),
}

_HISTOGRAMS = {
    "acquire_seconds": "from the first ACQUIRE to the grant",
    "hold_seconds": "from the grant to the release or the loss",
}


class PrometheusMetrics(Metrics):
    """:class:`dlock.Metrics` that also feeds ``prometheus_client`` metrics registered in
    ``registry`` (the default registry unless given). One per registry: the names are fixed;
    share it between the ``Locks`` of a process."""

    def __init__(
        self, registry: CollectorRegistry = REGISTRY, namespace: str = "dlock_client"
    ) -> None:
        super().__init__()
        self._prometheus_counters = {
            name: Counter(
                name,
                documentation,
                ["reason"] if labelled else [],
                namespace=namespace,
                registry=registry,
            )
            for name, (documentation, labelled) in _COUNTERS.items()
        }
        self._prometheus_histograms = {
            name: Histogram(name, documentation, namespace=namespace, registry=registry)
            for name, documentation in _HISTOGRAMS.items()
        }

    def _inc(self, name: str, reason: str = "", amount: float = 1.0) -> None:
        super()._inc(name, reason, amount)
        counter = self._prometheus_counters.get(name)
        if counter is not None:
            (counter.labels(reason=reason) if reason else counter).inc(amount)

    def _observe(self, name: str, seconds: float) -> None:
        super()._observe(name, seconds)
        histogram = self._prometheus_histograms.get(name)
        if histogram is not None:
            histogram.observe(seconds)
