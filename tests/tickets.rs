//! `DLOCK.ACQUIRE … QUEUE ticket-ms`: a place in the resource's one FIFO line without holding a
//! connection; refreshed by sending the same ACQUIRE again; granted with a claim window; lapsed
//! when not refreshed. Ownership changes are published on the resource's channel.

use std::time::Duration;

use dlock_testkit::*;

fn queue(con: &mut redis::Connection, resource: &str, token: &str, ticket_ms: u64) -> Option<i64> {
    redis::cmd("DLOCK.ACQUIRE")
        .arg(resource)
        .arg(token)
        .arg(60_000)
        .arg("QUEUE")
        .arg(ticket_ms)
        .query(con)
        .expect("ACQUIRE QUEUE")
}

#[test]
fn tickets_are_served_in_order_without_barging_and_the_next_acquire_learns_the_fence() {
    let server = Server::start();
    let mut con = server.client();
    let first = acquire(&mut con, "r", "A", 60_000).expect("granted");
    assert_eq!(queue(&mut con, "r", "B", 10_000), None, "B takes a ticket");
    assert_eq!(queue(&mut con, "r", "C", 10_000), None, "C takes a ticket");
    assert_eq!(info_field(&mut con, "r", "tickets").as_deref(), Some("2"));
    assert_eq!(acquire(&mut con, "r", "D", 60_000), None, "nobody barges past the line");
    assert_eq!(queue(&mut con, "r", "C", 10_000), None, "C refreshes and keeps its place");
    assert_eq!(release(&mut con, "r", "A"), 1);
    assert_eq!(info_field(&mut con, "r", "owner").as_deref(), Some("B"), "B's turn");
    let ttl: i64 = info_field(&mut con, "r", "ttl-ms").and_then(|t| t.parse().ok()).unwrap_or(0);
    assert!(ttl <= 10_000, "granted with a claim window of the ticket's life: {ttl}");
    let fence = queue(&mut con, "r", "B", 10_000).expect("B's next ACQUIRE learns its fence");
    assert!(fence > first);
    let ttl: i64 = info_field(&mut con, "r", "ttl-ms").and_then(|t| t.parse().ok()).unwrap_or(0);
    assert!(ttl > 50_000, "claimed: the full ttl now runs ({ttl} ms)");
    assert_eq!(info_field(&mut con, "r", "tickets").as_deref(), Some("1"), "C still stands");
}

#[test]
fn a_ticket_that_is_not_refreshed_leaves_and_a_grant_nobody_claims_passes_on() {
    let server = Server::start();
    let mut con = server.client();
    acquire(&mut con, "r", "A", 60_000).expect("granted");
    assert_eq!(queue(&mut con, "r", "gone", 300), None);
    assert!(eventually(Duration::from_secs(5), || {
        info_line(&mut con, "dlock", "dlock_tickets_lapsed").as_deref() == Some("1")
    }));
    assert_eq!(info_field(&mut con, "r", "tickets").as_deref(), Some("0"));
    // B's ticket comes up, but B never comes back: its grant lapses after its claim window.
    assert_eq!(queue(&mut con, "r", "B", 60_000), None);
    let claim_ms: &[&str] = &["CLAIM", "300"];
    let _: Option<i64> = redis::cmd("DLOCK.ACQUIRE")
        .arg("r")
        .arg("C")
        .arg(60_000)
        .arg("QUEUE")
        .arg(60_000)
        .arg(claim_ms)
        .query(&mut con)
        .expect("C queues with a short claim window");
    assert_eq!(release(&mut con, "r", "A"), 1);
    assert_eq!(info_field(&mut con, "r", "owner").as_deref(), Some("B"));
    assert_eq!(release(&mut con, "r", "B"), 1, "B is done at once");
    assert_eq!(info_field(&mut con, "r", "owner").as_deref(), Some("C"));
    assert!(
        eventually(Duration::from_secs(5), || acquire(&mut con, "r", "D", 1_000).is_some()),
        "C never claimed: the resource is free after 300 ms"
    );
}

