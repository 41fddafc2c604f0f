"""Redis Cluster: three primaries with the module; the clients follow each resource's slot."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Iterator
from typing import Any, Callable

import pytest
import redis
import redis.asyncio.cluster
import redis.cluster
from redis._parsers import BaseParser

import dlock
import dlock.asyncio
from conftest import Server, cmd, fields, wait_until
from dlock import _common as common
from dlock import _protocol as protocol

pytestmark = pytest.mark.skipif(shutil.which("redis-cli") is None, reason="needs redis-cli")


def cluster_ok(node: Server) -> bool:
    with node.client() as probe:
        info = cmd(probe, "CLUSTER", "INFO")
    text = info.decode() if isinstance(info, bytes) else str(info)
    return "cluster_state:ok" in text


def role(node: Server) -> list[Any]:
    """The node's ``ROLE`` reply, or ``[]`` while it answers nothing."""
    try:
        with node.client(socket_timeout=1) as probe:
            reply: list[Any] = cmd(probe, "ROLE")
            return reply
    except redis.RedisError:
        return []


class Cluster:
    """Three primaries with the module, each with ``replicas`` replicas; ``extra``: more
    options for every node."""

    def __init__(self, replicas: int = 0, *extra: str) -> None:
        self.nodes = [
            Server("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", *extra)
            for _ in range(3 * (1 + replicas))
        ]
        self.replicas = replicas
        self.down: set[int] = set()  # ports of the nodes killed and not restarted
        subprocess.run(
            [
                "redis-cli",
                "--cluster",
                "create",
                *(f"127.0.0.1:{node.port}" for node in self.nodes),
                "--cluster-replicas",
                str(replicas),
                "--cluster-yes",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        assert wait_until(self.settled, 30, 0.05), "the cluster did not settle"

    def live(self) -> list[Server]:
        return [node for node in self.nodes if node.port not in self.down]

    def settled(self) -> bool:
        """Every live node sees the cluster ok, and every primary has its replicas, in sync."""
        nodes = self.live()
        if not all(cluster_ok(node) for node in nodes):
            return False
        primaries = [node for node in nodes if role(node)[:1] == [b"master"]]
        if len(primaries) != 3:
            return False
        return all(
            len([replica for replica in nodes if self._replicates(replica, primary)])
            == self.replicas
            for primary in primaries
        )

    @staticmethod
    def _replicates(replica: Server, primary: Server) -> bool:
        reply = role(replica)
        return reply[:1] == [b"slave"] and reply[2] == primary.port and reply[3] == b"connected"

    def owner(self, key: str) -> Server:
        """The primary that serves ``key``'s slot now."""
        with self.live()[0].client() as probe:
            slot = cmd(probe, "CLUSTER", "KEYSLOT", key)
            for start, end, primary, *_replicas in cmd(probe, "CLUSTER", "SLOTS"):
                if start <= slot <= end:
                    return next(node for node in self.nodes if node.port == primary[1])
        raise AssertionError(f"no owner for {key}")

    def replica_of(self, primary: Server) -> Server:
        return next(node for node in self.live() if self._replicates(node, primary))

    def failover(self, replica: Server) -> None:
        """``CLUSTER FAILOVER`` on ``replica``: it becomes the primary of its shard, its primary
        one of its replicas. Returns once both say so."""
        primary = next(node for node in self.live() if self._replicates(replica, node))
        with replica.client() as admin:
            assert cmd(admin, "CLUSTER", "FAILOVER") == b"OK"
        assert wait_until(lambda: self._replicates(primary, replica), 10, 0.01)

    def kill(self, node: Server) -> None:
        node.kill()
        self.down.add(node.port)

    def restart(self, node: Server) -> None:
        """Starts a killed node again: it rejoins as a replica of its shard's new primary."""
        node.restart()
        self.down.discard(node.port)
        assert wait_until(self.settled, 30, 0.05), "the cluster did not settle"

    def close(self) -> None:
        for node in self.nodes:
            node.close()


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    started = Cluster()
    yield started
    started.close()


# A node is failed after 1.5 s without an answer: a killed primary's replica is promoted within
# about 3 s.
NODE_TIMEOUT_MS = 1500


@pytest.fixture(scope="module")
def replicated() -> Iterator[Cluster]:
    """Three primaries with one replica each, for failovers. A test leaves it as it found it
    (every primary with a replica in sync), though not with the same primaries."""
    started = Cluster(1, "--cluster-node-timeout", str(NODE_TIMEOUT_MS))
    yield started
    started.close()


@pytest.fixture
def shard(replicated: Cluster) -> Cluster:
    """The replicated cluster, settled (a previous test may have just restarted a node)."""
    assert wait_until(replicated.settled, 30, 0.05), "the cluster did not settle"
    return replicated


def on_every_shard(cluster: Cluster, prefix: str) -> list[str]:
    """Six resources, ``prefix:{0}`` to ``prefix:{5}``, that the three primaries share."""
    resources = [f"{prefix}:{{{n}}}" for n in range(6)]
    assert len({cluster.owner(resource).port for resource in resources}) == 3
    return resources


@contextlib.contextmanager
def cluster_locks(cluster: Cluster, **options: Any) -> Iterator[dlock.Locks]:
    """A ``dlock.Locks`` (with ``options``) on a Cluster client that starts from the first
    node; both closed after."""
    client = redis.cluster.RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    locks = dlock.Locks(client, **options)
    try:
        yield locks
    finally:
        client.close()
        locks.close()


@contextlib.asynccontextmanager
async def asyncio_cluster_locks(
    cluster: Cluster, **options: Any
) -> AsyncIterator[dlock.asyncio.Locks]:
    """:func:`cluster_locks` for ``dlock.asyncio``."""
    client = redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    locks = dlock.asyncio.Locks(client, **options)
    try:
        yield locks
    finally:
        await locks.aclose()
        await client.aclose()


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
    with (
        cluster_locks(cluster) as locks,
        pytest.raises(dlock.LeaseLost),
        locks.hold("gone:{x}", ttl=1.5) as lease,
    ):
        locks.client.delete("gone:{x}")
        assert lease.lost.wait(1.5)


def test_shared_leases_on_every_shard(cluster: Cluster) -> None:
    with cluster_locks(cluster) as locks:
        for resource in on_every_shard(cluster, "shelf"):
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


def test_asyncio_in_a_cluster(cluster: Cluster) -> None:
    async def test() -> None:
        async with asyncio_cluster_locks(cluster) as locks:
            for resource in on_every_shard(cluster, "async"):
                async with locks.hold(resource, ttl=5, timeout=1) as lease:
                    await lease.fenced("SET", f"{resource}:x", str(lease.fence))
                    owner = cluster.owner(resource)
                    with owner.client() as direct:
                        assert cmd(direct, "DLOCK.FENCECHECK", resource, lease.fence) == 1

    asyncio.run(asyncio.wait_for(test(), 30))


def test_a_fenced_write_outside_the_resources_slot_is_cross_slot_and_writes_nothing(
    cluster: Cluster,
) -> None:
    """redis-py's Cluster clients refuse a command whose keys span slots before sending it; the
    lease's fenced write reports that as the contract's ``cross_slot`` class, as the server's
    own ``CROSSSLOT`` would be."""
    with cluster_locks(cluster) as locks:
        with locks.hold("invoice:{cs}", ttl=5, timeout=1) as lease:
            with pytest.raises(redis.exceptions.ClusterCrossSlotError) as refused:
                lease.fenced("SET", "invoice:elsewhere", "paid")
            assert protocol.class_of(refused.value) == "cross_slot"
            assert lease.fenced("SET", "invoice:{cs}:status", "paid") == b"OK"
        assert locks.client.exists("invoice:elsewhere") == 0

    async def in_asyncio() -> None:
        async with (
            asyncio_cluster_locks(cluster) as locks,
            locks.hold("invoice:{cs}", ttl=5, timeout=1) as lease,
        ):
            with pytest.raises(redis.exceptions.ClusterCrossSlotError):
                await lease.fenced("SET", "invoice:elsewhere", "paid")

    asyncio.run(asyncio.wait_for(in_asyncio(), 30))


def shard_listeners(node: Server, resource: str) -> int:
    """Subscribers of ``resource``'s shard channel on ``node``."""
    with node.client() as admin:
        return int(cmd(admin, "PUBSUB", "SHARDNUMSUB", common.channel_name(resource))[1])


def until_shard_listeners(node: Server, resource: str, n: int) -> bool:
    return wait_until(lambda: shard_listeners(node, resource) == n, 5)


def test_a_holder_hears_its_revocation_on_the_shard_channel(cluster: Cluster) -> None:
    with cluster_locks(cluster) as locks:
        for resource in on_every_shard(cluster, "revoked"):
            owner = cluster.owner(resource)
            # A ttl renewals alone would take 20 s to find lost.
            with pytest.raises(dlock.LeaseLost) as raised, locks.hold(resource, ttl=60) as lease:
                # The holder listens on the shard channel, on the resource's own primary.
                assert until_shard_listeners(owner, resource, 1)
                with owner.client() as admin:
                    assert cmd(admin, "DLOCK.REVOKE", resource, "REASON", "shard drill") == 1
                assert lease.lost.wait(5)
            assert (raised.value.reason, raised.value.detail) == ("revoked", "shard drill")
            assert until_shard_listeners(owner, resource, 0), "left with the lease"


def test_asyncio_a_holder_hears_its_revocation_on_the_shard_channel(cluster: Cluster) -> None:
    async def test() -> None:
        async with asyncio_cluster_locks(cluster) as locks:
            for resource in on_every_shard(cluster, "async-revoked"):
                owner = cluster.owner(resource)
                with pytest.raises(dlock.LeaseLost) as raised:
                    async with locks.hold(resource, ttl=60):
                        for _ in range(5000):
                            if shard_listeners(owner, resource) == 1:
                                break
                            await asyncio.sleep(0.001)
                        with owner.client() as admin:
                            assert cmd(admin, "DLOCK.REVOKE", resource, "REASON", "drill") == 1
                        await asyncio.sleep(30)  # the work, cancelled by the loss
                assert (raised.value.reason, raised.value.detail) == ("revoked", "drill")

    asyncio.run(asyncio.wait_for(test(), 30))


def ticket_waiters_on_every_shard(cluster: Cluster, prefix: str) -> list[str]:
    resources = on_every_shard(cluster, prefix)
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
        # The ticket's own shard channel on the owner: what the module tells its turn on.
        own = cmd(admin, "PUBSUB", "SHARDCHANNELS", common.channel_name(resource) + ":*")
        assert len(own) == 1
        released = time.monotonic()
        assert cmd(admin, "DLOCK.RELEASE", resource, "holder") == 1
        return released


def test_tickets_in_a_cluster_are_woken_by_the_shard_channel(cluster: Cluster) -> None:
    # A 30 s ticket is refreshed every 10 s: only the shard channel explains a prompt grant.
    with cluster_locks(cluster, wait="tickets", ticket_ttl=30) as locks:
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


def test_asyncio_tickets_in_a_cluster(cluster: Cluster) -> None:
    async def test() -> None:
        async with asyncio_cluster_locks(cluster, wait="tickets", ticket_ttl=30) as locks:
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

    asyncio.run(asyncio.wait_for(test(), 60))


def test_a_set_waits_on_its_members_shard_channels_and_is_refused_across_slots(
    cluster: Cluster,
) -> None:
    with cluster_locks(cluster) as locks:
        for tag in on_every_shard(cluster, "set"):
            members = (f"{tag}:a", f"{tag}:b")
            owner = cluster.owner(tag)
            with owner.client() as admin:
                cmd(admin, "DLOCK.ACQUIRE", members[1], "holder", 30000)
            granted: list[tuple[float, dlock.SetLease]] = []

            def waiter(members: tuple[str, str] = members, granted: list[Any] = granted) -> None:
                # An 8 s ticket is refreshed every 2.7 s: only a shard channel explains a prompt
                # grant.
                with locks.hold_all(members, ttl=5, timeout=8) as lease:
                    granted.append((time.monotonic(), lease))

            thread = threading.Thread(target=waiter, daemon=True)
            thread.start()
            for member in members:  # every member's shard channel, on the slot's primary
                assert until_shard_listeners(owner, member, 1)

            def tickets_in_line(member: str = members[0], owner: Server = owner) -> int:
                with owner.client() as admin:
                    info = cmd(admin, "DLOCK.INFO", member)
                return 0 if info is None else int(fields(info)[b"tickets"])

            # The set subscribes before it asks, so its ticket follows its subscriptions.
            assert wait_until(lambda: tickets_in_line() == 1, 5)
            with owner.client() as admin:
                released = time.monotonic()
                assert cmd(admin, "DLOCK.RELEASE", members[1], "holder") == 1
            thread.join(10)
            assert granted
            granted_at, lease = granted[0]
            assert granted_at - released < 0.5
            assert lease.fences[1] > lease.fences[0]
        with pytest.raises(redis.ResponseError) as raised, locks.hold_all(["x:{1}", "x:{2}"]):
            pytest.fail("granted a set across two slots")
        assert protocol.class_of(raised.value) == "cross_slot"


# Failovers and migrations: what a client of a Cluster meets while a slot changes hands.


def parsed(reply: str) -> redis.RedisError:
    """The exception redis-py raises for the error reply ``reply`` (its parser strips the code
    of the errors it has a type for: a MOVED's message is ``3999 127.0.0.1:7001``)."""
    parser: Any = BaseParser  # untyped
    error: redis.RedisError = parser.parse_error(reply)
    return error


@pytest.mark.parametrize(
    ("error", "redirect", "map_update"),
    [
        (parsed("MOVED 3999 127.0.0.1:7001"), ("moved", "127.0.0.1", 7001), "moved"),
        (parsed("ASK 3999 127.0.0.1:7002"), ("ask", "127.0.0.1", 7002), None),
        (parsed("TRYAGAIN Multiple keys request during rehashing of slot"), None, "stale"),
        (parsed("CLUSTERDOWN The cluster is down"), None, "stale"),
        (parsed("CLUSTERDOWN Hash slot not served"), None, "stale"),
        (
            parsed(
                "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."
            ),
            None,
            "stale",
        ),
        (parsed("LOADING Redis is loading the dataset in memory"), None, "stale"),
        (
            parsed(
                "UNBLOCKED force unblock from blocking operation, instance state changed"
                " (master -> replica?)"
            ),
            None,
            "stale",
        ),
        # A demoted primary: what the retries of a wait it ended meet until the failover is over.
        (parsed("READONLY You can't write against a read only replica."), None, "stale"),
        (redis.exceptions.ClusterError("TTL exhausted"), None, "stale"),
        (redis.exceptions.SlotNotCoveredError('Slot "3999" not covered'), None, "stale"),
        (
            redis.ConnectionError("Error 111 connecting to 127.0.0.1:7001. Connection refused."),
            None,
            "stale",
        ),
        (redis.TimeoutError("Timeout reading from socket"), None, "stale"),
    ],
)
def test_cluster_errors_are_followed_or_retried(
    error: BaseException, redirect: tuple[str, str, int] | None, map_update: str | None
) -> None:
    """Each error a Cluster answers while a slot changes hands, as redis-py raises it: a MOVED or
    ASK is followed to the node it names, the others are retried with the same token until the
    caller's deadline, and the slot map learns what it should."""
    assert common.is_ambiguous(error)
    assert common.redirect(error) == redirect
    assert common.map_update(error) == map_update


@pytest.mark.parametrize(
    "error",
    [
        parsed("ERR wrong number of arguments for 'dlock.acquire' command"),
        parsed("WRONGTYPE Operation against a key holding the wrong kind of value"),
        parsed("CROSSSLOT Keys in request don't hash to the same slot"),
        parsed("NOPERM User locker has no permissions to access the 'other' key"),
        parsed("WRONGPASS invalid username-password pair or user is disabled."),
        redis.exceptions.RedisClusterException("Cluster mode is not enabled on this node"),
    ],
)
def test_errors_of_the_request_itself_are_not_retried(error: BaseException) -> None:
    assert common.redirect(error) is None
    assert not common.is_ambiguous(error)
    assert common.map_update(error) is None


def test_the_codes_are_read_from_the_types_not_the_text() -> None:
    moved = parsed("MOVED 3999 127.0.0.1:7001")
    assert isinstance(moved, redis.exceptions.MovedError)
    assert not str(moved).startswith("MOVED")  # what the client used to look for
    assert common.not_carried_out(moved)
    assert common.not_carried_out(parsed("TRYAGAIN Multiple keys request during rehashing"))
    assert common.not_carried_out(parsed("READONLY You can't write against a read only replica."))
    # A wait the server ended may have been granted just before: not "surely nothing".
    assert not common.not_carried_out(parsed("UNBLOCKED client unblocked via CLIENT UNBLOCK"))


def keyslot(node: Server, key: str) -> int:
    with node.client() as probe:
        slot: int = cmd(probe, "CLUSTER", "KEYSLOT", key)
        return slot


def node_id(node: Server) -> Any:
    with node.client() as probe:
        return cmd(probe, "CLUSTER", "MYID")


def in_line(node: Server, resource: str) -> bool:
    """Whether one waiter (a blocked ACQUIRE, or a ticket) stands in ``resource``'s line."""
    with node.client() as probe:
        info = fields(cmd(probe, "DLOCK.INFO", resource))
        return bool(info[b"waiters"] + info[b"tickets"] == 1)


def fence_on(node: Server, resource: str, fence: int) -> int:
    with node.client() as probe:
        checked: int = cmd(probe, "DLOCK.FENCECHECK", resource, fence)
        return checked


@pytest.mark.parametrize("wait", ["block", "tickets"])
def test_hold_during_a_failover_of_its_primary(shard: Cluster, wait: str) -> None:
    """``CLUSTER FAILOVER`` of the slot's primary while holds come and go and one waits in line
    there: no MOVED (nor UNBLOCKED, what Redis answers a waiter when its primary turns into a
    replica) escapes ``hold()``; the waiter and the holds after it are granted on the new
    primary."""
    free, held = f"failover:{{{wait}}}", f"failover:{{{wait}}}:held"
    primary = shard.owner(free)
    replica = shard.replica_of(primary)
    client = redis.cluster.RedisCluster(host="127.0.0.1", port=shard.live()[0].port)
    locks = dlock.Locks(client, request_timeout=1, wait=wait)
    with locks.hold(free, ttl=2, timeout=5):
        pass  # the slot map and the server's options read before the failover
    with primary.client() as admin:
        cmd(admin, "DLOCK.ACQUIRE", held, "holder", 2000)  # replicated, ends on the new primary
    errors: list[BaseException] = []
    holds = [0]
    stop = threading.Event()

    def come_and_go() -> None:
        while not stop.is_set():
            try:
                with locks.hold(free, ttl=2, timeout=5):
                    holds[0] += 1
            except Exception as error:
                errors.append(error)
                time.sleep(0.05)

    waited: list[int] = []

    def wait_in_line() -> None:
        try:
            with locks.hold(held, ttl=5, timeout=10) as lease:
                waited.append(lease.fence)
                assert fence_on(replica, held, lease.fence) == 1
        except Exception as error:
            errors.append(error)

    threads = [threading.Thread(target=come_and_go), threading.Thread(target=wait_in_line)]
    for thread in threads:
        thread.start()
    try:
        assert wait_until(lambda: in_line(primary, held), 5)
        time.sleep(0.2)
        shard.failover(replica)
        time.sleep(0.5)
    finally:
        stop.set()
        for thread in threads:
            thread.join(15)
    assert errors == []
    assert holds[0] > 0
    assert len(waited) == 1
    assert wait_until(lambda: shard.owner(free) is replica, 5)
    with locks.hold(free, ttl=2, timeout=1) as lease:
        assert fence_on(replica, free, lease.fence) == 1
    client.close()
    locks.close()


def test_a_lease_keeps_renewing_through_a_failover_of_its_primary(shard: Cluster) -> None:
    """A held lease whose primary fails over: its renewals, answered MOVED by the old primary,
    go to the new one, and the lease is never reported lost."""
    resource = "renewed:{c}"
    primary = shard.owner(resource)
    replica = shard.replica_of(primary)
    client = redis.cluster.RedisCluster(host="127.0.0.1", port=shard.live()[0].port)
    locks = dlock.Locks(client, request_timeout=0.5)
    ttl = 1.5
    with locks.hold(resource, ttl=ttl, timeout=2) as lease:
        shard.failover(replica)
        time.sleep(2 * ttl)  # the grant's own deadline is long gone: renewals kept it
        lease.check()
        assert fence_on(replica, resource, lease.fence) == 1
    assert not lease.lost.is_set()
    assert fence_on(replica, resource, lease.fence) == 0  # released on the new primary
    client.close()
    locks.close()


def test_hold_after_a_primary_is_killed(shard: Cluster) -> None:
    """``kill -9`` of the slot's primary: ``hold()`` keeps trying (connections refused, then the
    Cluster client's map refreshed) and is granted on the promoted replica within its timeout; a
    lease held across the crash keeps renewing there."""
    resource, kept = "killed:{d}", "killed:{d}:kept"
    primary = shard.owner(resource)
    replica = shard.replica_of(primary)
    client = redis.cluster.RedisCluster(host="127.0.0.1", port=shard.live()[0].port)
    locks = dlock.Locks(client, request_timeout=0.5)
    try:
        with locks.hold(kept, ttl=9, timeout=2) as held:
            with primary.client() as admin:
                assert cmd(admin, "WAIT", 1, 1000) == 1  # the grant reached the replica
            shard.kill(primary)
            killed = time.monotonic()
            with locks.hold(resource, ttl=5, timeout=10) as lease:
                assert role(replica)[:1] == [b"master"]
                assert fence_on(replica, resource, lease.fence) == 1
            assert time.monotonic() - killed < 10
            held.check()
            assert fence_on(replica, kept, held.fence) == 1
        assert not held.lost.is_set()
    finally:
        client.close()
        locks.close()
        if primary.port in shard.down:
            shard.restart(primary)


def test_a_lease_keeps_renewing_while_its_slot_migrates(shard: Cluster) -> None:
    """A reshard of the slot of a held lease, step by step: while the slot is migrating its
    renewals follow the ASK to the importing node (where the key went), and a new lease in the
    slot is made there; once the slot is moved, MOVED leads them all there."""
    resource, new = "migrated:{e}", "migrated:{e}:new"
    source = shard.owner(resource)
    target = next(
        node for node in shard.live() if role(node)[:1] == [b"master"] and node is not source
    )
    client = redis.cluster.RedisCluster(host="127.0.0.1", port=shard.live()[0].port)
    locks = dlock.Locks(client, request_timeout=0.5)
    slot = keyslot(source, resource)

    ttl = 1.5
    with target.client() as admin:
        admin.config_resetstat()
    with locks.hold(resource, ttl=ttl, timeout=2) as lease:
        with target.client() as admin:
            cmd(admin, "CLUSTER", "SETSLOT", slot, "IMPORTING", node_id(source))
        with source.client() as admin:
            cmd(admin, "CLUSTER", "SETSLOT", slot, "MIGRATING", node_id(target))
            cmd(admin, "MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", resource)
        time.sleep(2 * ttl)
        lease.check()
        assert target.info()["dlock_renew_ok"] >= 2  # through ASKING: the slot is not its yet
        with locks.hold(new, ttl=ttl, timeout=1) as other, target.client() as admin:
            assert cmd(admin, "ASKING")
            assert cmd(admin, "DLOCK.FENCECHECK", new, other.fence) == 1
        for node in shard.live():
            if role(node)[:1] == [b"master"]:
                with node.client() as admin:
                    cmd(admin, "CLUSTER", "SETSLOT", slot, "NODE", node_id(target))
        assert wait_until(lambda: shard.owner(resource) is target, 10)
        time.sleep(2 * ttl)
        lease.check()
        assert fence_on(target, resource, lease.fence) == 1
    assert not lease.lost.is_set()
    client.close()
    locks.close()


def in_thread(function: Callable[..., Any], *args: Any) -> Awaitable[Any]:
    """A blocking step of a test (a failover, a kill) run beside the event loop."""
    return asyncio.get_running_loop().run_in_executor(None, function, *args)


@pytest.mark.parametrize("wait", ["block", "tickets"])
def test_asyncio_hold_during_a_failover_of_its_primary(shard: Cluster, wait: str) -> None:
    """As ``test_hold_during_a_failover_of_its_primary``, with the asyncio client."""
    free, held = f"afailover:{{{wait}}}", f"afailover:{{{wait}}}:held"
    primary = shard.owner(free)
    replica = shard.replica_of(primary)

    async def test() -> None:
        client = redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=shard.live()[0].port)
        locks = dlock.asyncio.Locks(client, request_timeout=1, wait=wait)
        async with locks.hold(free, ttl=2, timeout=5):
            pass
        with primary.client() as admin:
            cmd(admin, "DLOCK.ACQUIRE", held, "holder", 2000)
        errors: list[BaseException] = []
        holds = [0]
        stop = asyncio.Event()

        async def come_and_go() -> None:
            while not stop.is_set():
                try:
                    async with locks.hold(free, ttl=2, timeout=5):
                        holds[0] += 1
                except Exception as error:
                    errors.append(error)
                    await asyncio.sleep(0.05)
                await asyncio.sleep(0)

        async def wait_in_line() -> int:
            async with locks.hold(held, ttl=5, timeout=10) as lease:
                assert fence_on(replica, held, lease.fence) == 1
                return lease.fence

        coming = asyncio.ensure_future(come_and_go())
        waiting = asyncio.ensure_future(wait_in_line())
        try:
            assert await in_thread(wait_until, lambda: in_line(primary, held), 5)
            await asyncio.sleep(0.2)
            await in_thread(shard.failover, replica)
            await asyncio.sleep(0.5)
        finally:
            stop.set()
        await coming
        assert await waiting > 0
        assert errors == []
        assert holds[0] > 0
        assert wait_until(lambda: shard.owner(free) is replica, 5)
        async with locks.hold(free, ttl=2, timeout=1) as lease:
            assert fence_on(replica, free, lease.fence) == 1
        await locks.aclose()
        await client.aclose()

    asyncio.run(asyncio.wait_for(test(), 30))


def test_asyncio_a_lease_keeps_renewing_through_a_failover_of_its_primary(
    shard: Cluster,
) -> None:
    resource = "arenewed:{c}"
    primary = shard.owner(resource)
    replica = shard.replica_of(primary)
    ttl = 1.5

    async def test() -> None:
        client = redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=shard.live()[0].port)
        locks = dlock.asyncio.Locks(client, request_timeout=0.5)
        async with locks.hold(resource, ttl=ttl, timeout=2) as lease:
            await in_thread(shard.failover, replica)
            await asyncio.sleep(2 * ttl)
            lease.check()
            assert fence_on(replica, resource, lease.fence) == 1
        assert not lease.lost.is_set()
        assert fence_on(replica, resource, lease.fence) == 0
        await locks.aclose()
        await client.aclose()

    asyncio.run(asyncio.wait_for(test(), 30))


