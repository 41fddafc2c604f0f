"""The shared vectors (``protocol/vectors/*.json``) hold for the Python client: the rules in
``dlock._protocol`` are the ones the module and the Rust client are tested against. Error replies
go through redis-py's own parser first, as they do on the wire."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, cast

import redis
from redis._parsers.base import BaseParser
from redis.crc import key_slot

from dlock import _common as common
from dlock import _protocol as protocol

# redis-py's parser of error replies (untyped): what a client of it gets for each reply.
parse_error = cast(Callable[[str], BaseException], BaseParser.parse_error)

VECTORS = Path(__file__).parents[2] / "protocol" / "vectors"


def load(name: str) -> Any:
    return json.loads((VECTORS / name).read_text(encoding="utf-8"))


def test_channel_names() -> None:
    vectors = load("channels.json")
    assert len(vectors) >= 10
    for vector in vectors:
        assert protocol.channel_name(vector["resource"]) == vector["channel"], vector


def test_hand_over_tags() -> None:
    for vector in load("tags.json"):
        assert protocol.token_tag(vector["token"]) == vector["tag"], vector


def test_who_a_channel_message_wakes() -> None:
    for vector in load("messages.json")["wakes"]:
        assert protocol.wakes(vector["message"], vector["tag"]) == vector["wakes"], vector


def test_the_fence_and_reason_of_a_revoked_message() -> None:
    vectors = load("messages.json")["revoked"]
    assert vectors
    for vector in vectors:
        expected = None if vector["fence"] is None else (vector["fence"], vector["reason"])
        assert protocol.revoked(vector["message"]) == expected, vector


def test_key_slots_as_redis_py_routes_them() -> None:
    # The client routes through redis-py's Cluster client: its slot rule must be the server's.
    for vector in load("slots.json"):
        assert key_slot(vector["key"].encode()) == vector["slot"], vector


def build(vector: dict[str, Any]) -> list[Any]:
    form = vector["form"]
    if form == "acquire":
        mode = vector.get("mode", "exclusive")
        return protocol.acquire_args(
            vector["resource"],
            vector["token"],
            vector["ttl_ms"],
            shared=mode != "exclusive",
            limit=vector.get("permits"),
            wait_ms=vector.get("wait_ms"),
            queue_ms=vector.get("queue_ms"),
            claim_ms=vector.get("claim_ms"),
            meta=vector.get("meta"),
            notify=vector.get("notify"),
        )
    if form == "renew":
        return protocol.renew_args(
            vector["resource"], vector["token"], vector["ttl_ms"], vector.get("fence")
        )
    if form == "release":
        return protocol.release_args(vector["resource"], vector["token"], vector.get("fence"))
    if form == "fencecheck":
        return protocol.fencecheck_args(vector["resource"], vector["fence"])
    if form == "info":
        return protocol.info_args(vector["resource"])
    assert form == "fenced", form
    return protocol.fenced_args(vector["resource"], vector["fence"], tuple(vector["inner"]))


def test_argument_vectors_of_every_command_form() -> None:
    vectors = load("commands.json")
    assert len(vectors) >= 20
    for vector in vectors:
        # redis-py sends every argument as its str() (ints in decimal).
        assert [str(arg) for arg in build(vector)] == vector["args"], vector["name"]


def test_the_client_sends_the_vectors_to_a_server_with_every_option() -> None:
    everything = common.Features(
        acquire=frozenset(common.OPTION_TOKENS),
        renew=frozenset({"FENCE"}),
        release=frozenset({"FENCE"}),
    )
    for vector in load("commands.json"):
        if vector["form"] != "acquire" or "queue_ms" in vector:
            continue
        mode = common.EXCLUSIVE
        if vector.get("mode") == "shared":
            mode = common.SHARED
        elif vector.get("mode") == "permits":
            mode = common.semaphore_mode(vector["permits"])
        sent = common.acquire_command(
            everything,
            vector["resource"],
            vector["token"],
            vector["ttl_ms"],
            wait_ms=vector.get("wait_ms"),
            claim_ms=vector.get("claim_ms"),
            meta=vector.get("meta"),
            mode=mode,
        )
        assert [str(arg) for arg in sent] == vector["args"], vector["name"]


def test_error_replies_parsed_by_redis_py_keep_their_class() -> None:
    vectors = load("errors.json")
    assert {vector["class"] for vector in vectors} == set(protocol.ERROR_CLASSES)
    check_errors(vectors)


def test_tickets_told_on_their_own_channel() -> None:
    vectors = load("notify.json")
    for vector in vectors["tags"]:
        assert protocol.wide_tag(vector["token"]) == vector["wide_tag"], vector
    for vector in vectors["channels"]:
        channel = protocol.ticket_channel_name(vector["resource"], vector["token"])
        assert channel == vector["channel"], vector
    for vector in vectors["granted"]:
        expected = None
        if vector["fence"] is not None:
            expected = protocol.Granted(vector["fence"], vector["request"], vector["window_ms"])
        assert protocol.granted(vector["message"]) == expected, vector
    for vector in vectors["commands"]:
        assert [str(arg) for arg in build(vector)] == vector["args"], vector["name"]
    check_errors(vectors["errors"])
    for vector in vectors["expiry"]:
        message = protocol.granted(vector["message"])
        assert message is not None
        sent_at = {int(request): ms / 1000 for request, ms in vector["sent_ms"].items()}
        expiry = protocol.granted_expiry(message, sent_at)
        expected = None if vector["expiry_ms"] is None else vector["expiry_ms"] / 1000
        assert expiry == expected, vector


def check_errors(vectors: list[dict[str, Any]]) -> None:
    for vector in vectors:
        reply = vector["reply"]
        assert protocol.error_class(reply) == vector["class"], reply
        assert protocol.unsupported_option(reply) == vector.get("option"), reply
        if "bound" in vector:
            assert protocol.upper_bound(reply) == vector["bound"], reply
        error = parse_error(reply)
        assert protocol.class_of(error) == vector["class"], (reply, type(error))
    assert protocol.class_of(redis.ConnectionError("reset")) is None
    assert protocol.class_of(redis.TimeoutError("slow")) is None


def expected_info(value: dict[str, Any] | None) -> protocol.Info | None:
    if value is None:
        return None
    leases = tuple(
        protocol.Holder(lease["token"], lease["fence"], lease["ttl_ms"], lease["meta"])
        for lease in value["leases"]
    )
    return protocol.Info(
        owner=value["owner"],
        fence=value["fence"],
        ttl_ms=value["ttl_ms"],
        waiters=value["waiters"],
        next_waiters=tuple(value["next_waiters"]),
        tickets=value["tickets"],
        mode=value["mode"],
        holders=value["holders"],
        meta=value["meta"],
        leases=leases,
    )


def as_redis_py(value: Any) -> Any:
    """A reply of ``replies.json`` as redis-py hands it over (bulk strings as bytes, a RESP3
    map as a dict, a simple string as str)."""
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, list):
        return [as_redis_py(item) for item in value]
    if isinstance(value, dict):
        if "simple" in value:
            return value["simple"]
        if "error" in value:
            return parse_error(value["error"])
        return {as_redis_py(k): as_redis_py(v) for k, v in value["map"]}
    return value


def test_info_replies_in_both_shapes_and_the_leader_they_show() -> None:
    replies = load("replies.json")
    for vector in replies["info"]:
        reply = as_redis_py(vector["reply"])
        name = f"{vector['name']} (RESP{vector['resp']})"
        assert protocol.parse_info(reply) == expected_info(vector["info"]), name
        leader = protocol.leader_from_info(reply)
        expected = vector["leader"]
        if expected is None:
            assert leader is None, name
        else:
            address, fence, token = expected["address"], expected["fence"], expected["token"]
            assert leader == protocol.Leader(address, fence, token), name
    for vector in replies["fenced"]:
        reply = as_redis_py(vector["reply"])
        found = protocol.class_of(reply) if isinstance(reply, BaseException) else None
        assert found == vector["class"], vector["name"]
