//! A channel message nobody can hear is not sent, and every subscriber still hears every message:
//! by channel, by pattern, subscribed while the server was running without the module, or
//! subscribed a moment before the grant.

use std::thread::sleep;
use std::time::Duration;

use dlock_testkit::*;

fn counter(con: &mut redis::Connection, field: &str) -> u64 {
    info_line(con, "dlock", &format!("dlock_{field}"))
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("INFO dlock has {field}"))
}

fn acquire_and_release(con: &mut redis::Connection, resource: &str) {
    let fence: Option<i64> =
        redis::cmd("DLOCK.ACQUIRE").arg(&[resource, "t", "10000"]).query(con).expect("ACQUIRE");
    assert!(fence.is_some());
    let released: i64 = redis::cmd("DLOCK.RELEASE").arg(&[resource, "t"]).query(con).unwrap();
    assert_eq!(released, 1);
}

/// The next message on `pubsub`, as text.
fn next(pubsub: &mut redis::PubSub<'_>) -> String {
    pubsub.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    pubsub.get_message().expect("a message").get_payload().expect("text")
}

#[test]
fn a_message_with_no_subscriber_is_not_sent_and_one_subscribed_a_moment_before_hears_it() {
    let server = Server::start();
    let mut con = server.client();
    acquire_and_release(&mut con, "job:1");
    assert_eq!(
        (counter(&mut con, "messages_published"), counter(&mut con, "messages_unheard")),
        (0, 2)
    );

    let mut listener = server.client();
    let mut pubsub = listener.as_pubsub();
    pubsub.subscribe("dlock:{job:2}").expect("SUBSCRIBE");
    // No account is read in between: the SUBSCRIBE itself was seen going by.
    acquire_and_release(&mut con, "job:2");
    assert!(next(&mut pubsub).starts_with("acquired "));
    assert!(next(&mut pubsub).starts_with("released "));
    acquire_and_release(&mut con, "job:1");
    assert_eq!(
        (counter(&mut con, "messages_published"), counter(&mut con, "messages_unheard")),
        (2, 4)
    );

    // The subscriber leaves: after the next account (at most a second old) nothing is sent.
    pubsub.unsubscribe("dlock:{job:2}").expect("UNSUBSCRIBE");
    drop(pubsub);
    sleep(Duration::from_millis(1_100));
    acquire_and_release(&mut con, "job:2");
    assert_eq!(
        (counter(&mut con, "messages_published"), counter(&mut con, "messages_unheard")),
        (2, 6)
    );

    // CONFIG RESETSTAT zeroes both.
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query(&mut con).unwrap();
    assert_eq!(
        (counter(&mut con, "messages_published"), counter(&mut con, "messages_unheard")),
        (0, 0)
    );
}

#[test]
fn a_pattern_subscriber_hears_every_resource() {
    let server = Server::start();
    let mut con = server.client();
    acquire_and_release(&mut con, "job:0"); // an account is taken: nobody listens
    let mut listener = server.client();
    let mut pubsub = listener.as_pubsub();
    pubsub.psubscribe("dlock:*").expect("PSUBSCRIBE");
    for resource in ["job:1", "other:{x}"] {
        acquire_and_release(&mut con, resource);
        assert!(next(&mut pubsub).starts_with("acquired "), "{resource}");
        assert!(next(&mut pubsub).starts_with("released "), "{resource}");
    }
    // Still so after the next account.
    sleep(Duration::from_millis(1_100));
    acquire_and_release(&mut con, "job:3");
    assert!(next(&mut pubsub).starts_with("acquired "));
}

#[test]
fn a_subscriber_from_before_the_module_was_loaded_hears_the_first_message() {
    let server = Launch::new().without_module().start();
    let mut listener = server.client();
    let mut pubsub = listener.as_pubsub();
    pubsub.subscribe("dlock:{job:1}").expect("SUBSCRIBE");
    let mut con = server.client();
    let module = module_path();
    let _: () = redis::cmd("MODULE")
        .arg("LOAD")
        .arg(module.to_str().expect("path"))
        .query(&mut con)
        .expect("MODULE LOAD");
    acquire_and_release(&mut con, "job:1");
    assert!(next(&mut pubsub).starts_with("acquired "));
    assert!(next(&mut pubsub).starts_with("released "));
    assert_eq!(counter(&mut con, "messages_published"), 2);
}

/// `PUBSUB CHANNELS` walks every channel of the server: with more than a thousand channels
/// (anyone's) the account is not listed, whose stall grows with them, and every message is
/// published until the server holds fewer again.
#[test]
fn with_more_than_a_thousand_channels_the_account_is_not_listed_and_every_message_is_sent() {
    let server = Server::start();
    let mut con = server.client();
    let calls = |con: &mut redis::Connection| -> u64 {
        info_line(con, "commandstats", "cmdstat_pubsub|channels")
            .and_then(|line| line.split(',').next()?.strip_prefix("calls=")?.parse().ok())
            .unwrap_or(0)
    };
    let mut crowd = server.client();
    let names: Vec<String> = (0..1_001).map(|n| format!("news:{n}")).collect();
    let _: () = redis::cmd("SUBSCRIBE").arg(&names).query(&mut crowd).expect("SUBSCRIBE");
    let subscribed =
        || info_line(&mut server.client(), "stats", "pubsub_channels").as_deref() == Some("1001");
    assert!(eventually(Duration::from_secs(5), subscribed));
    acquire_and_release(&mut con, "job:1");
    assert_eq!(
        (counter(&mut con, "messages_published"), counter(&mut con, "messages_unheard")),
        (2, 0),
        "published, the server's channels not listed"
    );
    assert_eq!(calls(&mut con), 0, "no PUBSUB CHANNELS");

    // The crowd leaves: the next account (at most a second later) lists the few left.
    drop(crowd);
    assert!(eventually(Duration::from_secs(5), || {
        info_line(&mut server.client(), "stats", "pubsub_channels").as_deref() == Some("0")
    }));
    sleep(Duration::from_millis(1_100));
    acquire_and_release(&mut con, "job:1");
    assert_eq!(
        (counter(&mut con, "messages_published"), counter(&mut con, "messages_unheard")),
        (2, 2)
    );
    assert_eq!(calls(&mut con), 1, "listed once");
}
