//! The State Protocol (upstream `packages/state/STATE-PROTOCOL.md`) as far as a server needs it
//! to compact a stream: which messages are changes and controls, the state they fold into, and
//! the snapshot that replaces a history.
//!
//! - A **change** is an object with string `type` and `key` and `headers.operation`: `insert`,
//!   `update` or `upsert` (which need a `value`) set the entity (type, key) to `value`; `delete`
//!   removes it.
//! - A **control** is an object whose `headers.control` is `snapshot-start` or `snapshot-end`
//!   (hints: no effect on state) or `reset` (clears all state).
//! - Anything else is not a State Protocol message ([`StateError`]); a stream created for
//!   compaction refuses it, so a fold never meets a message it cannot fold.
//!
//! Values are copied as their JSON text, never re-serialised: a snapshot carries each entity's
//! latest value byte for byte.

use std::collections::{BTreeMap, HashMap};

use serde_json::value::RawValue;

use crate::Offset;

/// Why a message is not a State Protocol message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    #[error("a State Protocol message must be a JSON object")]
    NotAnObject,
    #[error("a State Protocol message needs headers.operation (insert, update, upsert, delete) or headers.control (snapshot-start, snapshot-end, reset)")]
    NoOperation,
    #[error("a State Protocol change needs string \"type\" and \"key\" fields")]
    NoEntity,
    #[error("a State Protocol {0} needs a \"value\"")]
    NoValue(&'static str),
}

/// What one message does to the state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change<'a> {
    /// Sets the entity to `value` (insert, update, upsert).
    Set {
        entity: Entity<'a>,
        value: &'a str,
    },
    Delete {
        entity: Entity<'a>,
    },
    /// `reset`: clears every entity.
    Reset,
    /// `snapshot-start` / `snapshot-end`: no effect.
    Hint,
}

/// An entity's identity, as the JSON texts of its `type` and `key` (compared by their decoded
/// strings).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entity<'a> {
    pub type_name: String,
    pub key: String,
    type_json: &'a str,
    key_json: &'a str,
}

fn string_of(raw: &RawValue) -> Option<String> {
    serde_json::from_str::<String>(raw.get()).ok()
}

/// Reads one message (its JSON text, as stored).
pub fn parse(message: &[u8]) -> Result<Change<'_>, StateError> {
    let text = std::str::from_utf8(message).map_err(|_| StateError::NotAnObject)?;
    let fields: HashMap<String, &RawValue> = serde_json::from_str(text).map_err(|_| StateError::NotAnObject)?;
    let headers: HashMap<String, &RawValue> = match fields.get("headers") {
        Some(h) => serde_json::from_str(h.get()).map_err(|_| StateError::NoOperation)?,
        None => return Err(StateError::NoOperation),
    };
    if let Some(control) = headers.get("control").and_then(|c| string_of(c)) {
        return match control.as_str() {
            "reset" => Ok(Change::Reset),
            "snapshot-start" | "snapshot-end" => Ok(Change::Hint),
            _ => Err(StateError::NoOperation),
        };
    }
    let op = headers.get("operation").and_then(|o| string_of(o)).ok_or(StateError::NoOperation)?;
    let (type_json, key_json) = match (fields.get("type"), fields.get("key")) {
        (Some(t), Some(k)) => (*t, *k),
        _ => return Err(StateError::NoEntity),
    };
    let entity = Entity {
        type_name: string_of(type_json).ok_or(StateError::NoEntity)?,
        key: string_of(key_json).ok_or(StateError::NoEntity)?,
        type_json: type_json.get(),
        key_json: key_json.get(),
    };
    let needs_value = |name: &'static str| fields.get("value").map(|v| v.get()).ok_or(StateError::NoValue(name));
    match op.as_str() {
        "insert" => Ok(Change::Set { entity, value: needs_value("insert")? }),
        "update" => Ok(Change::Set { entity, value: needs_value("update")? }),
        "upsert" => Ok(Change::Set { entity, value: needs_value("upsert")? }),
        "delete" => Ok(Change::Delete { entity }),
        _ => Err(StateError::NoOperation),
    }
}

/// Checks that every message of `stored` (stored JSON form) is a State Protocol message.
pub fn validate(stored: &[u8]) -> Result<(), StateError> {
    crate::json::messages(stored).try_for_each(|m| parse(m).map(|_| ()))
}

/// Something a State Protocol fold writes to: the server's [`Materialized`] state (compaction),
/// a sink's net effect of a batch on its rows. [`apply`] is the one rule of what each change does.
pub trait Entities<'a> {
    fn set(&mut self, entity: Entity<'a>, value: &'a str);
    fn delete(&mut self, entity: Entity<'a>);
    fn clear(&mut self);
}

/// Applies `change` to `target`: a set sets, a delete deletes, a `reset` clears, a hint does
/// nothing. Whether it changed anything (every change but a hint).
pub fn apply<'a>(target: &mut impl Entities<'a>, change: Change<'a>) -> bool {
    match change {
        Change::Set { entity, value } => target.set(entity, value),
        Change::Delete { entity } => target.delete(entity),
        Change::Reset => target.clear(),
        Change::Hint => return false,
    }
    true
}