#[test]
fn a_thousand_tickets_on_one_resource_are_granted_in_order() {
    let server = Server::start();
    let mut con = server.client();
    acquire(&mut con, "r", "holder", 60_000).expect("granted");
    let tokens: Vec<String> = (0..1_000).map(|i| format!("t{i:04}")).collect();
    for token in &tokens {
        assert_eq!(queue(&mut con, "r", token, 60_000), None);
    }
    assert_eq!(info_field(&mut con, "r", "tickets").as_deref(), Some("1000"));
    let mut holder = "holder".to_owned();
    let mut last_fence = 0;
    for token in &tokens {
        assert_eq!(release(&mut con, "r", &holder), 1);
        let fence = queue(&mut con, "r", token, 60_000).expect("its turn");
        assert!(fence > last_fence, "fences increase along the line");
        last_fence = fence;
        holder = token.clone();
    }
    assert_eq!(info_field(&mut con, "r", "tickets").as_deref(), Some("0"));
}

#[test]
fn ownership_changes_are_published_on_the_resources_channel() {
    let server = Server::start();
    let mut con = server.client();
    let mut subscriber = server.client();
    subscriber.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    let mut pubsub = subscriber.as_pubsub();
    pubsub.subscribe("dlock:{r}").expect("SUBSCRIBE");
    let a = acquire(&mut con, "r", "A", 60_000).expect("granted");
    assert_eq!(queue(&mut con, "r", "B", 60_000), None);
    assert_eq!(release(&mut con, "r", "A"), 1);
    let mut messages = Vec::new();
    for _ in 0..3 {
        let message = pubsub.get_message().expect("a message");
        messages.push(message.get_payload::<String>().expect("text"));
    }
    let handed: i64 = messages[2]
        .strip_prefix("handoff ")
        .and_then(|rest| rest.strip_suffix(&format!(" {}", tag("B"))))
        .and_then(|f| f.parse().ok())
        .expect("fence and B's tag");
    assert_eq!(messages[..2], [format!("acquired {a}"), format!("released {a}")]);
    assert!(handed > a);
}

/// `app:x` and `{app:x}` are two resources: a subscriber of one hears nothing of the other (both
/// names used to publish on `dlock:{app:x}`).
#[test]
fn two_resources_never_share_a_channel() {
    let server = Server::start();
    let mut con = server.client();
    let mut subscriber = server.client();
    subscriber.set_read_timeout(Some(Duration::from_millis(500))).expect("timeout");
    let mut pubsub = subscriber.as_pubsub();
    pubsub.subscribe("dlock:{app:x}").expect("SUBSCRIBE");
    let tagged = acquire(&mut con, "{app:x}", "A", 60_000).expect("granted");
    assert!(pubsub.get_message().is_err(), "nothing of {{app:x}} on app:x's channel");
    let plain = acquire(&mut con, "app:x", "A", 60_000).expect("granted");
    let heard = pubsub.get_message().expect("app:x's own grant");
    assert_eq!(heard.get_payload::<String>().expect("text"), format!("acquired {plain}"));
    drop(pubsub);
    let mut subscriber = server.client();
    subscriber.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    let mut pubsub = subscriber.as_pubsub();
    pubsub.subscribe("dlock:key:{app:x}").expect("SUBSCRIBE");
    assert_eq!(release(&mut con, "{app:x}", "A"), 1);
    let heard = pubsub.get_message().expect("{app:x}'s release");
    assert_eq!(heard.get_payload::<String>().expect("text"), format!("released {tagged}"));
}

/// The tag a `handoff` message names its new holder by (the protocol crate's rule, which
/// `protocol/vectors/tags.json` pins for every client).
fn tag(token: &str) -> String {
    dlock_proto::channel::tag_hex(token.as_bytes())
}

