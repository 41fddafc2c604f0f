//! Fences across a slot move, as a pure state machine (docs/scaling.md).
//!
//! A resource whose slot moves to another node must keep getting larger fences there, whatever
//! the two nodes' clocks say. A lease that is held moves with its key (the key carries its
//! fence, and loading it raises the counter). A resource that is free has no key, and a shared
//! lease released before its key moved left no trace in it: the only record of their last fences
//! is the old owner's counter. So the node taking a slot asks the old owner for its counter over
//! the cluster bus, and grants nothing (no `ACQUIRE` of that slot, which is also the only way
//! into a line that a hand-over later serves) until an answer sent after the question arrived:
//!
//! - while the slot is being imported (`CLUSTER SETSLOT <slot> IMPORTING <source>`), a client
//!   reaches this node for a resource only after the source, which migrates the slot, found no
//!   key there and redirected it: the source mints nothing more for that resource. An
//!   answer to a question sent after the resource's first attempt here covers every fence the
//!   source minted for it;
//! - once the slot is this node's (`CLUSTER SETSLOT <slot> NODE <me>`, after every key moved), the
//!   source mints nothing more for the slot: one answer to a question sent then covers all of it.
//!
//! Until then, the grant is answered `TRYAGAIN`, as Redis answers a multi-key command during a
//! migration, and cluster clients retry it. A source that does not answer within
//! [`FLOOR_WAIT_LIMIT_US`] (it failed, or the bus is cut) is given up on: the node leads its counter
//! by `dlock.fence-lead-ms` instead and grants (docs/scaling.md says what that assumes).

use std::collections::HashMap;

use super::Micros;
pub use super::fenced::key_slot;

/// A cluster node's name (`CLUSTER MYID`).
pub type NodeId = [u8; 40];

/// How long a question to the old owner may go unanswered before it is asked again.
pub const FLOOR_RESEND_US: Micros = 200_000;
/// How long a slot may wait for its old owner's counter before the node gives up on it.
pub const FLOOR_WAIT_LIMIT_US: Micros = 2_000_000;

/// Number of hash slots in a cluster.
pub use dlock_proto::slot::SLOTS;

/// A question to send: "what is your fence counter?", numbered `seq`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Question {
    /// The node to ask.
    pub to: NodeId,
    /// Its number; every question has a larger one than the last.
    pub seq: u64,
}

/// A `CLUSTER SETSLOT` the filter saw, applied before the next gate or event-loop sleep.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SlotChange {
    /// `SETSLOT slot IMPORTING node`: this node starts taking the slot from `node`.
    Importing(u16, NodeId),
    /// `SETSLOT slot NODE node`: the slot now belongs to `node`.
    Node(u16, NodeId),
    /// `SETSLOT slot STABLE`: the move was called off.
    Stable(u16),
}

/// The slots this node is taking, the `SETSLOT` changes not yet applied, and the questions owed
/// to old owners: the module's cluster-bus state (kept in the module's one owner).
#[derive(Debug, Default)]
pub struct SlotMoves {
    /// What the old owners answered, and what is still asked.
    pub floors: Floors,
    /// `SETSLOT` changes seen by the filter, in order.
    pub changes: Vec<SlotChange>,
    /// Questions to send before the event loop sleeps.
    pub outbox: Vec<Question>,
}

/// What to do with an `ACQUIRE` of a resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Gate {
    /// Mint: the counter is above every fence the old owner minted for the resource.
    Mint,
    /// Answer `TRYAGAIN`; send `ask` first if there is one.
    TryAgain { ask: Option<Question> },
    /// The old owner did not answer in time: lead the counter, then mint.
    GaveUp { source: NodeId },
}

/// What this node waits for, for one slot it takes.
#[derive(Clone, Debug)]
struct Taking {
    /// The old owner.
    source: NodeId,
    /// Whether the slot is still being imported (else it is ours, waiting for one answer).
    importing: bool,
    /// Importing: for each resource seen, the question its grants wait for.
    asked: HashMap<Box<[u8]>, u64>,
    /// Ours: the question the whole slot waits for.
    settles_with: u64,
    /// When this node started waiting for an answer it has not had (for the time limit).
    waiting_since: Option<Micros>,
}

/// Every slot this node is taking, and what the old owners answered.
#[derive(Debug, Default)]
pub struct Floors {
    next_seq: u64,
    taking: HashMap<u16, Taking>,
    /// Per node: the largest question it answered, and the last one sent to it (and when).
    answered: HashMap<NodeId, u64>,
    sent: HashMap<NodeId, (u64, Micros)>,
}

impl Floors {
    /// Whether any slot waits for an answer (the gate has nothing to check otherwise).
    pub fn is_idle(&self) -> bool {
        self.taking.is_empty()
    }

