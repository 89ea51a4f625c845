//! The producer protocol, model-checked (issue 24, step 1): every interleaving, exhaustively within
//! its bounds, of a client pipelining its sequence numbers with retries, a network that reorders,
//! duplicates and drops requests and answers, and a server that crashes (losing what it had not
//! made durable, and the requests waiting in it) and recovers. The network needs no drop or
//! duplicate action of its own: a message that is never delivered is a drop (every interleaving
//! includes the ones where it stays on the wire), and a retry is a duplicate of its request. The server is the real stream state machine
//! (`machine::StreamState`, deciding by `rules::append`) and the real parking rule
//! (`rules::parkable`); only the transport and the crash are modelled.
//!
//! Properties: the stream holds each sequence number at most once and in order (exactly-once,
//! ordered); an acknowledged append is in the stream at the offset its answer named; and, as a
//! check that the model is not vacuous, a run where every append is acknowledged exists.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};

use bytes::Bytes;
use oncelog_protocol::headers::ProducerHeaders;
use oncelog_protocol::Offset;
use oncelog_storage::codec::producer::ProducerRecord;
use oncelog_storage::machine::{Step, StreamState};
use oncelog_storage::rules::{self, Retention};
use oncelog_storage::{AppendRequest, StreamMeta};
use stateright::{Checker, Model, Property};

const PRODUCER: &str = "p";
/// Appends the client makes: sequence numbers `0..APPENDS`, all pipelined at once.
const APPENDS: u64 = 4;
/// Copies of one request the client may send: the first and its retries.
const SENDS: u8 = 2;

/// An answer on its way back to the client.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Answer {
    /// 200 or 204: written (now or before), ending at this offset.
    Written { next: u64 },
    /// Any refusal (a gap after the park timeout among them): the client may try again.
    Refused,
}

#[derive(Clone, Debug)]
struct State {
    /// The server's durable state, as the state machine keeps it.
    stream: StreamState,
    /// The stream's bytes: one byte per append, its sequence number.
    log: Vec<u8>,
    /// Requests waiting in the server for their predecessors (gone at a crash).
    parked: Vec<u64>,
    /// Requests on the network: sequence number -> copies.
    requests: BTreeMap<u64, u8>,
    /// Answers on the network: (sequence number, answer) -> copies.
    answers: BTreeMap<(u64, Answer), u8>,
    /// Copies of each request sent so far.
    sent: [u8; APPENDS as usize],
    /// The offset each acknowledged append's answer named.
    acked: [Option<u64>; APPENDS as usize],
}

/// What identifies a state: the state machine's state in its stored form (what a recovered
/// server would load), and the rest as it is.
type Key = (u64, Vec<(String, Vec<u8>)>, Vec<u8>, Vec<u64>, BTreeMap<u64, u8>, BTreeMap<(u64, Answer), u8>, [u8; APPENDS as usize], [Option<u64>; APPENDS as usize]);

impl State {
    fn key(&self) -> Key {
        let mut producers: Vec<(String, Vec<u8>)> =
            self.stream.producers.iter().map(|(id, s)| (id.clone(), ProducerRecord::encode_state(s))).collect();
        producers.sort();
        (
            self.stream.tail.0,
            producers,
            self.log.clone(),
            self.parked.clone(),
            self.requests.clone(),
            self.answers.clone(),
            self.sent,
            self.acked,
        )
    }
}

impl Hash for State {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.key().hash(h);
    }
}

