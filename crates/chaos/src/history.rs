//! The history of a run: one [`Op`] per operation a client invoked, with what it knew when it
//! completed. Written as JSON lines while the run goes (a crash of the harness loses no more
//! than the line being written).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// How an operation ended, as its client knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// The server answered success.
    Ok,
    /// The server answered a refusal that says nothing was written (a 4xx).
    Failed,
    /// No answer, a timeout or a 5xx: it may or may not have taken effect.
    Unknown,
}

/// An idempotent producer's stamp on an append.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Stamp {
    pub producer: String,
    pub epoch: u64,
    pub seq: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OpKind {
    /// An append of `record`: a body unique in the run, ending in `\n`, so that the final
    /// stream can be split into records and each found again.
    Append {
        stream: String,
        record: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stamp: Option<Stamp>,
        /// `If-Match`: the tail the append was conditional on.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        if_match: Option<u64>,
        /// `Stream-Next-Offset` of a successful answer.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        next_offset: Option<u64>,
    },
    /// A read (catch-up, long-poll or SSE) of `bytes` from offset `from`.
    Read { stream: String, from: u64, bytes: String },
    /// A subscription worker's transactional commit: `output` appended to the output stream
    /// and each input acknowledged up to its `to`, under claim `generation`.
    Commit { generation: u64, inputs: Vec<Input>, output: String },
}

/// What a commit consumed: `stream` from `from` to `to`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Input {
    pub stream: String,
    pub from: u64,
    pub to: u64,
}

/// One operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Op {
    pub id: u64,
    /// Who invoked it (a producer, a reader, a worker): order is per process.
    pub process: String,
    pub invoked_ms: u64,
    pub completed_ms: u64,
    pub outcome: Outcome,
    #[serde(flatten)]
    pub kind: OpKind,
}

/// A run's history and the streams as they were at its end (read once every fault healed).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct History {
    pub ops: Vec<Op>,
    pub finals: BTreeMap<String, String>,
    /// The subscription at the end, when the run had subscription workers.
    pub subs: Option<SubsEnd>,
}

/// Where a subscription stood at the end of a run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubsEnd {
    /// The acknowledged offset per input stream.
    pub acked: BTreeMap<String, u64>,
    /// The output stream's contents.
    pub output: String,
}

/// A history line that is not an [`Op`].
#[derive(Debug, thiserror::Error)]
#[error("history line {line}: {source}")]
pub struct ParseError {
    pub line: usize,
    #[source]
    pub source: serde_json::Error,
}

impl History {
    /// The operations of a JSON-lines history (blank lines skipped).
    pub fn parse_ops(text: &str) -> Result<Vec<Op>, ParseError> {
        text.lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
            .map(|(i, l)| serde_json::from_str(l).map_err(|source| ParseError { line: i + 1, source }))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_op_round_trips_through_its_json_line() {
        let op = Op {
            id: 7,
            process: "p1".into(),
            invoked_ms: 10,
            completed_ms: 12,
            outcome: Outcome::Unknown,
            kind: OpKind::Append {
                stream: "s".into(),
                record: "p1:3\n".into(),
                stamp: Some(Stamp { producer: "p1".into(), epoch: 0, seq: 3 }),
                if_match: None,
                next_offset: None,
            },
        };
        let line = serde_json::to_string(&op).expect("json");
        assert!(line.contains(r#""type":"append""#) && line.contains(r#""outcome":"unknown""#), "{line}");
        assert_eq!(History::parse_ops(&format!("{line}\n\n{line}")).expect("parse"), vec![op.clone(), op]);
        let err = History::parse_ops("{\"id\":1}").expect_err("not an op");
        assert_eq!(err.line, 1);
    }
}
