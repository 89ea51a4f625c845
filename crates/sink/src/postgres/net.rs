//! What a batch of State Protocol changes does to a stream's rows, as a few set-based statements.
//!
//! Changes to different entities commute, and of several changes to one entity the last decides;
//! a `reset` clears everything before it. So a batch folds into: whether to clear the stream's
//! rows first, then the entities to delete and the entities to set (each with its last value).
//! Each message is read by [`oncelog_protocol::state::parse`] and applied by
//! [`oncelog_protocol::state::apply`], the parser and the fold rule the server's compaction uses
//! ([`Net`] is one more [`Entities`]); the test below checks that applying this net effect to any
//! state gives what [`oncelog_protocol::state::Materialized`] folds, so the rows a sink writes and
//! the snapshot a compaction writes cannot disagree.

use std::collections::BTreeMap;

use oncelog_protocol::state::{self, Entities, Entity, StateError};

use crate::batch::Message;

/// The net effect of a batch on one stream's entities.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Net<'a> {
    /// A `reset` in the batch: the stream's rows are deleted before the rest applies.
    pub reset: bool,
    /// (type, key) → `Some((value JSON text, offset of the change))` to set, `None` to delete.
    pub entities: BTreeMap<(String, String), Option<(&'a str, u64)>>,
    /// Messages that changed state (sets, deletes, resets; hints do not count).
    pub changes: u64,
    /// The offset of the message being applied.
    at: u64,
}

impl<'a> Entities<'a> for Net<'a> {
    fn set(&mut self, entity: Entity<'a>, value: &'a str) {
        self.entities.insert((entity.type_name, entity.key), Some((value, self.at)));
    }

    fn delete(&mut self, entity: Entity<'a>) {
        self.entities.insert((entity.type_name, entity.key), None);
    }

    /// Everything before is gone: the rows are deleted first, and earlier changes of the batch
    /// no longer matter.
    fn clear(&mut self) {
        self.reset = true;
        self.entities.clear();
    }
}

impl<'a> Net<'a> {
    /// Folds `messages`, in order; the offset of the first message that is not a State Protocol
    /// message, with the reason, otherwise.
    pub fn of(messages: &[Message<'a>]) -> Result<Net<'a>, (u64, StateError)> {
        let mut net = Net::default();
        for m in messages {
            let change = m.change().map_err(|e| (m.offset.0, e))?;
            net.at = m.offset.0;
            if state::apply(&mut net, change) {
                net.changes += 1;
            }
        }
        Ok(net)
    }

    /// Applies the net effect to `rows` (a model of the table: (type, key) → value).
    #[cfg(test)]
    fn apply_to(&self, rows: &mut BTreeMap<(String, String), String>) {
        if self.reset {
            rows.clear();
        }
        for (k, v) in &self.entities {
            match v {
                Some((value, _)) => rows.insert(k.clone(), (*value).to_owned()),
                None => rows.remove(k),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oncelog_protocol::state::Materialized;
    use oncelog_protocol::Offset;
    use proptest::prelude::*;
    use serde_json::value::RawValue;

    fn op() -> impl Strategy<Value = String> {
        let key = "[a-c]";
        let value = prop_oneof![
            Just("1".to_owned()),
            Just("{\"x\":[true,null]}".to_owned()),
            "[a-z]{0,4}".prop_map(|s| format!("\"{s}\""))
        ];
        prop_oneof![
            4 => (prop_oneof![Just("insert"), Just("update"), Just("upsert")], "[tu]", key, value)
                .prop_map(|(op, t, k, v)| format!(r#"{{"type":"{t}","key":"{k}","value":{v},"headers":{{"operation":"{op}"}}}}"#)),
            2 => ("[tu]", key).prop_map(|(t, k)| format!(r#"{{"type":"{t}","key":"{k}","headers":{{"operation":"delete"}}}}"#)),
            1 => Just(r#"{"headers":{"control":"reset"}}"#.to_owned()),
            1 => Just(r#"{"headers":{"control":"snapshot-end"}}"#.to_owned()),
        ]
    }

    fn stored(messages: &[String]) -> Vec<u8> {
        messages.iter().flat_map(|m| m.bytes().chain(std::iter::once(b','))).collect()
    }

    proptest! {
        /// Whatever the cut of a history into batches, the rows the batches' net effects leave
        /// are the state the compaction's fold materialises.
        #[test]
        fn batches_applied_as_net_effects_leave_the_folded_state(
            history in proptest::collection::vec(op(), 0..50),
            cuts in proptest::collection::vec(any::<proptest::sample::Index>(), 0..5),
        ) {
            let raws: Vec<Box<RawValue>> = history.iter().map(|m| RawValue::from_string(m.clone()).expect("JSON")).collect();
            let messages: Vec<Message<'_>> = raws.iter().enumerate().map(|(i, json)| Message { offset: Offset(i as u64), json }).collect();
            let mut bounds: Vec<usize> = cuts.iter().map(|c| c.index(messages.len() + 1)).collect();
            bounds.extend([0, messages.len()]);
            bounds.sort_unstable();
            let mut rows = BTreeMap::new();
            for w in bounds.windows(2) {
                Net::of(&messages[w[0]..w[1]]).expect("state messages").apply_to(&mut rows);
            }
            let mut folded = Materialized::default();
            folded.fold(&stored(&history)).expect("fold");
            let expected: BTreeMap<(String, String), String> =
                folded.entities().map(|((t, k), v)| ((t.to_owned(), k.to_owned()), v.to_owned())).collect();
            prop_assert_eq!(rows, expected);
        }
    }
}
