"""The threaded client: :class:`Locks` for ``redis.Redis`` and ``redis.cluster.RedisCluster``."""

from __future__ import annotations

import threading
import time
from collections.abc import Generator
from types import TracebackType
from typing import Any, Generic, TypeVar

import redis

from . import _common as common
from . import _protocol as protocol
from ._channels import Channels, Watch
from ._common import (
    Features,
    Leader,
    LeaseState,
    LeaseView,
    Request,
    SetLeaseView,
    SetRequest,
    SetState,
)
from ._connections import Nodes
from ._errors import NotAcquired, Stale
from ._metrics import Metrics, log
from ._protocol import Arg

__all__ = ["Hold", "Lease", "Locks", "SetHold", "SetLease"]


def _fenced(locks: Locks, resource: str, fence: int, command: tuple[Arg, ...]) -> Any:
    """``DLOCK.FENCED resource fence command…`` through the caller's client (see
    :meth:`Lease.fenced`)."""
    try:
        return locks.client.execute_command(*protocol.fenced_args(resource, fence, command))
    except redis.ResponseError as error:
        if protocol.class_of(error) == "stale":
            locks.metrics.stale_write(resource, fence, str(error))
            raise Stale(resource, fence, str(error)) from error
        raise
    except redis.exceptions.RedisClusterException as error:
        crossed = common.cross_slot(error)
        if crossed is not None:
            raise crossed from error
        raise


class Lease(LeaseView):
    """A granted lease: ``token`` owns ``resource`` with ``fence`` until the server's deadline,
    kept alive by renewals for as long as the ``with`` block runs."""

    def __init__(self, locks: Locks, state: LeaseState) -> None:
        super().__init__(state)
        self._locks = locks

    def fenced(self, *command: Arg) -> Any:
        """Runs ``command`` in the server only if this lease's fence is still the live one
        (``DLOCK.FENCED``), atomically, through the caller's client, and returns its reply.
        Raises :class:`dlock.Stale` when the server refused it: nothing was written."""
        return _fenced(self._locks, self.resource, self.fence, command)


class SetLease(SetLeaseView):
    """A granted set (:meth:`Locks.hold_all`): ``token`` owns every one of ``resources``, each
    with its fence (``fences``, in the same order; ``fence(resource)``), renewed whole for as
    long as the ``with`` block runs, and lost whole."""

    def __init__(self, locks: Locks, state: SetState) -> None:
        super().__init__(state)
        self._locks = locks

    def fenced(self, resource: str, *command: Arg) -> Any:
        """Runs ``command`` in the server only if the fence of the member ``resource`` is still
        the live one (``DLOCK.FENCED resource fence …``); raises :class:`dlock.Stale` when the
        server refused it: nothing was written."""
        return _fenced(self._locks, resource, self.fence(resource), command)


ViewT = TypeVar("ViewT", Lease, SetLease)


class _Block(Generic[ViewT]):
    """A ``with`` block over a lease or a set: acquired on entry, renewed by the ``Locks``'
    renewer while it runs, released when it exits."""

    def __init__(self, locks: Locks) -> None:
        self._locks = locks
        self._lease: ViewT | None = None

    def _acquire(self) -> tuple[LeaseState, ViewT]:
        raise NotImplementedError

    def __enter__(self) -> ViewT:
        if self._lease is not None:
            raise RuntimeError("dlock: a hold is entered once")
        state, self._lease = self._acquire()
        self._locks._renewer.add(state)
        return self._lease

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        assert self._lease is not None
        state = self._lease._state
        self._locks._renewer.remove(state)
        self._locks._unlisten(state)
        self._locks._finish(state)
        # The body's own exception always wins; otherwise a lost lease is never silent.
        if exc is None and state.lost.is_set():
            raise state.error()


class Hold(_Block[Lease]):
    """The context manager :meth:`Locks.hold`, :meth:`Locks.read`, :meth:`Locks.write` and
    :meth:`Locks.semaphore` return."""

    def __init__(self, locks: Locks, request: Request) -> None:
        super().__init__(locks)
        self._request = request

    def _acquire(self) -> tuple[LeaseState, Lease]:
        state = self._locks._acquire(self._request)
        return state, Lease(self._locks, state)