#[test]
fn a_shared_hand_over_to_several_tickets_names_each_grantee_by_its_tag() {
    let server = Server::start();
    let mut con = server.client();
    let mut subscriber = server.client();
    subscriber.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    let mut pubsub = subscriber.as_pubsub();
    pubsub.subscribe("dlock:{r}").expect("SUBSCRIBE");
    let writer = acquire(&mut con, "r", "writer", 60_000).expect("granted");
    let readers = ["reader-1", "reader-2", "reader-3"];
    for reader in readers {
        let queued: Option<i64> = redis::cmd("DLOCK.ACQUIRE")
            .arg("r")
            .arg(reader)
            .arg(60_000)
            .arg("SHARED")
            .arg("QUEUE")
            .arg(60_000)
            .query(&mut con)
            .expect("shared ticket");
        assert_eq!(queued, None);
    }
    assert_eq!(release(&mut con, "r", "writer"), 1);
    let mut messages = Vec::new();
    for _ in 0..5 {
        let message = pubsub.get_message().expect("a message");
        messages.push(message.get_payload::<String>().expect("text"));
    }
    assert_eq!(messages[..2], [format!("acquired {writer}"), format!("released {writer}")]);
    let mut tags: Vec<String> = messages[2..]
        .iter()
        .map(|message| {
            let words: Vec<&str> = message.split(' ').collect();
            assert_eq!(words.len(), 3, "{message}");
            assert_eq!(words[0], "handoff", "{message}");
            assert!(words[1].parse::<i64>().expect("fence") > writer, "{message}");
            words[2].to_owned()
        })
        .collect();
    let mut expected: Vec<String> = readers.iter().map(|reader| tag(reader)).collect();
    tags.sort();
    expected.sort();
    assert_eq!(tags, expected, "one hand-over per reader, each with its own tag");
    for reader in readers {
        let fence: Option<i64> = redis::cmd("DLOCK.ACQUIRE")
            .arg("r")
            .arg(reader)
            .arg(60_000)
            .arg("SHARED")
            .arg("QUEUE")
            .arg(60_000)
            .query(&mut con)
            .expect("claim");
        assert!(fence.is_some(), "{reader} was granted");
    }
}

#[test]
fn bad_queue_options_are_refused_and_change_nothing() {
    let server = Server::start();
    let mut con = server.client();
    acquire(&mut con, "r", "A", 60_000).expect("granted");
    for (args, error) in [
        (&["QUEUE"][..], "ERR QUEUE needs a ticket-ms argument"),
        (&["QUEUE", "0"], "ERR ticket-ms must be an integer between 1 and 86400000"),
        (&["QUEUE", "5", "QUEUE", "5"], "ERR syntax error: QUEUE given more than once"),
        (&["QUEUE", "5", "WAIT", "5"], "ERR syntax error: WAIT and QUEUE cannot be combined"),
        (&["NOTIFY", "1"], "ERR syntax error: NOTIFY needs QUEUE"),
        (&["QUEUE", "5", "NOTIFY"], "ERR NOTIFY needs a request argument"),
        (
            &["QUEUE", "5", "NOTIFY", "-1"],
            "ERR NOTIFY must be an integer between 0 and 9223372036854775807",
        ),
        (
            &["QUEUE", "5", "NOTIFY", "1", "NOTIFY", "2"],
            "ERR syntax error: NOTIFY given more than once",
        ),
    ] {
        let reply =
            redis::cmd("DLOCK.ACQUIRE").arg("r").arg("B").arg(60_000).arg(args).query(&mut con);
        assert_eq!(error_text(reply), error, "{args:?}");
    }
    assert_eq!(info_field(&mut con, "r", "tickets").as_deref(), Some("0"));
}

fn tickets_gauge(con: &mut redis::Connection) -> Option<String> {
    info_line(con, "dlock", "dlock_tickets")
}

