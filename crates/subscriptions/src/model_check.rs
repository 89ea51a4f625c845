//! Generation fencing of subscriptions, model-checked (issue 24, step 1): every interleaving,
//! exhaustively within its bounds, of two pull-wake workers that claim, commit (outputs and the
//! ack in one step), lose answers and send the same commit again, or stall while the lease
//! runs out and the other worker claims the next generation (a zombie); and of time passing.
//!
//! The decisions are the real ones of `rules` (`may_claim`, `may_wake`, `wake`, `hold`,
//! `fence`, `ended_by`, `acked_already`, `apply_acks`, `finish`), taken in the order the
//! service takes them (`service.rs`: `claim`, `ack`); the service's I/O (loading, the engine's
//! transaction) is what the model leaves out: a commit's outputs, cursor and wake change are one
//! atomic step there, and one step here. Lives in the crate because the rules are
//! crate-private.
//!
//! Properties: the output holds exactly one application of each acknowledged input record, in
//! order (a fenced generation's commit is never applied, a retried commit never twice); and, so
//! that the model is not vacuous, runs exist where all input is processed and where a zombie's
//! commit was refused.

use std::hash::{Hash, Hasher};

use bytes::Bytes;
use oncelog_protocol::Offset;
use stateright::{Checker, Model, Property};

use super::rules;
use super::state::Entry;
use super::{codec, Ack, AckVia, Cursor, Fence, Link, LinkType, SubConfig, SubError, SubKind, SubRecord};

/// Input records: the linked stream holds offsets 0..TAIL, one record each.
const TAIL: u64 = 3;
const LEASE_MS: u32 = 1_000;
/// Each tick moves the clock by this; two ticks outlive a lease.
const TICK_MS: i64 = 600;
const MAX_TICKS: u8 = 5;
const WORKERS: [&str; 2] = ["a", "b"];
const INPUT: &str = "in";

/// What a worker believes it holds.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Held {
    generation: u64,
    /// Where its read started: the acknowledged offset when it claimed.
    start: u64,
    /// The commit it sent (acknowledging up to here), whose answer it has not had.
    sent: Option<u64>,
}

#[derive(Clone, Debug)]
struct State {
    rec: SubRecord,
    acked: u64,
    now: i64,
    ticks: u8,
    held: [Option<Held>; 2],
    /// The output stream: the input offsets applied, in order.
    output: Vec<u64>,
    /// A commit of a generation older than the current one was refused.
    zombie_fenced: bool,
}

impl State {
    /// The record in its stored form (what a recovered service loads), and the rest.
    fn key(&self) -> (Vec<u8>, u64, i64, u8, &[Option<Held>; 2], &[u64], bool) {
        (codec::encode(&self.rec), self.acked, self.now, self.ticks, &self.held, &self.output, self.zombie_fenced)
    }

    fn entry(&self) -> Entry {
        let mut e = Entry::new(self.rec.clone(), Bytes::new());
        e.cursors.insert(INPUT.into(), Cursor { stream_id: 1, acked: Offset(self.acked) });
        e
    }

    fn links(&self) -> Vec<Link> {
        vec![Link {
            path: INPUT.into(),
            link_type: LinkType::Explicit,
            stream_id: 1,
            acked: Offset(self.acked),
            tail: Offset(TAIL),
        }]
    }

    /// The linked streams with unprocessed input.
    fn pending(&self) -> Vec<Link> {
        self.links().into_iter().filter(|l| l.acked < l.tail).collect()
    }
}

