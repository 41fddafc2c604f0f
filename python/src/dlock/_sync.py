"""The threaded client: :class:`Locks` for ``redis.Redis`` and ``redis.cluster.RedisCluster``."""

from __future__ import annotations

import threading
import time
from collections.abc import Generator
from types import TracebackType
from typing import Any

import redis

from . import _common as common
from . import _protocol as protocol
from ._channels import Channels, Watch
from ._common import Features, Leader, LeaseState, LeaseView, Request
from ._connections import Nodes
from ._errors import NotAcquired, Stale
from ._metrics import Metrics, log
from ._protocol import Arg

__all__ = ["Hold", "Lease", "Locks"]


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
        try:
            return self._locks.client.execute_command(
                *protocol.fenced_args(self.resource, self.fence, command)
            )
        except redis.ResponseError as error:
            if protocol.class_of(error) == "stale":
                self._locks.metrics.stale_write(self.resource, self.fence, str(error))
                raise Stale(self.resource, self.fence, str(error)) from error
            raise
        except redis.exceptions.RedisClusterException as error:
            crossed = common.cross_slot(error)
            if crossed is not None:
                raise crossed from error
            raise


class Hold:
    """The context manager :meth:`Locks.hold`, :meth:`Locks.read`, :meth:`Locks.write` and
    :meth:`Locks.semaphore` return."""

    def __init__(self, locks: Locks, request: Request) -> None:
        self._locks = locks
        self._request = request
        self._lease: Lease | None = None

    def __enter__(self) -> Lease:
        if self._lease is not None:
            raise RuntimeError("dlock: a hold is entered once")
        state = self._locks._acquire(self._request)
        self._lease = Lease(self._locks, state)
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


class Locks(common.Handles[Hold]):
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
        # Per held lease: the channel it listens on for its revocation, and its watch there.
        self._listening: dict[LeaseState, tuple[Channels, Watch]] = {}
        self._listening_lock = threading.Lock()

    def _hold(self, request: Request) -> Hold:
        return Hold(self, request)

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
                    self._withdraw(request, plan.token)
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
                            watch = channels.join(resource, common.token_tag(plan.token))
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
                        self._forget(resource, plan.token)
                    raise
                except BaseException:
                    # Interrupted (KeyboardInterrupt …) with a request out: a grant under our
                    # token may exist.
                    self._forget(resource, plan.token)
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
                        self._forget(resource, plan.token)
                        raise
                elif answer == "nil":
                    if plan.gives_up(waited=wait_ms is not None):
                        raise NotAcquired(resource, request.timeout)
                    pause = plan.wait_again_in(waited=wait_ms is not None)
                    if pause > 0:
                        time.sleep(pause)
        finally:
            if watch is not None and channels is not None:
                channels.leave(watch)  # where it joined, wherever the resource is served now

    def _listen(self, state: LeaseState) -> None:
        """Listens on the lease's resource's channel for its revocation (``DLOCK.REVOKE``),
        without waiting for the subscription: a revocation that races it is caught by the next
        renewal, as ``renewal_refused``."""
        try:
            channels = self._nodes.channels(state.resource)
        except common.FAILURES as error:  # no node known for the slot: renewals watch it
            log.debug("dlock: cannot listen on the channel of %s: %s", state.resource, error)
            return
        watch = channels.hold(state.resource, state.fence, state.revoked)
        with self._listening_lock:
            self._listening[state] = (channels, watch)

    def _unlisten(self, state: LeaseState) -> None:
        """Leaves the channel the lease listened on (unsubscribed if nobody else needs it)."""
        with self._listening_lock:
            listening = self._listening.pop(state, None)
        if listening is not None:
            channels, watch = listening
            channels.leave(watch)

    def _keep_listening(self, state: LeaseState) -> None:
        """After a renewal: listens where the resource is served now (a failover or a migration
        moved it to another node, whose channel the module publishes on)."""
        with self._listening_lock:
            listening = self._listening.get(state)
        try:
            serving = self._nodes.channels(state.resource)
        except common.FAILURES:
            return
        if listening is not None and listening[0] is not serving:
            self._unlisten(state)
            self._listen(state)

    def _withdraw(self, request: Request, token: str) -> None:
        """At the caller's deadline: a RELEASE without ``FENCE`` takes the ticket out of line,
        or frees whatever it was granted meanwhile. The connection answered every earlier
        request, so nothing of ours is still on its way."""
        resource = request.resource
        try:
            with self._nodes.for_resource(resource).ticket_requests:
                self._call(resource, common.forget_command(resource, token), self.release_timeout)
        except common.FAILURES as error:
            log.debug("dlock: could not withdraw a ticket on %s: %s", resource, error)
            self._forget(resource, token)

    def _forget(self, resource: str, token: str) -> None:
        """After an acquire that failed on this side (its connection is closed by now): a grant
        or a ticket under ``token`` may exist; release it from a connection opened for it,
        within ``release_timeout`` per RELEASE, and once more after a short pause if the first
        found nothing (see ``FORGET_AGAIN_AFTER``). What no RELEASE reaches ends with its claim
        window or its ttl (a ticket: its life)."""
        command = common.forget_command(resource, token)
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
            if released == 1:
                log.debug("dlock: released a grant on %s the acquire never learned", resource)
                return

    def _renew(self, state: LeaseState, ttl_ms: int) -> bool | None:
        """One RENEW: ``True`` renewed (the local expiry moves on), ``False`` refused, ``None``
        no answer in time (both counted as renewal failures)."""
        sent = time.monotonic()
        try:
            features = self.features(state.resource)
            command = common.renew_command(
                features, state.resource, state.token, ttl_ms, state.fence
            )
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
        server ended it."""
        if state.reason == "revoked":
            self.metrics.ended(
                state.resource, state.token, state.fence, time.monotonic() - state.granted_at
            )
            return
        live = not state.expire()
        outcome: bool | None = None
        try:
            features = self.features(state.resource)
            command = common.release_command(features, state.resource, state.token, state.fence)
            released = common.as_int(self._call(state.resource, command, self.release_timeout))
            outcome = released == 1
            if not outcome:
                # Gone before the block ended: the end of the work was not protected.
                state.lose("ended")
        except Exception as error:  # never raised over the body's own outcome
            log.debug("dlock: release of %s failed: %s", state.resource, error)
            if time.monotonic() >= state.due_expiry():
                state.lose("unreachable")
        held = time.monotonic() - state.granted_at
        if live:
            self.metrics.released(state.resource, state.token, state.fence, held, outcome)
        else:
            self.metrics.ended(state.resource, state.token, state.fence, held)


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
                log.exception("dlock: renewal of %s failed unexpectedly", state.resource)
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