class SetHold(_Block[SetLease]):
    """The context manager :meth:`Locks.hold_all` returns."""

    def __init__(self, locks: Locks, request: SetRequest) -> None:
        super().__init__(locks)
        self._request = request

    def _acquire(self) -> tuple[LeaseState, SetLease]:
        state = self._locks._acquire_all(self._request)
        return state, SetLease(self._locks, state)


class Locks(common.Handles[Hold, SetHold]):
    """Lease locks on a Redis (or Valkey) server with the dlock module.

    ``client`` is a ``redis.Redis`` or ``redis.cluster.RedisCluster``; dlock makes its own
    connections with the same settings (address, credentials, TLS, protocol) but with
    ``request_timeout`` and without redis-py's retries. ``release_timeout`` bounds the RELEASE
    when a block exits (default: ``request_timeout``). One background thread per ``Locks``
    renews every held lease; it runs only while some lease is held.
    """

    def __init__(
        self,
        client: Any,
        *,
        request_timeout: float = 2.0,
        release_timeout: float | None = None,
        metrics: Metrics | None = None,
        wait: str = "block",
        ticket_ttl: float = 6.0,
    ) -> None:
        common.check_wait(wait, ticket_ttl)
        self.client = client
        self.wait = wait
        self.ticket_ttl = ticket_ttl
        self.request_timeout = request_timeout
        self.release_timeout = request_timeout if release_timeout is None else release_timeout
        self.metrics = metrics if metrics is not None else Metrics()
        self._nodes = Nodes(client, request_timeout)
        self._features_lock = threading.Lock()
        self._renewer = _Renewer(self)
        # Per held lease: the channel of each of its resources it listens on for its
        # revocation, and its watch there.
        self._listening: dict[LeaseState, list[tuple[Channels, Watch]]] = {}
        self._listening_lock = threading.Lock()

    def _hold(self, request: Request) -> Hold:
        return Hold(self, request)

    def _hold_all(self, request: SetRequest) -> SetHold:
        return SetHold(self, request)

    def features(self, resource: str = "dlock") -> Features:
        """The command options advertised by the server that serves ``resource`` (in a Cluster
        each node is asked on its own, so a rolling upgrade never gets an option sent to a node
        that lacks it), read once per server and ``Locks``."""
        connections = self._nodes.for_resource(resource)
        with self._features_lock:
            if connections.features is None:
                try:
                    reply = connections.call(common.FEATURES_COMMAND, self.request_timeout)
                except redis.ResponseError:
                    reply = None  # no COMMAND DOCS: version 1 only
                except common.FAILURES as error:
                    self._nodes.learn(error)
                    raise
                connections.features = Features.from_docs(reply)
            return connections.features

    def close(self) -> None:
        """Closes dlock's own connections (the caller's client stays open)."""
        self._nodes.close()

    def observe(self, name: str, *, interval: float = 2.0) -> Generator[Leader | None, None, None]:
        """The leaders of the election ``name`` (see :meth:`campaign`), as they change: first
        the one leading now, then each new one, ``None`` while nobody leads. Read with
        ``DLOCK.INFO`` on every message of the resource's channel, on every (re)subscription
        and every ``interval`` seconds (a ``DEL`` or ``RENAME`` of the key publishes nothing).
        A read that fails is tried again at the next of these. The subscription is made on
        the first ``next()`` and ends when the iterator is closed (``close()``, or leaving a
        ``for`` loop over it)."""
        if interval <= 0:
            raise ValueError("dlock: interval must be positive")
        return self._observe(name, interval)

    def _observe(self, name: str, interval: float) -> Generator[Leader | None, None, None]:
        channels = self._nodes.channels(name)
        watch = channels.join(name)
        try:
            last: Leader | bool | None = False  # nothing yielded yet
            while True:
                watch.event.clear()
                try:
                    reply = self._call(name, protocol.info_args(name), self.request_timeout)
                    leader = common.leader_from_info(reply)
                except common.FAILURES as error:
                    log.debug("dlock: reading the leader of %s failed: %s", name, error)
                else:
                    if leader != last:
                        last = leader
                        yield leader
                watch.event.wait(interval)
        finally:
            channels.leave(watch)

    # The commands.

    def _call(
        self,
        resource: str,
        args: Any,
        timeout: float,
        *,
        wait: float | None = None,
        alone: bool = False,
    ) -> Any:
        """Sends ``args`` to the server of ``resource`` and returns its reply, within
        ``timeout``: on a pooled connection, on one of its own (``alone``), or one that blocks in
        the server up to ``wait`` seconds (its reply comes after the wait). A MOVED or ASK is
        followed to the node it names (the request was not run), within the same timeout, at
        most ``common.MAX_REDIRECTS`` times; every failure is shown to the Cluster client's
        slot map (``Nodes.learn``) and raised as redis-py raised it."""
        deadline = time.monotonic() + timeout
        connections = None
        asking = False
        for hop in range(common.MAX_REDIRECTS + 1):
            left = max(0.001, deadline - time.monotonic())
            try:
                if connections is None:
                    connections = self._nodes.for_resource(resource)
                if asking:
                    return connections.call_asking(args, left, wait)
                if wait is not None:
                    return connections.call_blocking(args, wait)
                if alone:
                    return connections.call_alone(args, left)
                return connections.call(args, left)
            except common.FAILURES as error:
                self._nodes.learn(error)
                target = common.redirect(error)
                if (
                    target is None
                    or connections is None
                    or hop == common.MAX_REDIRECTS
                    or (wait is None and time.monotonic() >= deadline)
                ):
                    raise
                kind, host, port = target
                connections = self._nodes.at(connections, host, port)
                asking = kind == "ask"
        raise AssertionError("unreachable")

    def _acquire(self, request: Request) -> LeaseState:
        self.metrics.acquire_attempt()
        started = time.monotonic()
        plan = common.AcquirePlan(
            request.ttl,
            request.timeout,
            request.max_hold,
            self.request_timeout,
            ticket=self.ticket_ttl if self.wait == "tickets" else None,
        )
        try:
            state = self._try_acquire(request, plan)
        except BaseException as error:
            self.metrics.acquire_failed(common.acquire_failure(error, plan))
            raise
        self.metrics.acquired(
            request.resource, state.token, state.fence, time.monotonic() - started
        )
        return state

    def _try_acquire(self, request: Request, plan: common.AcquirePlan) -> LeaseState:
        resource = request.resource
        watch: Watch | None = None
        channels: Channels | None = None
        try:
            while True:
                if plan.queued and plan.left() <= 0:
                    self._withdraw(resource, common.forget_command(resource, plan.token))
                    raise NotAcquired(resource, request.timeout)
                if watch is not None:
                    watch.event.clear()  # a message from now on means: send again
                sent = time.monotonic()
                try:
                    # Read once per Locks; a failure to read them is retried like the ACQUIRE.
                    features = self.features(resource)
                    command, wait_ms, queue_ms = plan.next_command(features, request)
                    if queue_ms is not None:
                        serving = self._nodes.channels(resource)
                        if serving is not channels:
                            # Subscribed before the first ticket, and again where a failover or a
                            # migration moved the resource: no hand-over goes unheard.
                            if watch is not None and channels is not None:
                                channels.leave(watch)
                                watch = None
                            channels = serving
                            tag = common.token_tag(plan.token)
                            channel = plan.channel(resource, features)
                            watch = channels.join(resource, tag, channel=channel)
                            sent = time.monotonic()
                        plan.queued = True
                        connections = self._nodes.for_resource(resource)
                        with connections.ticket_requests:
                            reply = self._call(resource, command, self.request_timeout)
                    elif wait_ms is None:
                        reply = self._call(resource, command, self.request_timeout)
                    else:
                        wait = wait_ms / 1000
                        reply = self._call(resource, command, self.request_timeout, wait=wait)
                    fence = common.as_int(reply)
                except Exception as error:
                    if plan.retry_after(error):
                        time.sleep(plan.retry_pause())
                        continue
                    if plan.reached_server:
                        self._forget(resource, common.forget_command(resource, plan.token))
                    raise
                except BaseException:
                    # Interrupted (KeyboardInterrupt …) with a request out: a grant under our
                    # token may exist.
                    self._forget(resource, common.forget_command(resource, plan.token))
                    raise
                answer = plan.answered(fence, waited=wait_ms is not None)
                if answer == "granted":
                    assert fence is not None
                    state = plan.lease(resource, fence, sent, self.metrics, request.mode)
                    # Before a ticket's watch leaves: the channel stays subscribed.
                    self._listen(state)
                    return state
                if queue_ms is not None and watch is not None:
                    # In line: until a message for the resource, or the ticket's refresh.
                    try:
                        watch.event.wait(plan.refresh_in())
                    except BaseException:  # interrupted: the ticket stands
                        self._forget(resource, common.forget_command(resource, plan.token))
                        raise
                    # Told on its own channel: held from the message on, claimed by the renewer.
                    if watch.granted is not None:
                        started_state = plan.started_lease(
                            resource, watch.granted, self.metrics, request.mode
                        )
                        if started_state is not None:
                            self._listen(started_state)
                            return started_state
                elif answer == "nil":
                    if plan.gives_up(waited=wait_ms is not None):
                        raise NotAcquired(resource, request.timeout)
                    pause = plan.wait_again_in(waited=wait_ms is not None)
                    if pause > 0:
                        time.sleep(pause)
        finally:
            if watch is not None and channels is not None:
                channels.leave(watch)  # where it joined, wherever the resource is served now

    def _acquire_all(self, request: SetRequest) -> SetState:
        self.metrics.acquire_attempt()
        started = time.monotonic()
        plan = common.AcquirePlan(
            request.ttl, request.timeout, request.max_hold, self.request_timeout, request.ticket()
        )
        try:
            state = self._try_acquire_all(request, plan)
        except BaseException as error:
            self.metrics.acquire_failed(common.acquire_failure(error, plan))
            raise
        self.metrics.acquired(state.name, state.token, state.fence_name, time.monotonic() - started)
        return state

    def _try_acquire_all(self, request: SetRequest, plan: common.AcquirePlan) -> SetState:
        """``ACQUIREALL`` until it answers fences. With a wait: ``QUEUE``, subscribed to every
        member's channel first, sent again on any message of any of them (one event shared by
        their watches) and every third of the ticket's life; at the deadline ``RELEASEALL``
        without ``FENCES`` withdraws the tickets (and frees a grant whose reply was lost)."""
        resources = request.resources
        first = resources[0]
        forget = common.forget_set_command(resources, plan.token)
        woken = threading.Event()
        watches: list[tuple[Channels, Watch]] = []
        try:
            while True:
                if plan.queued and plan.left() <= 0:
                    self._withdraw(first, forget)
                    raise NotAcquired(request.name, request.timeout)
                woken.clear()  # a message from now on means: send again
                sent = time.monotonic()
                try:
                    command, queue_ms = plan.next_set_command(request)
                    if queue_ms is not None:
                        serving = [self._nodes.channels(resource) for resource in resources]
                        if [channels for channels, _ in watches] != serving:
                            # Subscribed to every member's channel before the first ticket, and
                            # again where a failover or a migration moved the set.
                            for channels, watch in watches:
                                channels.leave(watch)
                            watches = []
                            for channels, resource in zip(serving, resources):
                                watches.append((channels, channels.join(resource, event=woken)))
                            sent = time.monotonic()
                        plan.queued = True
                        with self._nodes.for_resource(first).ticket_requests:
                            reply = self._call(first, command, self.request_timeout)
                    else:
                        reply = self._call(first, command, self.request_timeout)
                    fences = common.as_fences(reply, len(resources))
                except Exception as error:
                    if plan.retry_after(error):
                        time.sleep(plan.retry_pause())
                        continue
                    if plan.reached_server:
                        self._forget(first, forget)
                    raise
                except BaseException:
                    self._forget(first, forget)  # interrupted with a request out
                    raise
                answer = plan.answered(None if fences is None else fences[0], waited=False)
                if answer == "granted":
                    assert fences is not None
                    state = plan.set_lease(resources, fences, sent, self.metrics)
                    # Before the tickets' watches leave: the channels stay subscribed.
                    self._listen(state)
                    return state
                if queue_ms is None:
                    raise NotAcquired(request.name, request.timeout)
                # In line: until a message on a member's channel, or the ticket's refresh.
                try:
                    woken.wait(plan.refresh_in())
                except BaseException:  # interrupted: the tickets stand
                    self._forget(first, forget)
                    raise
        finally:
            for channels, watch in watches:
                channels.leave(watch)

    def _listen(self, state: LeaseState) -> None:
        """Listens on the channel of each of the lease's resources (one; a set's members) for
        its revocation (``DLOCK.REVOKE``), without waiting for the subscription: a revocation
        that races it is caught by the next renewal, as ``renewal_refused``."""
        listening: list[tuple[Channels, Watch]] = []
        for resource, fence in state.members:
            try:
                channels = self._nodes.channels(resource)
            except common.FAILURES as error:  # no node known for the slot: renewals watch it
                log.debug("dlock: cannot listen on the channel of %s: %s", resource, error)
                continue
            listening.append((channels, channels.hold(resource, fence, state.revoked)))
        with self._listening_lock:
            self._listening[state] = listening

    def _unlisten(self, state: LeaseState) -> None:
        """Leaves the channels the lease listened on (unsubscribed if nobody else needs them)."""
        with self._listening_lock:
            listening = self._listening.pop(state, [])
        for channels, watch in listening:
            channels.leave(watch)

    def _keep_listening(self, state: LeaseState) -> None:
        """After a renewal: listens where the resources are served now (a failover or a
        migration moved them to another node, whose channels the module publishes on)."""
        with self._listening_lock:
            listening = self._listening.get(state)
        try:
            serving = [self._nodes.channels(resource) for resource, _ in state.members]
        except common.FAILURES:
            return
        if listening is not None and [channels for channels, _ in listening] != serving:
            self._unlisten(state)
            self._listen(state)

    def _withdraw(self, resource: str, command: list[Arg]) -> None:
        """At the caller's deadline: a RELEASE (a set's RELEASEALL) without fences takes the
        tickets out of line, or frees whatever they were granted meanwhile. The connection
        answered every earlier request, so nothing of ours is still on its way."""
        try:
            with self._nodes.for_resource(resource).ticket_requests:
                self._call(resource, command, self.release_timeout)
        except common.FAILURES as error:
            log.debug("dlock: could not withdraw a ticket on %s: %s", resource, error)
            self._forget(resource, command)

    def _forget(self, resource: str, command: list[Arg]) -> None:
        """After an acquire that failed on this side (its connection is closed by now): a grant
        or a ticket under the attempt's token may exist; ``command`` (``forget_command``, a
        set's ``forget_set_command``) releases it from a connection opened for it, within
        ``release_timeout``, and once more after a short pause if the first found nothing (see
        ``FORGET_AGAIN_AFTER``). What no RELEASE reaches ends with its claim window or its ttl
        (a ticket: its life)."""
        for attempt in range(2):
            if attempt:
                time.sleep(common.FORGET_AGAIN_AFTER)
            try:
                released = common.as_int(
                    self._call(resource, command, self.release_timeout, alone=True)
                )
            except common.FAILURES as error:
                log.debug("dlock: could not release an unknown grant on %s: %s", resource, error)
                return
            if released:
                log.debug("dlock: released a grant on %s the acquire never learned", resource)
                return

    def _renew(self, state: LeaseState, ttl_ms: int) -> bool | None:
        """One RENEW: ``True`` renewed (the local expiry moves on), ``False`` refused, ``None``
        no answer in time (both counted as renewal failures)."""
        sent = time.monotonic()
        try:
            command = state.renew_command(self.features(state.resource), ttl_ms)
            renewed = common.as_int(
                self._call(state.resource, command, state.renew_timeout(sent, self.request_timeout))
            )
        except common.FAILURES as error:
            # Not a refusal (a failover, a migration, a node that answers no more): tried again
            # soon, on the node that serves the resource by then, until the local expiry.
            log.debug("dlock: renewal of %s failed: %s", state.resource, error)
            state.renewal_failed(refused=False)
            return None
        if renewed == 1:
            state.renewed(sent, ttl_ms)
            self._keep_listening(state)
            return True
        state.renewal_failed(refused=True)
        return False

    def _finish(self, state: LeaseState) -> None:
        """Releases the lease when its block exits, bounded by ``release_timeout``. Never
        raises. A RELEASE whose outcome is unknown for a lease still believed live is a release
        failure (logged and counted); one that finds the lease gone is the loss ``ended``; after
        a loss already reported (a local expiry the renewer did not get to is one) the RELEASE
        is best effort, neither, whatever it answers. A revoked lease is not released: the
        server ended it (a set whose member was revoked is: its other members, best effort)."""
        if state.reason == "revoked" and len(state.members) == 1:
            self.metrics.ended(
                state.name, state.token, state.fence_name, time.monotonic() - state.granted_at
            )
            return
        live = not state.expire()
        outcome: bool | None = None
        try:
            command = state.release_command(self.features(state.resource))
            released = common.as_int(self._call(state.resource, command, self.release_timeout))
            # A set: every member released, else one ended before the block did.
            outcome = released == len(state.members)
            if not outcome:
                # Gone before the block ended: the end of the work was not protected.
                state.lose("ended")
        except Exception as error:  # never raised over the body's own outcome
            log.debug("dlock: release of %s failed: %s", state.resource, error)
            if time.monotonic() >= state.due_expiry():
                state.lose("unreachable")
        held = time.monotonic() - state.granted_at
        if live:
            self.metrics.released(state.name, state.token, state.fence_name, held, outcome)
        else:
            self.metrics.ended(state.name, state.token, state.fence_name, held)


