//! One allocation per distinct stream configuration. A million streams created alike (same
//! content type, no expiry, no retention) hold one [`StreamConfig`] between them instead of a
//! million copies: the configuration and its content type were about 120 bytes of each
//! stream's memory.

use std::collections::HashSet;
use std::sync::Arc;

use oncelog_storage::StreamConfig;

/// The configurations streams hold. A configuration no stream holds any more stays until the
/// table has doubled since its last prune (an insert then prunes first), so streams created and
/// deleted with configurations of their own (a deadline each) cannot grow it: it holds at most
/// about twice the configurations streams hold, plus [`PRUNE_FLOOR`].
#[derive(Default)]
pub(crate) struct Configs {
    table: HashSet<Arc<StreamConfig>>,
    /// The size at which an insert prunes first (0: [`PRUNE_FLOOR`]).
    prune_at: usize,
}

/// Below this many configurations the table is never pruned.
const PRUNE_FLOOR: usize = 1024;

impl Configs {
    /// Makes `config` the table's allocation of an equal configuration, adding it when new.
    pub fn intern(&mut self, config: &mut Arc<StreamConfig>) {
        if let Some(same) = self.table.get(&**config) {
            *config = same.clone();
            return;
        }
        if self.table.len() >= self.prune_at.max(PRUNE_FLOOR) {
            self.prune();
        }
        self.table.insert(config.clone());
    }

    /// Drops the configurations only the table holds. (A reader's answer that still holds one
    /// keeps it for this round: it goes at a later prune.)
    fn prune(&mut self) {
        self.table.retain(|c| Arc::strong_count(c) > 1);
        self.prune_at = self.table.len() * 2;
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.table.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oncelog_protocol::headers::Expiry;

    fn config(ct: &str, expiry: Expiry) -> Arc<StreamConfig> {
        Arc::new(StreamConfig { content_type: ct.into(), expiry, retention: Default::default(), compaction: false })
    }

    #[test]
    fn equal_configurations_share_one_allocation_and_unheld_ones_go() {
        let mut t = Configs::default();
        let (mut a, mut b, mut c) = (
            config("text/plain", Expiry::Never),
            config("text/plain", Expiry::Never),
            config("text/plain", Expiry::Ttl(5)),
        );
        t.intern(&mut a);
        t.intern(&mut b);
        t.intern(&mut c);
        assert!(Arc::ptr_eq(&a, &b), "equal configurations are one allocation");
        assert!(!Arc::ptr_eq(&a, &c), "a different expiry is another configuration");
        assert_eq!(
            (&*b, t.len()),
            (
                &StreamConfig {
                    content_type: "text/plain".into(),
                    expiry: Expiry::Never,
                    retention: Default::default(),
                    compaction: false
                },
                2
            )
        );
        drop(c);
        t.prune();
        assert_eq!(t.len(), 1, "the configuration no stream holds is dropped");
        drop((a, b));
        t.prune();
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn configurations_of_removed_streams_do_not_pile_up() {
        let mut t = Configs::default();
        let mut held = Vec::new();
        for i in 0..100_000u64 {
            // A stream with a deadline of its own, created and removed; one in 100 stays.
            let mut c = config("text/plain", Expiry::At(i as i64));
            t.intern(&mut c);
            if i % 100 == 0 {
                held.push(c);
            }
        }
        assert!(t.len() <= 2 * held.len() + PRUNE_FLOOR, "{} configurations kept for {} held", t.len(), held.len());
        assert!(
            held.iter().all(|c| t.table.get(&**c).is_some_and(|x| Arc::ptr_eq(x, c))),
            "every held configuration stays the table's"
        );
    }
}