    /// `CLUSTER SETSLOT slot IMPORTING source` on this node.
    pub fn importing(&mut self, slot: u16, source: NodeId) {
        let fresh = || Taking {
            source,
            importing: true,
            asked: HashMap::new(),
            settles_with: 0,
            waiting_since: None,
        };
        let taking = self.taking.entry(slot).or_insert_with(fresh);
        if taking.source != source || !taking.importing {
            *taking = fresh();
        }
    }

    /// `CLUSTER SETSLOT slot STABLE` (or the slot given to another node): the import is off.
    pub fn stable(&mut self, slot: u16) {
        self.taking.remove(&slot);
    }

    /// `CLUSTER SETSLOT slot NODE <this node>` at `now`: the slot is ours. If it was being
    /// imported, one answer from its source to a question sent now settles it; returns that
    /// question. A slot taken without an import first has no known source: nothing to ask.
    /// Many slots taken at one instant from one source (an atomic migration of a range) share
    /// one question: it is returned for the first only.
    pub fn owned(&mut self, slot: u16, now: Micros) -> Option<Question> {
        let taking = self.taking.get_mut(&slot).filter(|taking| taking.importing)?;
        let source = taking.source;
        let shared = self.sent.get(&source).filter(|(_, at)| *at == now).map(|(seq, _)| *seq);
        let seq = shared.unwrap_or_else(|| {
            self.next_seq += 1;
            self.next_seq
        });
        let question = Question { to: source, seq };
        let taking = self.taking.get_mut(&slot)?;
        taking.importing = false;
        taking.asked = HashMap::new();
        taking.settles_with = question.seq;
        taking.waiting_since = Some(now);
        self.sent.insert(source, (question.seq, now));
        shared.is_none().then_some(question)
    }

    /// `source` answered question `seq` (its counter is already observed).
    pub fn answered(&mut self, source: NodeId, seq: u64) {
        let answered = self.answered.entry(source).or_default();
        *answered = (*answered).max(seq);
        let answered = *answered;
        self.taking.retain(|_, taking| {
            if taking.source != source {
                return true;
            }
            if taking.importing {
                if taking.asked.values().all(|needed| *needed <= answered) {
                    taking.waiting_since = None;
                }
                true
            } else {
                taking.settles_with > answered
            }
        });
    }

