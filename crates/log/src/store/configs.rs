//! One allocation per distinct stream configuration. A million streams created alike (same
//! content type, no expiry, no retention) hold one [`StreamConfig`] between them instead of a
//! million copies: the configuration and its content type were about 120 bytes of each
//! stream's memory.

use std::collections::HashSet;
use std::sync::Arc;

use oncelog_storage::StreamConfig;

/// The configurations streams hold. A configuration no stream holds any more stays until the
/// next [`Configs::prune`] (before each checkpoint), so the table is bounded by the number of
/// streams plus the configurations of streams removed since the last checkpoint.
#[derive(Default)]
pub(crate) struct Configs(HashSet<Arc<StreamConfig>>);

impl Configs {
    /// Makes `config` the table's allocation of an equal configuration, adding it when new.
    pub fn intern(&mut self, config: &mut Arc<StreamConfig>) {
        match self.0.get(&**config) {
            Some(same) => *config = same.clone(),
            None => {
                self.0.insert(config.clone());
            }
        }
    }

    /// Drops the configurations only the table holds. (A reader's answer that still holds one
    /// keeps it for this round: it goes at a later prune.)
    pub fn prune(&mut self) {
        self.0.retain(|c| Arc::strong_count(c) > 1);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.len()
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
        let (mut a, mut b, mut c) = (config("text/plain", Expiry::Never), config("text/plain", Expiry::Never), config("text/plain", Expiry::Ttl(5)));
        t.intern(&mut a);
        t.intern(&mut b);
        t.intern(&mut c);
        assert!(Arc::ptr_eq(&a, &b), "equal configurations are one allocation");
        assert!(!Arc::ptr_eq(&a, &c), "a different expiry is another configuration");
        assert_eq!((&*b, t.len()), (&StreamConfig { content_type: "text/plain".into(), expiry: Expiry::Never, retention: Default::default(), compaction: false }, 2));
        drop(c);
        t.prune();
        assert_eq!(t.len(), 1, "the configuration no stream holds is dropped");
        drop((a, b));
        t.prune();
        assert_eq!(t.len(), 0);
    }
}