def test_asyncio_hold_after_a_primary_is_killed(shard: Cluster) -> None:
    resource, kept = "akilled:{d}", "akilled:{d}:kept"
    primary = shard.owner(resource)
    replica = shard.replica_of(primary)

    async def test() -> None:
        client = redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=shard.live()[0].port)
        locks = dlock.asyncio.Locks(client, request_timeout=0.5)
        try:
            async with locks.hold(kept, ttl=9, timeout=2) as held:
                with primary.client() as admin:
                    assert cmd(admin, "WAIT", 1, 1000) == 1
                shard.kill(primary)
                killed = time.monotonic()
                async with locks.hold(resource, ttl=5, timeout=10) as lease:
                    assert role(replica)[:1] == [b"master"]
                    assert fence_on(replica, resource, lease.fence) == 1
                assert time.monotonic() - killed < 10
                held.check()
                assert fence_on(replica, kept, held.fence) == 1
            assert not held.lost.is_set()
        finally:
            await locks.aclose()
            await client.aclose()

    try:
        asyncio.run(asyncio.wait_for(test(), 30))
    finally:
        if primary.port in shard.down:
            shard.restart(primary)


def test_asyncio_a_lease_keeps_renewing_while_its_slot_migrates(shard: Cluster) -> None:
    resource, new = "amigrated:{e}", "amigrated:{e}:new"
    source = shard.owner(resource)
    target = next(
        node for node in shard.live() if role(node)[:1] == [b"master"] and node is not source
    )
    ttl = 1.5

    async def test() -> None:
        client = redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=shard.live()[0].port)
        locks = dlock.asyncio.Locks(client, request_timeout=0.5)
        slot = keyslot(source, resource)
        with target.client() as admin:
            admin.config_resetstat()
        async with locks.hold(resource, ttl=ttl, timeout=2) as lease:
            with target.client() as admin:
                cmd(admin, "CLUSTER", "SETSLOT", slot, "IMPORTING", node_id(source))
            with source.client() as admin:
                cmd(admin, "CLUSTER", "SETSLOT", slot, "MIGRATING", node_id(target))
                cmd(admin, "MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", resource)
            await asyncio.sleep(2 * ttl)
            lease.check()
            assert target.info()["dlock_renew_ok"] >= 2
            async with locks.hold(new, ttl=ttl, timeout=1) as other:
                with target.client() as admin:
                    assert cmd(admin, "ASKING")
                    assert cmd(admin, "DLOCK.FENCECHECK", new, other.fence) == 1
            for node in shard.live():
                if role(node)[:1] == [b"master"]:
                    with node.client() as admin:
                        cmd(admin, "CLUSTER", "SETSLOT", slot, "NODE", node_id(target))
            assert await in_thread(wait_until, lambda: shard.owner(resource) is target, 10)
            await asyncio.sleep(2 * ttl)
            lease.check()
            assert fence_on(target, resource, lease.fence) == 1
        assert not lease.lost.is_set()
        await locks.aclose()
        await client.aclose()

    asyncio.run(asyncio.wait_for(test(), 30))


