//! Sets of resources (`DLOCK.ACQUIREALL … QUEUE`) among single requests, the core's rules
//! ([`super::sets::acquire_all`]) driven by random sequences: sets and single tokens arrive, take
//! tickets, are granted, release, wait; operators delete locks; time passes. After every set
//! call the set is held whole, or none of it was newly granted (a client whose set lost a member
//! releases the rest first, as the contract says). Then arrivals stop and every
//! waiting set and single keeps calling (as clients refresh their tickets) and releases once
//! granted: each of them must be granted within a bounded number of rounds, so nobody waits for
//! someone who waits for them, and a line headed by a set is never passed.

use proptest::prelude::*;

use super::fence::FenceCounter;
use super::lock::Rules;
use super::mode::Mode;
use super::sets::{self, Members, SetOutcome, SetRequest};
use super::{Acquired, DlockError, Host, Lock, Now, Step};

const LOCKS: usize = 4;
const TICKET_MS: u64 = 300;

struct Everyone;

impl Host for Everyone {
    fn waiter_alive(&self, _: u64) -> bool {
        true
    }
}

struct Store {
    locks: Vec<Lock>,
    fences: FenceCounter,
    next_id: u64,
    now: Now,
}

impl Store {
    fn step<T>(
        &mut self,
        index: usize,
        op: impl FnOnce(&mut Step<'_, Everyone>, &mut Lock) -> T,
    ) -> T {
        let mut step = Step::new(self.now, Rules::default(), &mut self.fences, &Everyone);
        op(&mut step, &mut self.locks[index])
    }
}

/// One set's members, in its order, in the store.
struct Picked<'a> {
    store: &'a mut Store,
    members: &'a [usize],
}

impl Members for Picked<'_> {
    type Host = Everyone;
    type Error = DlockError;

    fn count(&self) -> usize {
        self.members.len()
    }

    fn decide<T>(
        &mut self,
        index: usize,
        op: impl FnOnce(&mut Step<'_, Everyone>, &mut Lock) -> T,
    ) -> Result<T, DlockError> {
        Ok(self.store.step(self.members[index], op))
    }

    fn new_ticket_id(&mut self) -> u64 {
        self.store.next_id += 1;
        self.store.next_id
    }
}

#[derive(Clone, Debug)]
enum Op {
    /// Set `set` calls `ACQUIREALL … QUEUE`.
    SetCall {
        set: usize,
    },
    /// Set `set` releases every member it holds.
    SetRelease {
        set: usize,
    },
    /// Single `single` asks for lock `lock` with a ticket (or claims or refreshes it).
    Single {
        single: usize,
        lock: usize,
    },
    /// Single `single` releases lock `lock` (or withdraws its ticket there).
    SingleRelease {
        single: usize,
        lock: usize,
    },
    /// An operator deletes lock `lock`: its leases and its line are gone.
    Delete {
        lock: usize,
    },
    Advance {
        ms: u64,
    },
}

fn op(sets: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..sets).prop_map(|set| Op::SetCall { set }),
        2 => (0..sets).prop_map(|set| Op::SetRelease { set }),
        4 => (0..3usize, 0..LOCKS).prop_map(|(single, lock)| Op::Single { single, lock }),
        2 => (0..3usize, 0..LOCKS).prop_map(|(single, lock)| Op::SingleRelease { single, lock }),
        1 => (0..LOCKS).prop_map(|lock| Op::Delete { lock }),
        3 => (0u64..120).prop_map(|ms| Op::Advance { ms }),
    ]
}

/// Each set's members: two or three distinct locks, in a random order.
fn members() -> impl Strategy<Value = Vec<Vec<usize>>> {
    let one = Just((0..LOCKS).collect::<Vec<_>>())
        .prop_shuffle()
        .prop_flat_map(|order| (2usize..=3).prop_map(move |n| order[..n].to_vec()));
    proptest::collection::vec(one, 2..=3)
}

fn set_token(set: usize) -> Vec<u8> {
    format!("S{set}").into_bytes()
}

fn single_token(single: usize) -> Vec<u8> {
    format!("s{single}").into_bytes()
}

fn call(store: &mut Store, members: &[usize], token: &[u8]) -> SetOutcome {
    let request = SetRequest {
        token,
        ttl_ms: 10_000,
        mode: Mode::Exclusive,
        meta: None,
        queue_ms: Some(TICKET_MS),
    };
    sets::acquire_all(&mut Picked { store, members }, &request).expect("no mint refused")
}

fn held(store: &Store, lock: usize, token: &[u8]) -> Option<u64> {
    store.locks[lock].holder(token, store.now).map(|lease| lease.fence)
}

/// A single's ACQUIRE … QUEUE: granted (a claim of a hand-over, or a free lock), or in line.
fn single(store: &mut Store, lock: usize, token: &[u8]) -> bool {
    store.next_id += 1;
    let id = store.next_id;
    store.step(lock, |step, lock| {
        let outcome = step.acquire_as(lock, token, 10_000, Mode::Exclusive, None).expect("mint");
        if matches!(outcome, Acquired::Busy | Acquired::GrantsHeld) {
            let now = step.now().mono;
            let claim = Some(TICKET_MS);
            let ticket = sets::ticket(
                lock,
                token,
                10_000,
                Mode::Exclusive,
                None,
                claim,
                TICKET_MS,
                false,
                now,
                id,
            );
            step.enqueue_ticket(lock, ticket);
            false
        } else {
            true
        }
    })
}