#[test]
fn info_counts_the_tickets_standing_in_every_line() {
    let server = Server::start();
    let mut con = server.client();
    acquire(&mut con, "a", "holder", 60_000).expect("held");
    acquire(&mut con, "b", "holder", 60_000).expect("held");
    assert_eq!(tickets_gauge(&mut con).as_deref(), Some("0"));
    queue(&mut con, "a", "t1", 60_000);
    queue(&mut con, "a", "t2", 300);
    queue(&mut con, "b", "t3", 60_000);
    queue(&mut con, "a", "t1", 60_000); // a refresh is the same ticket
    assert_eq!(tickets_gauge(&mut con).as_deref(), Some("3"));
    // t2 lapses; t1's turn comes when the holder releases; DEL takes t3 with its key.
    assert!(eventually(Duration::from_secs(5), || {
        tickets_gauge(&mut con).as_deref() == Some("2")
    }));
    assert_eq!(release(&mut con, "a", "holder"), 1);
    assert_eq!(tickets_gauge(&mut con).as_deref(), Some("1"));
    let _: i64 = redis::cmd("DEL").arg("b").query(&mut con).expect("DEL");
    assert_eq!(tickets_gauge(&mut con).as_deref(), Some("0"));
}

/// `used_memory` now, in bytes.
fn used_memory(con: &mut redis::Connection) -> f64 {
    info_line(con, "memory", "used_memory").and_then(|v| v.parse().ok()).expect("used_memory")
}

fn memory_usage(con: &mut redis::Connection, key: &str) -> f64 {
    redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(key)
        .arg("SAMPLES")
        .arg(0)
        .query::<i64>(con)
        .expect("USAGE") as f64
}

#[test]
fn memory_usage_of_a_line_of_tickets_and_of_shared_leases_is_close_to_what_they_take() {
    let server = Server::start();
    let mut con = server.client();
    acquire(&mut con, "line", "holder", 600_000).expect("held");
    let (before, key_before) = (used_memory(&mut con), memory_usage(&mut con, "line"));
    let mut pipe = redis::pipe();
    for i in 0..3_000 {
        pipe.cmd("DLOCK.ACQUIRE")
            .arg("line")
            .arg(format!("ticket-{i:06}"))
            .arg(60_000)
            .arg("QUEUE")
            .arg(600_000);
    }
    let _: redis::Value = pipe.query(&mut con).expect("tickets");
    let grown = used_memory(&mut con) - before;
    let counted = memory_usage(&mut con, "line") - key_before;
    let ratio = counted / grown;
    assert!((0.7..=1.3).contains(&ratio), "MEMORY USAGE grew {counted}, used_memory {grown}");

    let before = used_memory(&mut con);
    let mut pipe = redis::pipe();
    for i in 0..3_000 {
        pipe.cmd("DLOCK.ACQUIRE")
            .arg("readers")
            .arg(format!("reader-{i:06}"))
            .arg(600_000)
            .arg("SHARED");
    }
    let _: redis::Value = pipe.query(&mut con).expect("readers");
    let grown = used_memory(&mut con) - before;
    let counted = memory_usage(&mut con, "readers");
    let ratio = counted / grown;
    assert!((0.7..=1.3).contains(&ratio), "MEMORY USAGE {counted}, used_memory grew {grown}");
}

#[test]
fn a_lapsed_ticket_a_lapsed_claim_and_a_claimed_grant_are_each_logged_by_name() {
    let server = Server::start_with(&["--loglevel", "verbose"]);
    let mut con = server.client();
    acquire(&mut con, "r", "A", 60_000).expect("granted");
    assert_eq!(queue(&mut con, "r", "quitter", 200), None);
    assert!(eventually(Duration::from_secs(5), || {
        server.log().contains("ticket lapsed (not refreshed in time) resource=r token=quitter")
    }));
    // B's ticket is granted on A's release with a 300 ms claim window B never uses.
    let claim: &[&str] = &["QUEUE", "60000", "CLAIM", "300"];
    let _: Option<i64> = redis::cmd("DLOCK.ACQUIRE")
        .arg("r")
        .arg("B")
        .arg(60_000)
        .arg(claim)
        .query(&mut con)
        .expect("B");
    assert_eq!(queue(&mut con, "r", "C", 60_000), None);
    assert_eq!(release(&mut con, "r", "A"), 1);
    assert!(eventually(Duration::from_secs(5), || {
        server.log().contains("grant lapsed unclaimed (its claim window ended) resource=r owner=B")
    }));
    // C's grant passes on from B's; C claims it with its next ACQUIRE.
    assert_eq!(info_field(&mut con, "r", "owner").as_deref(), Some("C"));
    let fence = queue(&mut con, "r", "C", 60_000).expect("C claims");
    assert!(eventually(Duration::from_secs(5), || {
        server.log().contains(&format!("lease claimed resource=r owner=C fence={fence}"))
    }));
    let log = server.log();
    assert!(!log.contains("lease expired under its holder resource=r owner=B"), "{log}");
}

