//! Streams as this node last saw them ([`oncelog_storage::Engine::last_seen`]): what a write is
//! framed for (the incarnation's id and configuration, fixed for its life) without a `head`
//! round trip before every append. Never trusted for anything else: the append names the
//! incarnation and is judged under the stream's row lock, so a stale entry costs one refused
//! attempt and a fresh `head`, never a wrong answer.

use std::collections::HashMap;
use std::sync::Mutex;

use oncelog_storage::StreamInfo;

/// Most paths kept; past it the map starts again (an entry is one `head` away).
const MAX_ENTRIES: usize = 16_384;

#[derive(Default)]
pub(crate) struct Seen(Mutex<HashMap<String, StreamInfo>>);

impl Seen {
    pub fn get(&self, path: &str) -> Option<StreamInfo> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).get(path).cloned()
    }

    pub fn remember(&self, path: &str, info: &StreamInfo) {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match map.get(path) {
            // Only the id and the configuration are used, and they are fixed for an
            // incarnation: a `head` of every read need not copy them again.
            Some(known) if known.id == info.id => {}
            known => {
                if known.is_none() && map.len() >= MAX_ENTRIES {
                    map.clear();
                }
                map.insert(path.to_owned(), info.clone());
            }
        }
    }

    /// The stream is gone or was replaced.
    pub fn forget(&self, path: &str) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).remove(path);
    }

    /// A write to `path` was judged under its row lock: a refusal that says the stream is gone
    /// or another incarnation drops what was seen (the next request asks `head`).
    pub fn judged(&self, path: &str, refusal: Option<&oncelog_storage::AppendError>) {
        use oncelog_storage::AppendError::{Gone, NotFound, StreamChanged};
        if matches!(refusal, Some(NotFound | Gone | StreamChanged)) {
            self.forget(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(id: u64) -> StreamInfo {
        let config = oncelog_storage::StreamConfig {
            content_type: "text/plain".into(),
            expiry: oncelog_protocol::headers::Expiry::Never,
            retention: Default::default(),
            compaction: false,
        };
        StreamInfo {
            id,
            config: config.into(),
            tail: oncelog_protocol::Offset(0),
            closed: false,
            earliest: oncelog_protocol::Offset(0),
        }
    }

    #[test]
    fn remembers_replaces_forgets_and_stays_bounded() {
        let seen = Seen::default();
        assert!(seen.get("a").is_none());
        seen.remember("a", &info(1));
        seen.remember("a", &info(2));
        assert_eq!(seen.get("a").map(|i| i.id), Some(2));
        seen.judged("a", Some(&oncelog_storage::AppendError::Empty));
        assert_eq!(seen.get("a").map(|i| i.id), Some(2), "a refusal about the request keeps it");
        seen.judged("a", Some(&oncelog_storage::AppendError::StreamChanged));
        assert!(seen.get("a").is_none());
        seen.remember("a", &info(3));
        seen.forget("a");
        assert!(seen.get("a").is_none());
        for i in 0..(MAX_ENTRIES as u64 + 10) {
            seen.remember(&format!("p{i}"), &info(i));
        }
        assert!(seen.0.lock().unwrap().len() <= MAX_ENTRIES);
    }
}