fn release_all(store: &mut Store, members: &[usize], token: &[u8]) {
    for &lock in members {
        store.step(lock, |step, lock| step.release(lock, token));
    }
}

/// Whether `token` stands in the line of `lock`.
fn in_line(store: &Store, lock: usize, token: &[u8]) -> bool {
    store.locks[lock].queued(token).is_some()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn sets_are_granted_whole_and_nobody_waits_forever(
        members in members(),
        ops in proptest::collection::vec(op(3), 1..120),
    ) {
        let sets = members.len();
        let mut store = Store {
            locks: vec![Lock::default(); LOCKS],
            fences: FenceCounter::default(),
            next_id: 0,
            now: Now { mono: 1_000_000, wall: 1_700_000_000_000_000 },
        };
        // Who asked and was not granted since: they keep calling once arrivals stop.
        let mut waiting_sets = vec![false; sets];
        let mut waiting_singles: Vec<(usize, usize)> = Vec::new();
        for op in ops {
            match op {
                Op::SetCall { set } if set < sets => {
                    let token = set_token(set);
                    // A set that lost a member (an operator's DEL) is lost to its client, which
                    // releases the rest (its renewal is refused) before it asks again.
                    let holding = members[set].iter().filter(|&&lock| held(&store, lock, &token).is_some()).count();
                    if holding != 0 && holding != members[set].len() {
                        release_all(&mut store, &members[set], &token);
                    }
                    let before: Vec<Option<u64>> =
                        members[set].iter().map(|&lock| held(&store, lock, &token)).collect();
                    let outcome = call(&mut store, &members[set], &token);
                    let after: Vec<Option<u64>> =
                        members[set].iter().map(|&lock| held(&store, lock, &token)).collect();
                    match outcome {
                        SetOutcome::Granted(fences) => {
                            let fences: Vec<Option<u64>> = fences.into_iter().map(Some).collect();
                            prop_assert_eq!(&after, &fences, "granted whole, each member its fence");
                            waiting_sets[set] = false;
                        }
                        SetOutcome::Queued => {
                            prop_assert_eq!(&after, &before, "a set in line took nothing");
                            waiting_sets[set] = true;
                        }
                        other => prop_assert!(false, "{other:?}"),
                    }
                }
                Op::SetRelease { set } if set < sets => {
                    release_all(&mut store, &members[set], &set_token(set));
                    waiting_sets[set] = false;
                }
                Op::SetCall { .. } | Op::SetRelease { .. } => {}
                Op::Single { single: who, lock } => {
                    let token = single_token(who);
                    let granted = single(&mut store, lock, &token);
                    waiting_singles.retain(|&entry| entry != (who, lock));
                    if !granted {
                        waiting_singles.push((who, lock));
                    }
                }
                Op::SingleRelease { single: who, lock } => {
                    store.step(lock, |step, lock| step.release(lock, &single_token(who)));
                    waiting_singles.retain(|&entry| entry != (who, lock));
                }
                Op::Delete { lock } => store.locks[lock] = Lock::default(),
                Op::Advance { ms } => {
                    store.now.mono += ms * 1_000;
                    store.now.wall += ms * 1_000;
                    for index in 0..LOCKS {
                        store.step(index, |step, lock| step.settle(lock).expect("mint"));
                    }
                }
            }
        }
        // Arrivals stop. Whoever holds lets go; whoever waits keeps calling each round (well
        // within its ticket's life) and lets go once granted.
        for (set, set_members) in members.iter().enumerate() {
            if !waiting_sets[set] {
                release_all(&mut store, set_members, &set_token(set));
            }
        }
        for who in 0..3 {
            for lock in 0..LOCKS {
                if !waiting_singles.contains(&(who, lock)) {
                    store.step(lock, |step, lock| step.release(lock, &single_token(who)));
                }
            }
        }
        for _round in 0..40 {
            if !waiting_sets.contains(&true) && waiting_singles.is_empty() {
                break;
            }
            store.now.mono += 10_000;
            store.now.wall += 10_000;
            for (set, set_members) in members.iter().enumerate() {
                if waiting_sets[set] {
                    let token = set_token(set);
                    if let SetOutcome::Granted(_) = call(&mut store, set_members, &token) {
                        release_all(&mut store, set_members, &token);
                        waiting_sets[set] = false;
                    }
                }
            }
            let mut still = Vec::new();
            for (who, lock) in std::mem::take(&mut waiting_singles) {
                let token = single_token(who);
                // A line headed by a set is never passed: a single behind one stays in line.
                let behind_a_set = store.locks[lock].waiters().next().is_some_and(|head| head.set);
                if single(&mut store, lock, &token) {
                    prop_assert!(!behind_a_set || !in_line(&store, lock, &token), "passed a set");
                    store.step(lock, |step, lock| step.release(lock, &token));
                } else {
                    still.push((who, lock));
                }
            }
            waiting_singles = still;
        }
        prop_assert!(
            !waiting_sets.contains(&true) && waiting_singles.is_empty(),
            "still waiting after 40 rounds: sets {:?}, singles {:?}",
            waiting_sets,
            waiting_singles
        );
    }
}