    /// An `ACQUIRE` of `resource` in `slot` at `now` (monotonic).
    pub fn gate(&mut self, slot: u16, resource: &[u8], now: Micros) -> Gate {
        let Some(taking) = self.taking.get_mut(&slot) else {
            return Gate::Mint;
        };
        let source = taking.source;
        let answered = self.answered.get(&source).copied().unwrap_or(0);
        let needed = if taking.importing {
            taking.asked.get(resource).copied()
        } else {
            Some(taking.settles_with)
        };
        if needed.is_some_and(|needed| needed <= answered) {
            return Gate::Mint;
        }
        if taking
            .waiting_since
            .is_some_and(|since| now.saturating_sub(since) >= FLOOR_WAIT_LIMIT_US)
        {
            self.taking.remove(&slot);
            return Gate::GaveUp { source };
        }
        taking.waiting_since.get_or_insert(now);
        // A question sent after this resource's first attempt, or a fresh one when the last went
        // unanswered too long.
        let ask = match (needed, self.sent.get(&source)) {
            (Some(_), Some((_, at))) if now.saturating_sub(*at) < FLOOR_RESEND_US => None,
            _ => {
                self.next_seq += 1;
                self.sent.insert(source, (self.next_seq, now));
                Some(Question { to: source, seq: self.next_seq })
            }
        };
        if let Some(question) = ask {
            if taking.importing {
                taking.asked.entry(resource.into()).or_insert(question.seq);
            } else {
                taking.settles_with = question.seq;
            }
        }
        Gate::TryAgain { ask }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOURCE: NodeId = [b'a'; 40];
    const OTHER: NodeId = [b'b'; 40];

    #[test]
    fn a_slot_no_one_imports_mints_at_once() {
        let mut floors = Floors::default();
        assert!(floors.is_idle());
        assert_eq!(floors.gate(7, b"r", 0), Gate::Mint);
        floors.answered(SOURCE, 5);
        assert_eq!(floors.gate(7, b"r", 0), Gate::Mint);
    }

    #[test]
    fn an_imported_resource_waits_for_an_answer_to_a_question_sent_after_its_first_attempt() {
        let mut floors = Floors::default();
        floors.importing(7, SOURCE);
        let Gate::TryAgain { ask: Some(first) } = floors.gate(7, b"r", 1_000) else {
            panic!("first attempt asks the source")
        };
        assert_eq!(first.to, SOURCE);
        // An answer to an older question is not enough.
        floors.answered(SOURCE, first.seq - 1);
        assert_eq!(floors.gate(7, b"r", 1_100), Gate::TryAgain { ask: None });
        floors.answered(SOURCE, first.seq);
        assert_eq!(floors.gate(7, b"r", 1_200), Gate::Mint);
        // Another resource of the slot needs a question of its own (the source may have minted
        // for it after the first answer).
        let Gate::TryAgain { ask: Some(second) } = floors.gate(7, b"s", 500_000) else {
            panic!("a new resource asks again")
        };
        assert!(second.seq > first.seq);
        assert_eq!(floors.gate(7, b"r", 500_000), Gate::Mint, "r stays settled");
        assert!(matches!(floors.gate(7, b"s", 500_100), Gate::TryAgain { .. }));
        floors.answered(SOURCE, second.seq);
        assert_eq!(floors.gate(7, b"s", 500_200), Gate::Mint);
        assert_eq!(floors.gate(8, b"s", 500_200), Gate::Mint, "other slots are free");
    }

    #[test]
    fn a_slot_made_ours_waits_for_one_answer_sent_then_and_is_forgotten_after_it() {
        let mut floors = Floors::default();
        assert_eq!(floors.owned(7, 0), None, "no import, no known source");
        floors.importing(7, SOURCE);
        let question = floors.owned(7, 10).expect("asks its source");
        assert_eq!(question.to, SOURCE);
        assert_eq!(floors.gate(7, b"r", 20), Gate::TryAgain { ask: None });
        floors.answered(OTHER, question.seq);
        assert_eq!(floors.gate(7, b"r", 30), Gate::TryAgain { ask: None }, "not from another node");
        floors.answered(SOURCE, question.seq);
        assert!(floors.is_idle());
        assert_eq!(floors.gate(7, b"anything", 40), Gate::Mint);
    }

    #[test]
    fn slots_taken_at_one_instant_from_one_source_share_one_question() {
        let mut floors = Floors::default();
        for slot in 0..100 {
            floors.importing(slot, SOURCE);
        }
        floors.importing(100, OTHER);
        let first = floors.owned(0, 10).expect("one question");
        assert!((1..100).all(|slot| floors.owned(slot, 10).is_none()), "shared");
        assert!(floors.owned(100, 10).is_some(), "another source, another question");
        assert_eq!(floors.gate(50, b"r", 11), Gate::TryAgain { ask: None });
        floors.answered(SOURCE, first.seq);
        assert_eq!(floors.gate(50, b"r", 12), Gate::Mint);
        assert!(matches!(floors.gate(100, b"r", 12), Gate::TryAgain { .. }));
    }

    #[test]
    fn an_unanswered_question_is_sent_again_and_the_source_is_given_up_on_in_time() {
        let mut floors = Floors::default();
        floors.importing(7, SOURCE);
        let Gate::TryAgain { ask: Some(first) } = floors.gate(7, b"r", 0) else { panic!() };
        assert_eq!(floors.gate(7, b"r", FLOOR_RESEND_US - 1), Gate::TryAgain { ask: None });
        let Gate::TryAgain { ask: Some(again) } = floors.gate(7, b"r", FLOOR_RESEND_US) else {
            panic!("asks again")
        };
        assert!(again.seq > first.seq);
        floors.answered(SOURCE, again.seq);
        assert_eq!(floors.gate(7, b"r", FLOOR_RESEND_US + 1), Gate::Mint, "a later answer covers");
        floors.importing(8, SOURCE);
        assert!(matches!(floors.gate(8, b"x", 10_000_000), Gate::TryAgain { .. }));
        assert_eq!(
            floors.gate(8, b"x", 10_000_000 + FLOOR_WAIT_LIMIT_US),
            Gate::GaveUp { source: SOURCE }
        );
        assert_eq!(floors.gate(8, b"x", 10_000_000 + FLOOR_WAIT_LIMIT_US), Gate::Mint);
    }

    #[test]
    fn stable_cancels_an_import_and_a_new_source_starts_over() {
        let mut floors = Floors::default();
        floors.importing(7, SOURCE);
        assert!(matches!(floors.gate(7, b"r", 0), Gate::TryAgain { .. }));
        floors.stable(7);
        assert_eq!(floors.gate(7, b"r", 1), Gate::Mint);
        floors.importing(7, SOURCE);
        floors.importing(7, OTHER);
        let Gate::TryAgain { ask: Some(question) } = floors.gate(7, b"r", 2) else { panic!() };
        assert_eq!(question.to, OTHER);
    }
}