#[test]
fn a_release_without_fence_withdraws_the_tokens_ticket_and_one_with_a_fence_never_does() {
    let server = Server::start();
    let mut con = server.client();
    let first = acquire(&mut con, "r", "A", 60_000).expect("granted");
    assert_eq!(queue(&mut con, "r", "B", 60_000), None);
    assert_eq!(queue(&mut con, "r", "C", 60_000), None);
    // A late RELEASE … FENCE of an earlier grant of C's token leaves C's ticket alone.
    let fenced: i64 = redis::cmd("DLOCK.RELEASE")
        .arg("r")
        .arg("C")
        .arg("FENCE")
        .arg(first)
        .query(&mut con)
        .expect("RELEASE FENCE");
    assert_eq!(fenced, 0);
    assert_eq!(info_field(&mut con, "r", "tickets").as_deref(), Some("2"));
    // B gives up: its RELEASE answers 0 (no lease was released) and takes its ticket out.
    assert_eq!(release(&mut con, "r", "B"), 0);
    assert_eq!(info_field(&mut con, "r", "tickets").as_deref(), Some("1"));
    assert_eq!(info_line(&mut con, "dlock", "dlock_tickets_withdrawn").as_deref(), Some("1"));
    assert_eq!(info_line(&mut con, "dlock", "dlock_release_not_owner").as_deref(), Some("1"));
    // A's release passes the lease to C, the next in line, not to B.
    assert_eq!(release(&mut con, "r", "A"), 1);
    assert_eq!(info_field(&mut con, "r", "owner").as_deref(), Some("C"));
    assert_eq!(info_field(&mut con, "r", "tickets").as_deref(), Some("0"));
}

/// `DLOCK.ACQUIRE r token 60000 QUEUE ticket-ms NOTIFY request [more…]`.
fn queue_notify(
    con: &mut redis::Connection,
    token: &str,
    request: u64,
    more: &[&str],
) -> Option<i64> {
    redis::cmd("DLOCK.ACQUIRE")
        .arg("r")
        .arg(token)
        .arg(60_000)
        .arg("QUEUE")
        .arg(60_000)
        .arg("NOTIFY")
        .arg(request)
        .arg(more)
        .query(con)
        .expect("ACQUIRE QUEUE NOTIFY")
}

/// A connection to `server` reading with a timeout of `timeout`, for a subscriber.
fn subscriber(server: &Server, timeout: Duration) -> redis::Connection {
    let subscriber = server.client();
    subscriber.set_read_timeout(Some(timeout)).expect("timeout");
    subscriber
}

/// The next message's channel and text.
fn next_message(pubsub: &mut redis::PubSub<'_>) -> redis::RedisResult<(String, String)> {
    let message = pubsub.get_message()?;
    Ok((message.get_channel_name().to_owned(), message.get_payload()?))
}

