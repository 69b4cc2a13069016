//! Adapters known by a name their operator chose (vLLM's `/v1/load_lora_adapter` with a
//! `lora_path`): `sql` for `/srv/adapters/sql-v3`. A name is an adapter id like any other
//! (the router places it, the cache holds it, metrics name it); the loader reads it from the
//! source registered for it, which [`AllowedSources`](super::AllowedSources) checked first.
//!
//! One registry is shared by an application's ingress (which registers) and its LLM replicas
//! in the same process (which read it when they load). It lives as long as the process: a
//! name registered on one node is not known to another.

use std::sync::Arc;

/// Names registered at most: each costs a few bytes, and only an admin can add them.
pub const MAX_NAMES: usize = 10_000;

/// Registered adapter names and their sources, in the order they were registered. Cloning
/// shares the registry.
#[derive(Clone, Default)]
pub struct AdapterNames(Arc<parking_lot::RwLock<Vec<(String, String)>>>);

/// The registry is full ([`MAX_NAMES`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{MAX_NAMES} adapter names are registered already: unload one first")]
pub struct TooManyNames;

impl AdapterNames {
    /// The source registered for `name`.
    pub fn get(&self, name: &str) -> Option<String> {
        self.0
            .read()
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, source)| source.clone())
    }

    /// Registers `name` for `source`; returns the source it had before, if any (the name
    /// keeps its place in the order).
    pub fn insert(&self, name: &str, source: &str) -> Result<Option<String>, TooManyNames> {
        let mut names = self.0.write();
        if let Some(entry) = names.iter_mut().find(|(n, _)| n == name) {
            return Ok(Some(std::mem::replace(&mut entry.1, source.to_owned())));
        }
        if names.len() >= MAX_NAMES {
            return Err(TooManyNames);
        }
        names.push((name.to_owned(), source.to_owned()));
        Ok(None)
    }

    /// Unregisters `name`; returns its source.
    pub fn remove(&self, name: &str) -> Option<String> {
        let mut names = self.0.write();
        let i = names.iter().position(|(n, _)| n == name)?;
        Some(names.remove(i).1)
    }

    /// Every name with its source, in registration order.
    pub fn list(&self) -> Vec<(String, String)> {
        self.0.read().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_keep_their_order_and_are_shared_by_clones() {
        let names = AdapterNames::default();
        let other = names.clone();
        assert_eq!(names.insert("sql", "/a/sql-v3"), Ok(None));
        assert_eq!(names.insert("chef", "/a/chef"), Ok(None));
        assert_eq!(other.get("sql").as_deref(), Some("/a/sql-v3"));
        assert_eq!(
            other.insert("sql", "/a/sql-v4"),
            Ok(Some("/a/sql-v3".into()))
        );
        assert_eq!(
            names.list(),
            vec![
                ("sql".to_owned(), "/a/sql-v4".to_owned()),
                ("chef".to_owned(), "/a/chef".to_owned())
            ]
        );
        assert_eq!(names.remove("sql").as_deref(), Some("/a/sql-v4"));
        assert_eq!(names.get("sql"), None);
        assert_eq!(names.remove("sql"), None);
    }

    #[test]
    fn the_registry_is_bounded() {
        let names = AdapterNames::default();
        for i in 0..MAX_NAMES {
            names.insert(&format!("a{i}"), "/s").unwrap();
        }
        assert_eq!(names.insert("one-more", "/s"), Err(TooManyNames));
        // Replacing a name's source still works when full.
        assert!(names.insert("a0", "/t").is_ok());
    }
}