/// One live entity, as the JSON texts a snapshot insert is made of.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Live {
    type_json: String,
    key_json: String,
    value_json: String,
}

/// The state a sequence of messages materialises: every live entity's latest value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Materialized {
    entities: BTreeMap<(String, String), Live>,
}

impl Materialized {
    /// Applies the messages of `stored` (stored JSON form: each message's text and a `,`).
    pub fn fold(&mut self, stored: &[u8]) -> Result<(), StateError> {
        for message in crate::json::messages(stored) {
            self.apply(parse(message)?);
        }
        Ok(())
    }

    pub fn apply(&mut self, change: Change<'_>) {
        apply(self, change);
    }

    /// The live entities: ((type, key), value JSON text), ordered by type then key.
    pub fn entities(&self) -> impl Iterator<Item = ((&str, &str), &str)> {
        self.entities.iter().map(|((t, k), l)| ((t.as_str(), k.as_str()), l.value_json.as_str()))
    }

    pub fn len(&self) -> usize {
        self.entities.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entities.is_empty()
    }
}

impl<'a> Entities<'a> for Materialized {
    fn set(&mut self, entity: Entity<'a>, value: &'a str) {
        let live = Live {
            type_json: entity.type_json.to_owned(),
            key_json: entity.key_json.to_owned(),
            value_json: value.to_owned(),
        };
        self.entities.insert((entity.type_name, entity.key), live);
    }

    fn delete(&mut self, entity: Entity<'a>) {
        self.entities.remove(&(entity.type_name, entity.key));
    }

    fn clear(&mut self) {
        self.entities.clear();
    }
}

/// Snapshot appends of at most this many stored bytes each (one message bigger than this makes
/// an append of its own).
pub const SNAPSHOT_PIECE_BYTES: usize = 1 << 20;