impl PartialEq for State {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl Eq for State {}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Action {
    Send(u64),
    /// The server takes a request, decides it and makes the outcome durable before answering.
    Deliver(u64),
    /// The server takes a request and crashes before its outcome is durable.
    DeliverAndCrash(u64),
    /// A parked request's wait ends: it is decided again, and refused if still early.
    ParkTimeout(u64),
    /// The server crashes between requests: what waited in it is gone.
    Crash,
    Receive(u64, Answer),
}

struct ProducerModel;

fn request(seq: u64) -> AppendRequest {
    let mut req = AppendRequest::plain("s", "application/octet-stream", false, Bytes::from(vec![seq as u8]), 0);
    req.producer = Some(ProducerHeaders { id: PRODUCER.into(), epoch: 0, seq });
    req
}

fn put<K: Ord>(map: &mut BTreeMap<K, u8>, k: K) {
    *map.entry(k).or_default() += 1;
}

fn take<K: Ord>(map: &mut BTreeMap<K, u8>, k: &K) -> bool {
    match map.get_mut(k) {
        Some(n) if *n > 1 => {
            *n -= 1;
            true
        }
        Some(_) => {
            map.remove(k);
            true
        }
        None => false,
    }
}

impl State {
    /// The server decides `seq` (the state machine applies an accepted append to itself; the
    /// model writes its byte); an early request parks (`rules::parkable`), an accepted one
    /// releases its parked successor. Returns the answer, if one is sent now.
    fn decide(&mut self, seq: u64, may_park: bool) -> Option<Answer> {
        let req = request(seq);
        let answer = match self.stream.append(&req, &Retention::default()) {
            Ok(Step::Write(w)) => {
                self.log.extend_from_slice(&req.data);
                Answer::Written { next: w.outcome.next_offset.0 }
            }
            Ok(Step::Answer(outcome)) => Answer::Written { next: outcome.next_offset.0 },
            Err(e) if may_park && rules::parkable(&req, &e) => {
                if !self.parked.contains(&seq) {
                    self.parked.push(seq);
                    self.parked.sort_unstable();
                }
                return None;
            }
            Err(_) => Answer::Refused,
        };
        if matches!(answer, Answer::Written { .. }) {
            if let Some(i) = self.parked.iter().position(|s| *s == seq + 1) {
                self.parked.remove(i);
                if let Some(a) = self.decide(seq + 1, true) {
                    put(&mut self.answers, (seq + 1, a));
                }
            }
        }
        Some(answer)
    }
}

impl Model for ProducerModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let stream = StreamState::new(StreamMeta::new(1, 0, "application/octet-stream"), Offset(0));
        vec![State {
            stream,
            log: Vec::new(),
            parked: Vec::new(),
            requests: BTreeMap::new(),
            answers: BTreeMap::new(),
            sent: [0; APPENDS as usize],
            acked: [None; APPENDS as usize],
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        for seq in 0..APPENDS {
            if s.acked[seq as usize].is_none() && s.sent[seq as usize] < SENDS {
                actions.push(Action::Send(seq));
            }
        }
        for &seq in s.requests.keys() {
            actions.push(Action::Deliver(seq));
            actions.push(Action::DeliverAndCrash(seq));
        }
        for &seq in &s.parked {
            actions.push(Action::ParkTimeout(seq));
        }
        if !s.parked.is_empty() {
            actions.push(Action::Crash);
        }
        for (seq, a) in s.answers.keys() {
            actions.push(Action::Receive(*seq, a.clone()));
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Send(seq) => {
                s.sent[seq as usize] += 1;
                put(&mut s.requests, seq);
            }
            Action::Deliver(seq) => {
                take(&mut s.requests, &seq);
                if let Some(a) = s.decide(seq, true) {
                    put(&mut s.answers, (seq, a));
                }
            }
            Action::DeliverAndCrash(seq) => {
                // Nothing of it was durable; whatever waited in the server is gone too.
                take(&mut s.requests, &seq);
                s.parked.clear();
            }
            Action::Crash => s.parked.clear(),
            Action::ParkTimeout(seq) => {
                s.parked.retain(|p| *p != seq);
                if let Some(a) = s.decide(seq, false) {
                    put(&mut s.answers, (seq, a));
                }
            }
            Action::Receive(seq, a) => {
                take(&mut s.answers, &(seq, a.clone()));
                if let Answer::Written { next } = a {
                    s.acked[seq as usize].get_or_insert(next);
                }
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("each append at most once, in order", |_, s: &State| {
                s.log.iter().enumerate().all(|(i, b)| u64::from(*b) == i as u64)
            }),
            Property::always("an acknowledged append is in the stream where its answer said", |_, s: &State| {
                s.acked.iter().enumerate().all(|(seq, next)| match next {
                    // One byte per append: sequence number `seq` ends at `seq + 1`.
                    Some(next) => *next == seq as u64 + 1 && s.log.len() as u64 >= *next,
                    None => true,
                })
            }),
            Property::sometimes("every append acknowledged", |_, s: &State| s.acked.iter().all(Option::is_some)),
        ]
    }
}

#[test]
fn pipelined_producer_over_a_faulty_network_and_a_crashing_server_writes_exactly_once_in_order() {
    let checker = ProducerModel.checker().spawn_bfs().join();
    checker.assert_properties();
    // Exhaustive, not sampled: the run ended because the reachable states ran out.
    assert!(checker.is_done(), "the bounded state space was not fully explored");
    eprintln!("{} states explored", checker.unique_state_count());
}
