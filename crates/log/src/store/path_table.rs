//! Streams found by path, in a hash table of one pointer per slot: each entry already holds its
//! path (the readers' [`StreamView`](super::StreamView) entry has it), so the table keeps no key of its
//! own. A `HashMap<Arc<str>, _>` slot was 24 bytes; with the table's headroom, two such maps
//! cost a stream of a million about 100 bytes, this about 40.

use std::hash::BuildHasher;
use std::sync::Arc;

use hashbrown::hash_table::{Entry, HashTable};

/// An entry of a [`PathTable`]: it knows its own path, which never changes while it is listed.
pub(crate) trait Named {
    fn path(&self) -> &Arc<str>;
}

/// Entries by their paths, each path at most once.
pub(crate) struct PathTable<T> {
    table: HashTable<T>,
    /// Keyed by a random seed, as std's `HashMap` is: paths come from clients.
    hasher: std::collections::hash_map::RandomState,
}

impl<T> Default for PathTable<T> {
    fn default() -> Self {
        PathTable { table: HashTable::new(), hasher: Default::default() }
    }
}

impl<T: Named> PathTable<T> {
    pub fn get(&self, path: &str) -> Option<&T> {
        self.table.find(self.hasher.hash_one(path), |e| &**e.path() == path)
    }

    pub fn get_mut(&mut self, path: &str) -> Option<&mut T> {
        self.table.find_mut(self.hasher.hash_one(path), |e| &**e.path() == path)
    }

    /// Lists `e` at its path; returns the entry it replaced there.
    pub fn insert(&mut self, e: T) -> Option<T> {
        let hasher = &self.hasher;
        let hash = hasher.hash_one(&**e.path());
        match self.table.entry(hash, |x| x.path() == e.path(), |x| hasher.hash_one(&**x.path())) {
            Entry::Occupied(mut o) => Some(std::mem::replace(o.get_mut(), e)),
            Entry::Vacant(v) => {
                v.insert(e);
                None
            }
        }
    }

    pub fn remove(&mut self, path: &str) -> Option<T> {
        let hash = self.hasher.hash_one(path);
        self.table.find_entry(hash, |e| &**e.path() == path).ok().map(|o| o.remove().0)
    }

    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Every entry with its path, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&Arc<str>, &T)> {
        self.table.iter().map(|e| (e.path(), e))
    }

    pub fn values(&self) -> hashbrown::hash_table::Iter<'_, T> {
        self.table.iter()
    }

    pub fn values_mut(&mut self) -> hashbrown::hash_table::IterMut<'_, T> {
        self.table.iter_mut()
    }
}

impl<T: Named> FromIterator<T> for PathTable<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        let mut t = PathTable::default();
        for e in iter {
            t.insert(e);
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct E(Arc<str>, u32);

    impl Named for E {
        fn path(&self) -> &Arc<str> {
            &self.0
        }
    }

    fn e(path: &str, v: u32) -> E {
        E(path.into(), v)
    }

    #[test]
    fn entries_are_found_replaced_and_removed_by_path() {
        let mut t: PathTable<E> = (0..1000).map(|i| e(&format!("/s/{i}"), i)).collect();
        assert_eq!(t.len(), 1000);
        assert_eq!(t.get("/s/417").map(|x| x.1), Some(417));
        assert!(t.get("/s/1000").is_none() && t.get("/s/41").is_some_and(|x| x.1 == 41));
        assert_eq!(t.insert(e("/s/5", 99)).map(|x| x.1), Some(5), "a second entry at a path replaces the first");
        assert_eq!((t.len(), t.get("/s/5").map(|x| x.1)), (1000, Some(99)));
        if let Some(x) = t.get_mut("/s/6") {
            x.1 = 7;
        }
        assert_eq!(t.remove("/s/6").map(|x| x.1), Some(7));
        assert!(t.remove("/s/6").is_none() && t.get("/s/6").is_none());
        let mut seen: Vec<u32> =
            t.iter().filter(|(p, x)| p.ends_with(&format!("/{}", x.1)) || x.1 == 99).map(|(_, x)| x.1).collect();
        seen.sort_unstable();
        assert_eq!(seen.len(), 999, "every entry is listed under its own path");
    }
}