fn control(kind: &str, offset: Offset) -> String {
    format!(r#"{{"headers":{{"control":"{kind}","offset":"{offset}"}}}}"#)
}

/// The appends that replace a history whose state is `state`, written at offset `at` (the tail),
/// in stored form:
/// 1. `reset` (its `offset`: where the snapshot starts), alone in the first append, so a reader
///    that was following the stream drops the state it had;
/// 2. `snapshot-start`, one `insert` per live entity, `snapshot-end` (whose `offset` is where the
///    snapshot ends), cut into appends of at most [`SNAPSHOT_PIECE_BYTES`] at message boundaries.
///
/// Offsets are fixed-width, so every position is known before anything is written.
pub fn snapshot(state: &Materialized, at: Offset) -> Vec<Vec<u8>> {
    let stored = |text: String| {
        let mut b = text.into_bytes();
        b.push(b',');
        b
    };
    let reset_len = stored(control("reset", at)).len() as u64;
    let start = Offset(at.0 + reset_len);
    let mut messages = vec![stored(control("snapshot-start", start))];
    for live in state.entities.values() {
        messages.push(stored(format!(
            r#"{{"type":{},"key":{},"value":{},"headers":{{"operation":"insert"}}}}"#,
            live.type_json, live.key_json, live.value_json
        )));
    }
    let end_len = stored(control("snapshot-end", start)).len() as u64;
    let end = Offset(start.0 + messages.iter().map(|m| m.len() as u64).sum::<u64>() + end_len);
    messages.push(stored(control("snapshot-end", end)));
    let mut pieces = vec![stored(control("reset", start))];
    let mut piece = Vec::new();
    for m in messages {
        if !piece.is_empty() && piece.len() + m.len() > SNAPSHOT_PIECE_BYTES {
            pieces.push(std::mem::take(&mut piece));
        }
        piece.extend_from_slice(&m);
    }
    pieces.push(piece);
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn stored(messages: &[String]) -> Vec<u8> {
        messages.iter().flat_map(|m| m.bytes().chain(std::iter::once(b','))).collect()
    }

    fn change(op: &str, ty: &str, key: &str, value: Option<&str>) -> String {
        match value {
            Some(v) => format!(r#"{{"type":"{ty}","key":"{key}","value":{v},"headers":{{"operation":"{op}"}}}}"#),
            None => format!(r#"{{"type":"{ty}","key":"{key}","headers":{{"operation":"{op}"}}}}"#),
        }
    }

    #[test]
    fn messages_are_changes_controls_or_refused() {
        assert!(matches!(
            parse(change("insert", "user", "1", Some("{\"n\":1}")).as_bytes()),
            Ok(Change::Set { value: "{\"n\":1}", .. })
        ));
        assert!(matches!(parse(change("delete", "user", "1", None).as_bytes()), Ok(Change::Delete { .. })));
        assert_eq!(parse(br#"{"headers":{"control":"reset"}}"#), Ok(Change::Reset));
        assert_eq!(parse(br#"{"headers":{"control":"snapshot-end","offset":"x"}}"#), Ok(Change::Hint));
        assert_eq!(parse(b"[1,2]"), Err(StateError::NotAnObject));
        assert_eq!(parse(b"7"), Err(StateError::NotAnObject));
        assert_eq!(parse(br#"{"type":"u","key":"1"}"#), Err(StateError::NoOperation));
        assert_eq!(parse(br#"{"headers":{"operation":"explode"},"type":"u","key":"1"}"#), Err(StateError::NoOperation));
        assert_eq!(parse(br#"{"headers":{"operation":"insert"},"type":"u"}"#), Err(StateError::NoEntity));
        assert_eq!(
            parse(br#"{"headers":{"operation":"insert"},"type":"u","key":1,"value":2}"#),
            Err(StateError::NoEntity)
        );
        assert_eq!(
            parse(br#"{"headers":{"operation":"update"},"type":"u","key":"1"}"#),
            Err(StateError::NoValue("update"))
        );
    }

    #[test]
    fn the_snapshot_of_a_history_is_its_latest_values_behind_a_reset() {
        let history = stored(&[
            change("insert", "user", "a", Some(r#"{"name":"Ann"}"#)),
            change("insert", "user", "b", Some(r#"{"name":"Bob"}"#)),
            change("update", "user", "a", Some(r#"{"name": "Anne",  "n":1.50}"#)),
            change("delete", "user", "b", None),
            change("upsert", "team", "a", Some("[1, 2]")),
        ]);
        let mut state = Materialized::default();
        state.fold(&history).expect("fold");
        let at = Offset(1000);
        let pieces = snapshot(&state, at);
        assert_eq!(pieces.len(), 2);
        let reset = String::from_utf8(pieces[0].clone()).expect("utf-8");
        let start = Offset(1000 + pieces[0].len() as u64);
        let end = Offset(start.0 + pieces[1].len() as u64);
        assert_eq!(reset, format!(r#"{{"headers":{{"control":"reset","offset":"{start}"}}}},"#));
        let body = String::from_utf8(pieces[1].clone()).expect("utf-8");
        // Values byte for byte, entities ordered by type then key; the end's offset is exact.
        assert_eq!(
            body,
            format!(
                concat!(
                    r#"{{"headers":{{"control":"snapshot-start","offset":"{start}"}}}},"#,
                    r#"{{"type":"team","key":"a","value":[1, 2],"headers":{{"operation":"insert"}}}},"#,
                    r#"{{"type":"user","key":"a","value":{{"name": "Anne",  "n":1.50}},"headers":{{"operation":"insert"}}}},"#,
                    r#"{{"headers":{{"control":"snapshot-end","offset":"{end}"}}}},"#
                ),
                start = start,
                end = end
            )
        );
    }

    #[test]
    fn big_snapshots_are_cut_between_messages() {
        let mut state = Materialized::default();
        let big = format!("\"{}\"", "x".repeat(300_000));
        for k in 0..10 {
            state.fold(&stored(&[change("insert", "blob", &k.to_string(), Some(&big))])).expect("fold");
        }
        let pieces = snapshot(&state, Offset::ZERO);
        assert!(pieces.len() >= 4, "{} pieces", pieces.len());
        let mut again = Materialized::default();
        for p in &pieces {
            assert!(p.len() <= SNAPSHOT_PIECE_BYTES && p.ends_with(b","));
            again.fold(p).expect("each piece is whole messages");
        }
        assert_eq!(again, state);
    }

    fn op() -> impl Strategy<Value = String> {
        let key = "[a-d]";
        let value = prop_oneof![
            Just("1".to_owned()),
            Just("{\"x\":[true,null]}".to_owned()),
            "[a-z]{0,6}".prop_map(|s| format!("\"{s}\""))
        ];
        prop_oneof![
            4 => (prop_oneof![Just("insert"), Just("update"), Just("upsert")], "[tu]", key, value).prop_map(|(op, t, k, v)| change(op, &t, &k, Some(&v))),
            2 => ("[tu]", key).prop_map(|(t, k)| change("delete", &t, &k, None)),
            1 => Just(r#"{"headers":{"control":"reset"}}"#.to_owned()),
            1 => Just(r#"{"headers":{"control":"snapshot-start"}}"#.to_owned()),
        ]
    }

    proptest! {
        /// Compacting at any point changes nothing a reader materialises: the snapshot of a
        /// prefix followed by the rest folds to the same state as the whole history.
        #[test]
        fn a_snapshot_then_the_rest_folds_like_the_whole_history(
            history in proptest::collection::vec(op(), 0..60),
            cut in any::<proptest::sample::Index>(),
        ) {
            let cut = cut.index(history.len() + 1);
            let mut whole = Materialized::default();
            whole.fold(&stored(&history)).expect("fold");
            let mut prefix = Materialized::default();
            prefix.fold(&stored(&history[..cut])).expect("fold");
            let mut reader = Materialized::default();
            for piece in snapshot(&prefix, Offset(77)) {
                reader.fold(&piece).expect("snapshot folds");
            }
            reader.fold(&stored(&history[cut..])).expect("fold");
            prop_assert_eq!(reader, whole);
        }
    }
}