class _Renewer:
    """One thread per :class:`Locks` renews every held lease when it is due; it exits when no
    lease is held and starts again with the next one."""

    def __init__(self, locks: Locks) -> None:
        self._locks = locks
        self._leases: set[LeaseState] = set()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    def add(self, state: LeaseState) -> None:
        with self._wake:
            self._leases.add(state)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="dlock-renewer", daemon=True)
                self._thread.start()
            self._wake.notify()

    def remove(self, state: LeaseState) -> None:
        with self._wake:
            self._leases.discard(state)
            self._wake.notify()

    def _held(self, state: LeaseState) -> bool:
        with self._wake:
            return state in self._leases

    def _run(self) -> None:
        while True:
            with self._wake:
                if not self._leases:
                    self._thread = None
                    return
                state = min(self._leases, key=LeaseState.due)
                delay = state.due() - time.monotonic()
                if delay > 0:
                    # Every held lease lost: sleep until one is added or removed.
                    self._wake.wait(None if delay == float("inf") else delay)
                    continue
            try:
                if self._held(state):
                    self._renew(state)
            except Exception:  # never let the thread die: leases would go unrenewed
                log.exception("dlock: renewal of %s failed unexpectedly", state.name)
                state.renewal_failed(refused=False)

    def _renew(self, state: LeaseState) -> None:
        action = state.step(time.monotonic())
        if isinstance(action, str):
            state.lose(action)
        elif action is not None:
            refused = self._locks._renew(state, action) is False
            # A RENEW that was in flight when the block exited may be refused: not a loss.
            if refused and self._held(state):
                state.lose("renewal_refused")
