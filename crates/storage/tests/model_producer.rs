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
    /// The stream's bytes: one byte per append, its index in the model's `appends`.
    log: Vec<u8>,
    /// Requests waiting in the server for their predecessors (gone at a crash).
    parked: Vec<usize>,
    /// Requests on the network: append (index into the model's `appends`) -> copies.
    requests: BTreeMap<usize, u8>,
    /// Answers on the network: (append, answer) -> copies.
    answers: BTreeMap<(usize, Answer), u8>,
    /// Copies of each request sent so far (by index into the model's `appends`).
    sent: Vec<u8>,
    /// The offset each acknowledged append's answer named.
    acked: Vec<Option<u64>>,
}

/// What identifies a state: the state machine's state in its stored form (what a recovered
/// server would load), and the rest as it is.
type Key = (
    u64,
    Vec<(String, Vec<u8>)>,
    Vec<u8>,
    Vec<usize>,
    BTreeMap<usize, u8>,
    BTreeMap<(usize, Answer), u8>,
    Vec<u8>,
    Vec<Option<u64>>,
);

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
            self.sent.clone(),
            self.acked.clone(),
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
    Send(usize),
    /// The server takes a request, decides it and makes the outcome durable before answering.
    Deliver(usize),
    /// The server takes a request and crashes before its outcome is durable.
    DeliverAndCrash(usize),
    /// A parked request's wait ends: it is decided again, and refused if still early.
    ParkTimeout(usize),
    /// The server crashes between requests: what waited in it is gone.
    Crash,
    Receive(usize, Answer),
}

/// One producer id writing `appends` (each an `(epoch, seq)`, in the order its instances send
/// them; an instance of a higher epoch is a restarted producer, the lower one its zombie), every
/// request sent up to `sends` times (the first and its retries), all pipelined at once.
struct ProducerModel {
    appends: Vec<(u64, u64)>,
    sends: u8,
}

impl ProducerModel {
    fn request(&self, i: usize) -> AppendRequest {
        let (epoch, seq) = self.appends[i];
        let mut req = AppendRequest::plain("s", "application/octet-stream", false, Bytes::from(vec![i as u8]), 0);
        req.producer = Some(ProducerHeaders { id: PRODUCER.into(), epoch, seq });
        req
    }

    /// The append right after `i` in its epoch, if the model makes one.
    fn successor(&self, i: usize) -> Option<usize> {
        let (epoch, seq) = self.appends[i];
        self.appends.iter().position(|a| *a == (epoch, seq + 1))
    }
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
    fn decide(&mut self, m: &ProducerModel, i: usize, may_park: bool) -> Option<Answer> {
        let req = m.request(i);
        let answer = match self.stream.append(&req, &Retention::default(), 0) {
            Ok(Step::Write(w)) => {
                self.log.extend_from_slice(&req.data);
                Answer::Written { next: w.outcome.next_offset.0 }
            }
            Ok(Step::Answer(outcome)) => Answer::Written { next: outcome.next_offset.0 },
            Err(e) if may_park && rules::parkable(&req, &e) => {
                if !self.parked.contains(&i) {
                    self.parked.push(i);
                    self.parked.sort_unstable();
                }
                return None;
            }
            Err(_) => Answer::Refused,
        };
        if matches!(answer, Answer::Written { .. }) {
            if let Some(next) = m.successor(i).filter(|n| self.parked.contains(n)) {
                self.parked.retain(|p| *p != next);
                if let Some(a) = self.decide(m, next, true) {
                    put(&mut self.answers, (next, a));
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
            sent: vec![0; self.appends.len()],
            acked: vec![None; self.appends.len()],
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        for i in 0..self.appends.len() {
            if s.acked[i].is_none() && s.sent[i] < self.sends {
                actions.push(Action::Send(i));
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
                s.sent[seq] += 1;
                put(&mut s.requests, seq);
            }
            Action::Deliver(seq) => {
                take(&mut s.requests, &seq);
                if let Some(a) = s.decide(self, seq, true) {
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
                if let Some(a) = s.decide(self, seq, false) {
                    put(&mut s.answers, (seq, a));
                }
            }
            Action::Receive(seq, a) => {
                take(&mut s.answers, &(seq, a.clone()));
                if let Answer::Written { next } = a {
                    s.acked[seq].get_or_insert(next);
                }
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("each append at most once, in order within its epoch", |m: &Self, s: &State| {
                let mut next: BTreeMap<u64, u64> = BTreeMap::new();
                s.log.iter().all(|b| {
                    let (epoch, seq) = m.appends[usize::from(*b)];
                    let expected = next.entry(epoch).or_default();
                    let ok = seq == *expected;
                    *expected += 1;
                    ok
                })
            }),
            Property::always(
                "a zombie is fenced: nothing of an older epoch after a newer one",
                |m: &Self, s: &State| {
                    s.log.windows(2).all(|w| m.appends[usize::from(w[0])].0 <= m.appends[usize::from(w[1])].0)
                },
            ),
            Property::always("an acknowledged append is in the stream where its answer said", |_, s: &State| {
                s.acked.iter().enumerate().all(|(i, next)| match next {
                    // One byte per append: the append ends where its byte is, plus one.
                    Some(next) => {
                        s.log.iter().position(|b| usize::from(*b) == i).is_some_and(|at| at as u64 + 1 == *next)
                    }
                    None => true,
                })
            }),
            Property::sometimes("the newest epoch's appends all acknowledged", |m: &Self, s: &State| {
                let newest = m.appends.iter().map(|a| a.0).max().unwrap_or(0);
                m.appends.iter().zip(&s.acked).all(|(a, acked)| a.0 != newest || acked.is_some())
            }),
        ]
    }
}

fn check(model: ProducerModel) -> usize {
    let checker = model.checker().spawn_bfs().join();
    checker.assert_properties();
    // Exhaustive, not sampled: the run ended because the reachable states ran out.
    assert!(checker.is_done(), "the bounded state space was not fully explored");
    checker.unique_state_count()
}

#[test]
fn pipelined_producer_over_a_faulty_network_and_a_crashing_server_writes_exactly_once_in_order() {
    let states = check(ProducerModel { appends: (0..4).map(|seq| (0, seq)).collect(), sends: 2 });
    eprintln!("{states} states explored");
}

#[test]
fn a_restarted_producer_fences_its_zombie() {
    // The zombie (epoch 0) keeps sending while its successor (epoch 1) starts over at seq 0.
    let states = check(ProducerModel { appends: vec![(0, 0), (0, 1), (1, 0), (1, 1)], sends: 2 });
    eprintln!("{states} states explored");
}
