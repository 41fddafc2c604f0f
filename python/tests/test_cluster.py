"""Redis Cluster: three primaries with the module; the clients follow each resource's slot."""

from __future__ import annotations

import asyncio
import functools
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio.cluster
import redis.cluster

import dlock
import dlock.asyncio
from conftest import Server, cmd, fields, wait_until

pytestmark = pytest.mark.skipif(shutil.which("redis-cli") is None, reason="needs redis-cli")


def cluster_ok(node: Server) -> bool:
    with node.client() as probe:
        info = cmd(probe, "CLUSTER", "INFO")
    text = info.decode() if isinstance(info, bytes) else str(info)
    return "cluster_state:ok" in text


class Cluster:
    def __init__(self) -> None:
        self.nodes = [
            Server("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
            for _ in range(3)
        ]
        subprocess.run(
            [
                "redis-cli",
                "--cluster",
                "create",
                *(f"127.0.0.1:{node.port}" for node in self.nodes),
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        for node in self.nodes:
            assert wait_until(functools.partial(cluster_ok, node), 30, 0.05), node.port

    def owner(self, key: str) -> Server:
        """The primary that serves ``key``'s slot now."""
        with self.nodes[0].client() as probe:
            slot = cmd(probe, "CLUSTER", "KEYSLOT", key)
            for start, end, primary, *_replicas in cmd(probe, "CLUSTER", "SLOTS"):
                if start <= slot <= end:
                    return next(node for node in self.nodes if node.port == primary[1])
        raise AssertionError(f"no owner for {key}")

    def close(self) -> None:
        for node in self.nodes:
            node.close()


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    started = Cluster()
    yield started
    started.close()


def test_holds_follow_each_resource_to_its_shard(cluster: Cluster) -> None:
    client = redis.cluster.RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    locks = dlock.Locks(client)
    resources = [f"invoice:{{{n}}}" for n in range(12)]
    owners = {cluster.owner(resource).port for resource in resources}
    assert len(owners) == 3, "the resources should cover every shard"
    for resource in resources:
        with locks.hold(resource, ttl=5, timeout=1) as lease:
            owner = cluster.owner(resource)
            with owner.client() as direct:
                assert cmd(direct, "DLOCK.FENCECHECK", resource, lease.fence) == 1
            # Keys with the resource's hash tag live in the same slot.
            lease.fenced("SET", f"{resource}:status", "paid")
    for resource in resources:
        assert client.get(f"{resource}:status") == b"paid"
    client.close()
    locks.close()


def test_a_wait_in_a_cluster_is_one_wait_on_the_owner(cluster: Cluster) -> None:
    resource = "queue:{w}"
    owner = cluster.owner(resource)
    with owner.client() as admin:
        admin.config_resetstat()
        cmd(admin, "DLOCK.ACQUIRE", resource, "holder", 30000)
    client = redis.cluster.RedisCluster(
        host="127.0.0.1", port=cluster.nodes[0].port, socket_timeout=0.3
    )
    locks = dlock.Locks(client)

    def release_later() -> None:
        time.sleep(1.0)
        with owner.client() as admin:
            cmd(admin, "DLOCK.RELEASE", resource, "holder")

    releaser = threading.Thread(target=release_later)
    releaser.start()
    try:
        with locks.hold(resource, ttl=5, timeout=5) as lease:
            assert lease.fence > 0
    finally:
        releaser.join()
    info: dict[str, Any] = owner.info()
    assert info["dlock_waits_started"] == 1
    assert info["dlock_waits_granted"] == 1
    client.close()
    locks.close()


def test_a_deleted_lease_is_lost_in_a_cluster(cluster: Cluster) -> None:
    client = redis.cluster.RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    locks = dlock.Locks(client)
    with pytest.raises(dlock.LeaseLost), locks.hold("gone:{x}", ttl=1.5) as lease:
        client.delete("gone:{x}")
        assert lease.lost.wait(1.5)
    client.close()
    locks.close()


def test_shared_leases_on_every_shard(cluster: Cluster) -> None:
    client = redis.cluster.RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    locks = dlock.Locks(client)
    resources = [f"shelf:{{{n}}}" for n in range(6)]
    assert len({cluster.owner(resource).port for resource in resources}) == 3
    for resource in resources:
        with (
            locks.read(resource, ttl=5, timeout=1) as a,
            locks.semaphore(f"{resource}:pool", 2, ttl=5, timeout=1) as permit,
            locks.read(resource, ttl=5, timeout=0) as b,
        ):
            # Each node is asked for its own options: SHARED and LIMIT are there on all.
            with cluster.owner(resource).client() as direct:
                assert fields(cmd(direct, "DLOCK.INFO", resource))[b"holders"] == 2
            b.fenced("SET", f"{resource}:x", str(b.fence))
            a.fenced("SET", f"{resource}:y", str(a.fence))
            assert permit.mode == "shared"
    client.close()
    locks.close()


def test_asyncio_in_a_cluster(cluster: Cluster) -> None:
    async def test() -> None:
        client = redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
        locks = dlock.asyncio.Locks(client)
        for n in range(6):
            resource = f"async:{{{n}}}"
            async with locks.hold(resource, ttl=5, timeout=1) as lease:
                await lease.fenced("SET", f"{resource}:x", str(lease.fence))
                owner = cluster.owner(resource)
                with owner.client() as direct:
                    assert cmd(direct, "DLOCK.FENCECHECK", resource, lease.fence) == 1
        await locks.aclose()
        await client.aclose()

    asyncio.run(asyncio.wait_for(test(), 30))


def ticket_waiters_on_every_shard(cluster: Cluster, prefix: str) -> list[str]:
    resources = [f"{prefix}:{{{n}}}" for n in range(6)]
    assert len({cluster.owner(resource).port for resource in resources}) == 3
    for resource in resources:
        with cluster.owner(resource).client() as admin:
            cmd(admin, "DLOCK.ACQUIRE", resource, "holder", 30000)
    return resources


def release_when_in_line(cluster: Cluster, resource: str) -> float:
    """Releases ``holder``'s lease once one ticket stands; returns when (monotonic)."""
    with cluster.owner(resource).client() as admin:

        def in_line() -> bool:
            return bool(fields(cmd(admin, "DLOCK.INFO", resource))[b"tickets"] == 1)

        assert wait_until(in_line, 5)
        # The shard channel on the owner: what the module publishes to in a Cluster.
        assert cmd(admin, "PUBSUB", "SHARDNUMSUB", f"dlock:{resource}")[1] == 1
        released = time.monotonic()
        assert cmd(admin, "DLOCK.RELEASE", resource, "holder") == 1
        return released


def test_tickets_in_a_cluster_are_woken_by_the_shard_channel(cluster: Cluster) -> None:
    client = redis.cluster.RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    # A 30 s ticket is refreshed every 10 s: only the shard channel explains a prompt grant.
    locks = dlock.Locks(client, wait="tickets", ticket_ttl=30)
    for resource in ticket_waiters_on_every_shard(cluster, "ticket"):
        granted: list[float] = []

        def waiter(resource: str = resource, granted: list[float] = granted) -> None:
            with locks.hold(resource, ttl=5, timeout=10):
                granted.append(time.monotonic())

        thread = threading.Thread(target=waiter, daemon=True)
        thread.start()
        released = release_when_in_line(cluster, resource)
        thread.join(10)
        assert granted
        assert granted[0] - released < 0.5
    client.close()
    locks.close()


def test_asyncio_tickets_in_a_cluster(cluster: Cluster) -> None:
    async def test() -> None:
        client = redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
        locks = dlock.asyncio.Locks(client, wait="tickets", ticket_ttl=30)
        for resource in ticket_waiters_on_every_shard(cluster, "aticket"):
            started = time.monotonic()
            release = asyncio.get_running_loop().run_in_executor(
                None, release_when_in_line, cluster, resource
            )
            async with locks.hold(resource, ttl=5, timeout=10):
                granted = time.monotonic()
            released = await release
            assert granted - released < 0.5
            assert granted - started < 5
        await locks.aclose()
        await client.aclose()

    asyncio.run(asyncio.wait_for(test(), 60))