# A blocking wait (wait="block", one ACQUIRE … WAIT) whose resource changes node while it waits.


def info_on(node: Server, resource: str, *, replica: bool = False) -> dict[Any, Any]:
    """``DLOCK.INFO resource`` on ``node`` (on a replica: after ``READONLY``), ``{}`` for nil."""
    with node.client() as probe:
        if replica:
            cmd(probe, "READONLY")
        reply = cmd(probe, "DLOCK.INFO", resource)
        return {} if reply is None else fields(reply)


def blocked_on(node: Server, resource: str) -> bool:
    """Whether one ACQUIRE … WAIT is blocked on ``node`` for ``resource``."""
    return bool(info_on(node, resource).get(b"waiters") == 1)


def move_slot(shard: Cluster, resource: str, held: int) -> Server:
    """Moves ``resource``'s slot, its key with it, from its primary to another one: IMPORTING on
    the target, MIGRATING on the source, MIGRATE of the key, then SETSLOT NODE on both. Returns
    the new owner."""
    source = shard.owner(resource)
    target = next(
        node for node in shard.live() if role(node)[:1] == [b"master"] and node is not source
    )
    slot = keyslot(source, resource)
    with target.client() as admin:
        cmd(admin, "CLUSTER", "SETSLOT", slot, "IMPORTING", node_id(source))
    with source.client() as admin:
        cmd(admin, "CLUSTER", "SETSLOT", slot, "MIGRATING", node_id(target))
        cmd(admin, "MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", resource)
    for node in (target, source):
        with node.client() as admin:
            cmd(admin, "CLUSTER", "SETSLOT", slot, "NODE", node_id(target))
    assert info_on(target, resource)[b"fence"] == held, "the holder's lease moved with the key"
    return target


