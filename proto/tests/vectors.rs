//! Every shared vector in `protocol/vectors/` holds for this crate: the rules the module and the
//! Rust client use are the ones every other client's tests check against the same files.

use dlock_proto::command::{self, Acquire, Mode, Wait};
use dlock_proto::error::{self, ErrorClass};
use dlock_proto::reply::{self, Reply};
use dlock_proto::{channel, slot};
use dlock_testkit::vectors::{Value, list, load, text};

fn int(vector: &Value, name: &str) -> Option<u64> {
    vector.get(name).and_then(Value::as_u64)
}

#[test]
fn channel_names() {
    for vector in list(&load("channels.json")) {
        assert_eq!(channel::name_of(text(vector, "resource")), text(vector, "channel"), "{vector}");
    }
}

#[test]
fn hand_over_tags() {
    for vector in list(&load("tags.json")) {
        assert_eq!(
            channel::tag_hex(text(vector, "token").as_bytes()),
            text(vector, "tag"),
            "{vector}"
        );
    }
}

#[test]
fn messages_published_and_who_they_wake() {
    let messages = load("messages.json");
    for vector in list(&messages["published"]) {
        let holder = vector.get("holder").and_then(Value::as_str).map(str::as_bytes);
        let message =
            channel::message(text(vector, "event"), int(vector, "fence").expect("fence"), holder);
        assert_eq!(String::from_utf8_lossy(&message), text(vector, "message"), "{vector}");
    }
    for vector in list(&messages["revoked"]) {
        let parsed = channel::revoked(text(vector, "message"));
        match vector["fence"].as_u64() {
            Some(fence) => assert_eq!(parsed, Some((fence, text(vector, "reason"))), "{vector}"),
            None => assert_eq!(parsed, None, "{vector}"),
        }
    }
    for vector in list(&messages["wakes"]) {
        let mine = vector["tag"].as_str();
        assert_eq!(
            channel::wakes(text(vector, "message"), mine),
            vector["wakes"] == true,
            "{vector}"
        );
    }
}

#[test]
fn key_slots() {
    for vector in list(&load("slots.json")) {
        let key = text(vector, "key");
        assert_eq!(
            u64::from(slot::key_slot(key.as_bytes())),
            int(vector, "slot").expect("slot"),
            "{key}"
        );
    }
}

/// The argument vector this crate builds for a `commands.json` vector.
pub fn build(vector: &Value) -> command::Args {
    let resource = text(vector, "resource");
    let fence = int(vector, "fence");
    match text(vector, "form") {
        "acquire" => Acquire {
            resource,
            token: text(vector, "token"),
            ttl_ms: int(vector, "ttl_ms").expect("ttl_ms"),
            mode: match vector.get("mode").and_then(Value::as_str) {
                None | Some("exclusive") => Mode::Exclusive,
                Some("shared") => Mode::Shared,
                Some("permits") => Mode::Permits(int(vector, "permits").expect("permits") as u32),
                Some(other) => panic!("mode {other}"),
            },
            wait: match (int(vector, "wait_ms"), int(vector, "queue_ms")) {
                (Some(ms), None) => Wait::Block(ms),
                (None, Some(ms)) => Wait::Queue(ms),
                (None, None) => Wait::No,
                _ => panic!("both WAIT and QUEUE: {vector}"),
            },
            claim_ms: int(vector, "claim_ms"),
            meta: vector.get("meta").and_then(Value::as_str).map(str::as_bytes),
            notify: int(vector, "notify"),
        }
        .args(),
        "renew" => command::renew(
            resource,
            text(vector, "token"),
            int(vector, "ttl_ms").expect("ttl"),
            fence,
        ),
        "release" => command::release(resource, text(vector, "token"), fence),
        "fencecheck" => command::fencecheck(resource, fence.expect("fence")),
        "info" => command::info(resource),
        "fenced" => {
            let inner: Vec<&[u8]> = list(&vector["inner"])
                .iter()
                .map(|arg| arg.as_str().expect("arg").as_bytes())
                .collect();
            command::fenced(resource, fence.expect("fence"), inner)
        }
        other => panic!("form {other}"),
    }
}

#[test]
fn argument_vectors_of_every_command_form() {
    let vectors = load("commands.json");
    for vector in list(&vectors) {
        let built: Vec<String> =
            build(vector).iter().map(|a| String::from_utf8_lossy(a).into_owned()).collect();
        let expected: Vec<&str> =
            list(&vector["args"]).iter().map(|a| a.as_str().expect("arg")).collect();
        assert_eq!(built, expected, "{}", text(vector, "name"));
    }
    assert!(list(&vectors).len() >= 20);
}

#[test]
fn error_replies_and_their_classes() {
    let vectors = load("errors.json");
    check_errors(&vectors);
    for class in ErrorClass::ALL {
        assert!(
            list(&vectors).iter().any(|vector| vector["class"] == class.name()),
            "no vector of class {}",
            class.name()
        );
    }
}

/// Each error vector's class, the option it says an older server refused, and its bound.
fn check_errors(vectors: &Value) {
    for vector in list(vectors) {
        let reply = text(vector, "reply");
        assert_eq!(error::classify(reply).name(), text(vector, "class"), "{reply}");
        assert_eq!(
            error::unsupported_option(reply),
            vector.get("option").and_then(Value::as_str),
            "{reply}"
        );
        if let Some(bound) = int(vector, "bound") {
            assert_eq!(error::upper_bound(reply), Some(bound), "{reply}");
        }
    }
}

