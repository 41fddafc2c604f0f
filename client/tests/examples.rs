//! Runs the shared-lease and election examples against a real redis-server with the module and
//! checks what they report.

#[path = "../examples/election.rs"]
#[allow(dead_code)] // the example's `main`
mod election;
#[path = "../examples/quickstart.rs"]
#[allow(dead_code)]
mod quickstart;
#[path = "../examples/rwlock.rs"]
#[allow(dead_code)]
mod rwlock;
#[path = "../examples/semaphore.rs"]
#[allow(dead_code)]
mod semaphore;

use dlock_testkit::Server;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rwlock_example_lets_readers_in_together_and_the_writer_alone_in_turn() {
    let server = Server::start();
    let log = rwlock::run_demo(&server.url()).await.expect("the example ran");
    let who: Vec<&str> = log.iter().map(|(who, ..)| who.as_str()).collect();
    assert_eq!(who.len(), 5, "{log:?}");
    assert!(who[..3].iter().all(|who| who.starts_with("reader-")), "readers first: {log:?}");
    assert_eq!(&who[3..], ["writer", "late-reader"], "then the writer, then the late reader");
    let writer_fence = log[3].1;
    assert!(log[..3].iter().all(|(_, fence, _)| *fence < writer_fence), "{log:?}");
    assert_eq!(log[4].2, format!("reads \"revision {writer_fence}\""), "{log:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_semaphore_example_never_has_more_than_three_permits_out() {
    let server = Server::start();
    let report = semaphore::run_demo(&server.url(), 3).await.expect("the example ran");
    assert_eq!(report.jobs, 24);
    assert_eq!(report.most_at_once, 3, "{report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_election_example_has_one_leader_at_a_time_each_with_a_larger_fence() {
    let server = Server::start();
    let seen = election::run_demo(&server.url()).await.expect("the example ran");
    assert_eq!(seen.len(), 5, "{seen:?}");
    assert_eq!((&seen[0], &seen[4]), (&None, &None), "no leader before and after: {seen:?}");
    let leaders: Vec<&(String, u64)> = seen[1..4].iter().flatten().collect();
    assert_eq!(leaders.len(), 3, "three terms: {seen:?}");
    assert_eq!(leaders[0].0, "node-1:7000", "{seen:?}");
    let mut later: Vec<&str> = leaders[1..].iter().map(|(address, _)| address.as_str()).collect();
    later.sort_unstable();
    assert_eq!(later, ["node-2:7000", "node-3:7000"], "{seen:?}");
    assert!(leaders.windows(2).all(|pair| pair[0].1 < pair[1].1), "epochs increase: {seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quick_start_runs_and_the_readmes_print_it_as_it_is() {
    let server = Server::start();
    let written = quickstart::pay_invoice(&server.url()).await.expect("the quick start ran");
    assert!(written.starts_with("invoice 123 written under fence "), "{written}");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let source = std::fs::read_to_string(root.join("examples/quickstart.rs")).expect("example");
    // client/README.md prints the whole program, from its first `use` (a project's src/main.rs).
    let program = &source[source.find("use ").expect("a use")..];
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README");
    let block = format!("```rust\n{program}```");
    assert!(readme.contains(&block), "client/README.md prints examples/quickstart.rs as it is");
    // The top-level README prints the body of `pay_invoice` up to `Ok(written)`, inside a list
    // item (two spaces more, one level of the function's indentation less).
    let body = program
        .split("-> Result<String, Box<dyn std::error::Error>> {\n")
        .nth(1)
        .and_then(|rest| rest.split("    Ok(written)\n").next())
        .expect("the body of pay_invoice");
    let indented: Vec<String> = body
        .lines()
        .map(|line| if line.is_empty() { String::new() } else { format!("  {}", &line[4..]) })
        .collect();
    let top = std::fs::read_to_string(root.join("../README.md")).expect("README");
    let block = format!("  ```rust\n{}\n  ```", indented.join("\n"));
    assert!(top.contains(&block), "README.md prints examples/quickstart.rs as it is");
}