def take_over(shard: Cluster, resource: str, held: int) -> Server:
    """``CLUSTER FAILOVER TAKEOVER`` on the replica of ``resource``'s primary, once the replica
    has the holder's lease (fence ``held``). Returns the new primary."""
    replica = shard.replica_of(shard.owner(resource))

    def has_it() -> bool:
        return bool(info_on(replica, resource, replica=True).get(b"fence") == held)

    assert wait_until(has_it, 5), "the holder's lease never reached the replica"
    with replica.client() as admin:
        assert cmd(admin, "CLUSTER", "FAILOVER", "TAKEOVER") == b"OK"
    assert wait_until(lambda: role(replica)[:1] == [b"master"], 10)
    return replica


# The holder's lease on the raw connection (ms): the waiter is served when it runs out.
HELD_MS = {"slot_move": 3000, "failover": 4000}
CHANGES: dict[str, Callable[[Cluster, str, int], Server]] = {
    "slot_move": move_slot,
    "failover": take_over,
}


def hold_raw(node: Server, resource: str, ttl_ms: int) -> int:
    with node.client() as admin:
        fence: int = cmd(admin, "DLOCK.ACQUIRE", resource, "holder", ttl_ms)
        return fence


@pytest.mark.parametrize("change", ["slot_move", "failover"])
def test_a_blocked_wait_goes_on_on_the_resources_new_node(shard: Cluster, change: str) -> None:
    """A waiter blocked in one ACQUIRE … WAIT (20 s) while its resource changes node: its slot
    moved to another primary (the old node answers the wait nil as the key leaves, long before
    its end), or its primary taken over by its replica (Redis 7.0 answers the wait
    ``UNBLOCKED``; Valkey 9 keeps it on the demoted node, which answers nil when the holder's
    lease runs out there). The wait goes on, same token, for what is left of it, on the new
    node, and is served there when the holder's lease runs out: a larger fence, the waiter's
    token the owner there."""
    resource = f"blocked:{{{change}}}"
    owner = shard.owner(resource)
    client = redis.cluster.RedisCluster(host="127.0.0.1", port=shard.live()[0].port)
    locks = dlock.Locks(client, request_timeout=1)
    held = hold_raw(owner, resource, HELD_MS[change])
    held_at = time.monotonic()
    served: list[tuple[int, Any]] = []
    errors: list[BaseException] = []
    now_on: list[Server] = []

    def wait_in_line() -> None:
        try:
            with locks.hold(resource, ttl=5, timeout=20) as lease:
                assert wait_until(lambda: bool(now_on), 5)
                owner_there = info_on(now_on[0], resource)[b"owner"]
                served.append((lease.fence, owner_there == lease.token.encode()))
        except Exception as error:
            errors.append(error)

    thread = threading.Thread(target=wait_in_line)
    thread.start()
    try:
        assert wait_until(lambda: blocked_on(owner, resource), 5), "the waiter blocks"
        now_on.append(CHANGES[change](shard, resource, held))
    finally:
        thread.join(25)
    assert errors == []
    assert len(served) == 1
    fence, owns_there = served[0]
    assert fence > held, "a larger fence than the holder's"
    assert owns_there, "served on the resource's new node"
    assert time.monotonic() - held_at < HELD_MS[change] / 1000 + 5, "when the holder's ran out"
    client.close()
    locks.close()