/// `notify.json`: a ticket's own channel, the `granted` message on it, `NOTIFY` in the ACQUIRE
/// and the errors about it, and the local expiry a `granted` message gives.
#[test]
fn tickets_told_on_their_own_channel() {
    let vectors = load("notify.json");
    for vector in list(&vectors["tags"]) {
        let tag = channel::wide_tag(text(vector, "token").as_bytes());
        assert_eq!(format!("{tag:016x}"), text(vector, "wide_tag"), "{vector}");
    }
    for vector in list(&vectors["channels"]) {
        let name = channel::ticket_name_of(text(vector, "resource"), text(vector, "token"));
        assert_eq!(name, text(vector, "channel"), "{vector}");
    }
    for vector in list(&vectors["granted"]) {
        let parsed = channel::granted(text(vector, "message"));
        let expected = int(vector, "fence").map(|fence| channel::Granted {
            fence,
            request: int(vector, "request").expect("request"),
            window_ms: int(vector, "window_ms").expect("window_ms"),
        });
        assert_eq!(parsed, expected, "{vector}");
        if let Some(granted) = expected {
            let mut buffer = [0; channel::MAX_GRANTED];
            let written = channel::write_granted(
                granted.fence,
                granted.request,
                granted.window_ms,
                &mut buffer,
            );
            assert_eq!(String::from_utf8_lossy(written), text(vector, "message"));
        }
    }
    for vector in list(&vectors["commands"]) {
        let built: Vec<String> =
            build(vector).iter().map(|a| String::from_utf8_lossy(a).into_owned()).collect();
        let expected: Vec<&str> =
            list(&vector["args"]).iter().map(|a| a.as_str().expect("arg")).collect();
        assert_eq!(built, expected, "{}", text(vector, "name"));
    }
    check_errors(&vectors["errors"]);
    for vector in list(&vectors["expiry"]) {
        let granted = channel::granted(text(vector, "message")).expect("a granted message");
        let sent =
            |request: u64| vector["sent_ms"].get(request.to_string()).and_then(Value::as_u64);
        let expiry = channel::granted_expiry(&granted, sent, |at, ms| at + ms);
        assert_eq!(expiry, int(vector, "expiry_ms"), "{vector}");
    }
}

/// A reply as `replies.json` encodes it.
pub fn decode(value: &Value) -> Reply {
    match value {
        Value::Null => Reply::Nil,
        Value::Number(n) => Reply::Int(n.as_i64().expect("an integer reply")),
        Value::String(s) => Reply::Bulk(s.as_bytes().to_vec()),
        Value::Array(items) => Reply::Array(items.iter().map(decode).collect()),
        Value::Object(object) => {
            if let Some(simple) = object.get("simple") {
                Reply::Simple(simple.as_str().expect("simple").to_owned())
            } else if let Some(error) = object.get("error") {
                Reply::Error(error.as_str().expect("error").to_owned())
            } else {
                let pairs = list(&object["map"])
                    .iter()
                    .map(|pair| (decode(&pair[0]), decode(&pair[1])))
                    .collect();
                Reply::Map(pairs)
            }
        }
        Value::Bool(_) => panic!("no boolean replies"),
    }
}

fn expected_info(value: &Value) -> Option<reply::Info> {
    if value.is_null() {
        return None;
    }
    let strings = |name: &str| {
        list(&value[name]).iter().map(|s| s.as_str().expect("text").to_owned()).collect()
    };
    let optional = |name: &str| value[name].as_str().map(str::to_owned);
    Some(reply::Info {
        owner: optional("owner"),
        fence: value["fence"].as_u64(),
        ttl_ms: value["ttl_ms"].as_u64().expect("ttl_ms"),
        waiters: value["waiters"].as_u64().expect("waiters"),
        next_waiters: strings("next_waiters"),
        tickets: value["tickets"].as_u64().expect("tickets"),
        mode: optional("mode"),
        holders: value["holders"].as_u64().expect("holders"),
        meta: optional("meta"),
        leases: list(&value["leases"])
            .iter()
            .map(|lease| reply::Holder {
                token: text(lease, "token").to_owned(),
                fence: lease["fence"].as_u64().expect("fence"),
                ttl_ms: lease["ttl_ms"].as_u64().expect("ttl_ms"),
                meta: lease["meta"].as_str().map(str::to_owned),
            })
            .collect(),
    })
}

#[test]
fn info_replies_in_both_shapes_and_the_leader_they_show() {
    let replies = load("replies.json");
    for vector in list(&replies["info"]) {
        let name = format!("{} (RESP{})", text(vector, "name"), vector["resp"]);
        let reply = decode(&vector["reply"]);
        assert_eq!(reply::info(&reply), Ok(expected_info(&vector["info"])), "{name}");
        let leader = vector["leader"].as_object().map(|leader| reply::Leader {
            token: leader["token"].as_str().expect("token").to_owned(),
            fence: leader["fence"].as_u64().expect("fence"),
            address: leader["address"].as_str().map(str::to_owned),
        });
        assert_eq!(reply::leader(&reply), leader, "{name}");
    }
    assert!(reply::info(&Reply::Int(1)).is_err(), "an integer is not an INFO reply");
}

#[test]
fn fenced_replies_pass_through_or_name_their_class() {
    let replies = load("replies.json");
    for vector in list(&replies["fenced"]) {
        let class = match decode(&vector["reply"]) {
            Reply::Error(text) => Some(error::classify(&text).name()),
            _ => None,
        };
        assert_eq!(class, vector["class"].as_str(), "{}", text(vector, "name"));
    }
}