impl PartialEq for State {
    fn eq(&self, o: &Self) -> bool {
        self.key() == o.key()
    }
}
impl Eq for State {}
impl Hash for State {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.key().hash(h)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Action {
    Tick,
    Claim(usize),
    /// Worker w commits the records from its start up to here, with `done`.
    Commit(usize, u64),
    /// Worker w learns its answer, or gives up: it holds nothing any more.
    Forget(usize),
}

struct Fencing;

impl Model for Fencing {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let config = SubConfig {
            kind: SubKind::PullWake { wake_stream: "wake".into() },
            pattern: None,
            streams: vec![INPUT.into()],
            lease_ttl_ms: LEASE_MS,
            description: None,
            outputs: vec!["out".into()],
        };
        let rec = rules::new_record("sub", 7, &config, 0);
        vec![State { rec, acked: 0, now: 0, ticks: 0, held: [None, None], output: Vec::new(), zombie_fenced: false }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        if s.ticks < MAX_TICKS {
            actions.push(Action::Tick);
        }
        for (w, held) in s.held.iter().enumerate() {
            match held {
                None => actions.push(Action::Claim(w)),
                Some(h) => {
                    match h.sent {
                        // A retry: the same commit again.
                        Some(upto) => actions.push(Action::Commit(w, upto)),
                        None => actions.extend((h.start + 1..=TAIL).map(|upto| Action::Commit(w, upto))),
                    }
                    actions.push(Action::Forget(w));
                }
            }
        }
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        let mut n = s.clone();
        match action {
            Action::Tick => {
                n.now += TICK_MS;
                n.ticks += 1;
            }
            // As `Subscriptions::claim`.
            Action::Claim(w) => {
                let live = rules::may_claim(&n.rec, WORKERS[w], n.now).ok()?;
                if !live {
                    let pending = n.pending();
                    if !rules::may_wake(&n.rec, n.now)
                        || !matches!(rules::wake(&mut n.rec, &pending, None, n.now), rules::Woke::Issued(_))
                    {
                        return None;
                    }
                }
                let generation = rules::hold(&mut n.rec, WORKERS[w], n.now).ok()?;
                n.held[w] = Some(Held { generation, start: n.acked, sent: None });
            }
            // As `Subscriptions::ack` with `via: Commit`, `done: true`.
            Action::Commit(w, upto) => {
                let h = n.held[w].clone()?;
                n.held[w] = Some(Held { sent: Some(upto), ..h.clone() });
                let fence = Fence {
                    uid: n.rec.uid,
                    token_generation: h.generation,
                    generation: h.generation,
                    wake_id: n.rec.wake_id(h.generation),
                };
                let acks = [Ack { stream: INPUT.into(), offset: Offset(upto) }];
                if let Err(err) = rules::fence(&n.rec, &fence, AckVia::Commit, n.now) {
                    let duplicate = rules::ended_by(&n.rec, &fence, AckVia::Commit)
                        && matches!(err, SubError::Fenced)
                        && rules::acked_already(&n.entry(), &n.links(), &acks);
                    if !duplicate && h.generation < n.rec.generation {
                        n.zombie_fenced = true;
                    }
                    return Some(n);
                }
                let mut entry = n.entry();
                if rules::apply_acks(&mut entry, &n.links(), &acks).is_err() {
                    return Some(n);
                }
                n.acked = entry.cursors.get(INPUT).map_or(n.acked, |c| c.acked.0);
                n.output.extend(h.start..upto);
                rules::finish(&mut n.rec);
                let pending = n.pending();
                if rules::may_wake(&n.rec, n.now) {
                    rules::wake(&mut n.rec, &pending, None, n.now);
                }
            }
            Action::Forget(w) => n.held[w] = None,
        }
        Some(n)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("each acknowledged input applied exactly once, in order", |_, s: &State| {
                s.output == (0..s.acked).collect::<Vec<_>>()
            }),
            Property::sometimes("all input processed", |_, s: &State| s.acked == TAIL),
            Property::sometimes("a zombie's commit refused", |_, s: &State| s.zombie_fenced),
        ]
    }
}

#[test]
fn a_fenced_generation_never_commits_and_a_retried_commit_never_applies_twice() {
    let checker = Fencing.checker().spawn_bfs().join();
    checker.assert_properties();
    assert!(checker.unique_state_count() > 1_000, "the model explored only {} states", checker.unique_state_count());
    eprintln!("subscription fencing: {} states", checker.unique_state_count());
}
