//! The shared vectors (`protocol/vectors/`) hold for this client: the rules come from the
//! protocol crate, and these tests prove the translation into the `redis` crate's terms (replies
//! and errors parsed from the bytes a server sends, commands as they go on the wire).

use super::*;
use dlock_testkit::vectors::{Value as Json, list, load, text};

/// The RESP bytes of a reply as `replies.json` encodes it (`resp`: 2 or 3).
fn resp(value: &Json, version: u64, out: &mut Vec<u8>) {
    match value {
        Json::Null if version == 3 => out.extend_from_slice(b"_\r\n"),
        Json::Null => out.extend_from_slice(b"$-1\r\n"),
        Json::Number(n) => out.extend_from_slice(format!(":{n}\r\n").as_bytes()),
        Json::String(s) => {
            out.extend_from_slice(format!("${}\r\n", s.len()).as_bytes());
            out.extend_from_slice(s.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        Json::Array(items) => {
            out.extend_from_slice(format!("*{}\r\n", items.len()).as_bytes());
            for item in items {
                resp(item, version, out);
            }
        }
        Json::Object(object) => {
            if let Some(simple) = object.get("simple") {
                out.extend_from_slice(
                    format!("+{}\r\n", simple.as_str().expect("simple")).as_bytes(),
                );
            } else if let Some(error) = object.get("error") {
                out.extend_from_slice(
                    format!("-{}\r\n", error.as_str().expect("error")).as_bytes(),
                );
            } else {
                let pairs = list(&object["map"]);
                out.extend_from_slice(format!("%{}\r\n", pairs.len()).as_bytes());
                for pair in pairs {
                    resp(&pair[0], version, out);
                    resp(&pair[1], version, out);
                }
            }
        }
        Json::Bool(_) => panic!("no boolean replies"),
    }
}

fn parsed(value: &Json, version: u64) -> Value {
    let mut bytes = Vec::new();
    resp(value, version, &mut bytes);
    redis::parse_redis_value(&bytes).expect("a reply the redis crate parses")
}

#[test]
fn channels_tags_and_slots_are_the_shared_vectors() {
    for vector in list(&load("channels.json")) {
        assert_eq!(
            crate::channel_of(text(vector, "resource")),
            text(vector, "channel"),
            "{vector}"
        );
    }
    for vector in list(&load("tags.json")) {
        assert_eq!(crate::tickets::tag(text(vector, "token")), text(vector, "tag"), "{vector}");
    }
    for vector in list(&load("slots.json")) {
        let key = text(vector, "key");
        assert_eq!(
            Some(u64::from(crate::cluster::slot(key.as_bytes()))),
            vector["slot"].as_u64(),
            "{key}"
        );
    }
}

#[test]
fn commands_go_on_the_wire_as_the_vectors_say() {
    for vector in list(&load("commands.json")) {
        let args: Vec<Vec<u8>> = list(&vector["args"])
            .iter()
            .map(|arg| arg.as_str().expect("arg").as_bytes().to_vec())
            .collect();
        let sent: Vec<Vec<u8>> = cmd(args.clone())
            .args_iter()
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => bytes.to_vec(),
                redis::Arg::Cursor => panic!("no cursor"),
            })
            .collect();
        assert_eq!(sent, args, "{}", text(vector, "name"));
    }
}

#[test]
fn every_error_reply_parsed_by_the_redis_crate_keeps_its_class() {
    for vector in list(&load("errors.json")) {
        let reply = text(vector, "reply");
        let error = match parsed(
            &Json::Object([("error".to_owned(), Json::from(reply))].into_iter().collect()),
            2,
        ) {
            Value::ServerError(error) => RedisError::from(error),
            other => panic!("{reply} parsed as {other:?}"),
        };
        let class = class_of(&error).map(ErrorClass::name);
        assert_eq!(class, vector["class"].as_str(), "{reply}");
        assert_eq!(
            unsupported_option(&error),
            vector.get("option").and_then(Json::as_str),
            "{reply}"
        );
        // Errors of this side have no class: they are not the server's answer.
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert_eq!(class_of(&io), None);
    }
}

#[test]
fn info_replies_in_both_shapes_show_the_vectors_leader() {
    let replies = load("replies.json");
    for vector in list(&replies["info"]) {
        let version = vector["resp"].as_u64().expect("resp");
        let value = parsed(&vector["reply"], version);
        let leader = crate::election::leader_in(&value);
        let expected = vector["leader"].as_object().map(|leader| crate::Leader {
            token: leader["token"].as_str().expect("token").to_owned(),
            fence: leader["fence"].as_u64().expect("fence"),
            address: leader["address"].as_str().map(str::to_owned),
        });
        assert_eq!(leader, expected, "{} (RESP{version})", text(vector, "name"));
    }
    for vector in list(&replies["fenced"]) {
        let class = match parsed(&vector["reply"], 2) {
            Value::ServerError(error) => class_of(&RedisError::from(error)).map(ErrorClass::name),
            _ => None,
        };
        assert_eq!(class, vector["class"].as_str(), "{}", text(vector, "name"));
    }
}