@pytest.mark.parametrize("change", ["slot_move", "failover"])
def test_asyncio_a_blocked_wait_goes_on_on_the_resources_new_node(
    shard: Cluster, change: str
) -> None:
    """As ``test_a_blocked_wait_goes_on_on_the_resources_new_node``, with the asyncio client."""
    resource = f"ablocked:{{{change}}}"
    owner = shard.owner(resource)

    async def test() -> None:
        client = redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=shard.live()[0].port)
        locks = dlock.asyncio.Locks(client, request_timeout=1)
        held = hold_raw(owner, resource, HELD_MS[change])
        held_at = time.monotonic()
        now_on: asyncio.Future[Server] = asyncio.get_running_loop().create_future()

        async def wait_in_line() -> tuple[int, bool]:
            async with locks.hold(resource, ttl=5, timeout=20) as lease:
                there = await now_on
                owner_there = info_on(there, resource)[b"owner"]
                return lease.fence, owner_there == lease.token.encode()

        waiting = asyncio.ensure_future(wait_in_line())
        try:
            assert await in_thread(wait_until, lambda: blocked_on(owner, resource), 5)
            now_on.set_result(await in_thread(CHANGES[change], shard, resource, held))
        finally:
            fence, owns_there = await waiting
        assert fence > held, "a larger fence than the holder's"
        assert owns_there, "served on the resource's new node"
        assert time.monotonic() - held_at < HELD_MS[change] / 1000 + 5
        await locks.aclose()
        await client.aclose()

    asyncio.run(asyncio.wait_for(test(), 30))