/// A ticket that asks with `NOTIFY` hears of its own grant on its own channel, which nobody
/// else's grant reaches: `granted <fence> <request> <window-ms>`, naming its last refresh before
/// the hand-over and the claim window; the fence is the one its next ACQUIRE answers.
#[test]
fn a_notified_ticket_hears_its_own_grant_on_its_own_channel() {
    let server = Server::start();
    let mut con = server.client();
    let own = |token: &str| dlock_proto::channel::ticket_name_of("r", token);
    let (mut b_con, mut c_con) = (subscriber(&server, SEC), subscriber(&server, SEC / 5));
    let (mut b, mut c) = (b_con.as_pubsub(), c_con.as_pubsub());
    b.subscribe(own("B")).expect("SUBSCRIBE");
    c.subscribe(own("C")).expect("SUBSCRIBE");
    let a = acquire(&mut con, "r", "A", 60_000).expect("granted");
    assert_eq!(queue_notify(&mut con, "B", 1, &["CLAIM", "4000"]), None);
    assert_eq!(queue_notify(&mut con, "C", 1, &[]), None);
    assert_eq!(queue_notify(&mut con, "B", 2, &["CLAIM", "4000"]), None, "refreshed");
    assert_eq!(release(&mut con, "r", "A"), 1);
    let (channel, message) = next_message(&mut b).expect("B's grant");
    assert_eq!(channel, "dlock:{r}:".to_owned() + &format!("{:016x}", wide_tag("B")));
    let granted = dlock_proto::channel::granted(&message).expect(&message);
    assert!(granted.fence > a as u64, "{message}");
    assert_eq!((granted.request, granted.window_ms), (2, 4_000), "{message}");
    assert!(next_message(&mut c).is_err(), "C's channel hears nothing of B's grant");
    c.set_read_timeout(Some(SEC)).expect("timeout");
    let claimed = queue_notify(&mut con, "B", 3, &["CLAIM", "4000"]);
    assert_eq!(claimed, Some(granted.fence as i64), "the next ACQUIRE answers that fence");
    // C's turn: its claim window defaults to the ticket's length.
    assert_eq!(release(&mut con, "r", "B"), 1);
    let (_, message) = next_message(&mut c).expect("C's grant");
    let granted = dlock_proto::channel::granted(&message).expect(&message);
    assert_eq!((granted.request, granted.window_ms), (1, 60_000), "{message}");
}

const SEC: Duration = Duration::from_secs(1);

fn wide_tag(token: &str) -> u64 {
    dlock_proto::channel::wide_tag(token.as_bytes())
}

/// A refresh without `NOTIFY` takes the ticket off its channel (a client that fell back to the
/// resource's channel); a window cut by `dlock.max-hold-ms` is the one the message names.
#[test]
fn a_refresh_without_notify_ends_the_message_and_the_window_is_the_leases() {
    let server = Server::start();
    let mut con = server.client();
    let own = |token: &str| dlock_proto::channel::ticket_name_of("r", token);
    let (mut b_con, mut c_con) = (subscriber(&server, SEC / 5), subscriber(&server, SEC));
    let (mut b, mut c) = (b_con.as_pubsub(), c_con.as_pubsub());
    b.subscribe(own("B")).expect("SUBSCRIBE");
    c.subscribe(own("C")).expect("SUBSCRIBE");
    acquire(&mut con, "r", "A", 60_000).expect("granted");
    assert_eq!(queue_notify(&mut con, "B", 1, &[]), None);
    assert_eq!(queue(&mut con, "r", "B", 60_000), None, "refreshed without NOTIFY");
    assert_eq!(queue_notify(&mut con, "C", 7, &[]), None);
    assert_eq!(release(&mut con, "r", "A"), 1);
    assert!(next_message(&mut b).is_err(), "no message without NOTIFY");
    assert!(queue(&mut con, "r", "B", 60_000).is_some(), "B was granted all the same");
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("dlock.max-hold-ms")
        .arg(1_500)
        .query(&mut con)
        .expect("CONFIG SET");
    assert_eq!(release(&mut con, "r", "B"), 1);
    let (_, message) = next_message(&mut c).expect("C's grant");
    let granted = dlock_proto::channel::granted(&message).expect(&message);
    assert_eq!((granted.request, granted.window_ms), (7, 1_500), "{message}");
}
