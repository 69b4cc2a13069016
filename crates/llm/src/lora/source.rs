//! Per-request adapter sources (LoRAX's `adapter_source`): a request may name an adapter by
//! where it lives (`s3://bucket/team-a/pirate`, `/srv/adapters/pirate`, `file:///...`,
//! `https://host/adapters/pirate`) rather than by its id in the configured repository, but only
//! below one of the prefixes the configuration allows (`lora_config.allowed_sources`).
//!
//! This module owns that rule and nothing else: it parses the allowed prefixes, matches a
//! source against them by whole path segments (scheme and bucket or host compared exactly),
//! and refuses whatever is not plainly below one of them (`.` and `..` segments, empty
//! segments, percent-encoding, queries, fragments, backslashes, user names in hosts). It never
//! reads anything: a refusal comes before any byte is fetched. Loading an adapter it admitted
//! goes through the repository opened at the entry it lies below, whose own checks then keep
//! every key inside that entry.
//!
//! Allowing a source means trusting whoever can write there: an adapter is a set of weights,
//! not code, but it changes every answer generated with it.

use modelmux_cache::ModelId;
use modelmux_store::ModelRepository;

use crate::error::{LlmError, Result};

use super::AdapterNames;

/// Schemes of the store layer that a source may have; a plain absolute path is `file`.
const SCHEMES: [&str; 5] = ["file", "s3", "s3a", "http", "https"];

/// A source or an entry, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Location {
    /// `file` (a plain absolute path or `file:///`), `s3`, `s3a`, `http` or `https`.
    scheme: &'static str,
    /// The bucket, or the host with its port; empty for local files.
    authority: String,
    /// The path's segments: none is empty, `.` or `..`.
    segments: Vec<String>,
}

impl Location {
    /// Whether `other` lies strictly below this one: same scheme and bucket or host, and this
    /// one's segments are the first of `other`'s.
    fn contains(&self, other: &Location) -> bool {
        self.scheme == other.scheme
            && self.authority == other.authority
            && other.segments.len() > self.segments.len()
            && other.segments.starts_with(&self.segments)
    }
}

/// Why `text` is not a plain path or URL of the store layer, if it is not.
fn parse(text: &str) -> Result<Location, String> {
    if let Some((i, _)) = text.char_indices().find(|(_, c)| c.is_control()) {
        return Err(format!("it has a control character at byte {i}"));
    }
    let tricks = [
        ('%', "percent-encoding ('%')"),
        ('?', "a query ('?')"),
        ('#', "a fragment ('#')"),
        ('\\', "a backslash"),
    ];
    if let Some((_, what)) = tricks.iter().find(|(c, _)| text.contains(*c)) {
        return Err(format!("it has {what}"));
    }
    let (scheme, authority, path) = match text.split_once("://") {
        Some(("file", path)) => ("file", "", path),
        Some((scheme, rest)) => {
            let scheme = SCHEMES.iter().find(|s| **s == scheme).ok_or_else(|| {
                format!(
                    "'{scheme}://' is not a scheme of the store (an absolute path, file://, \
                         s3://, s3a://, http:// or https://)"
                )
            })?;
            let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
            check_authority(scheme, authority)?;
            (*scheme, authority, path)
        }
        None if text.starts_with('/') => ("file", "", text),
        None => {
            return Err(
                "it is neither an absolute path nor a URL (file://, s3://, http(s)://)".into(),
            );
        }
    };
    if scheme == "file" && !path.starts_with('/') {
        return Err("a local source must be an absolute path (file:///dir/...)".into());
    }
    let segments = match path.strip_prefix('/') {
        None => Vec::new(),
        Some(path) => path
            .split('/')
            .map(|segment| match segment {
                "" => Err("it has an empty path segment ('//' or a trailing '/')".to_owned()),
                "." | ".." => Err(format!("it has a '{segment}' path segment")),
                _ => Ok(segment.to_owned()),
            })
            .collect::<Result<_, _>>()?,
    };
    Ok(Location {
        scheme,
        authority: authority.to_owned(),
        segments,
    })
}

/// A bucket is letters, digits, `.`, `-` and `_`, starting and ending with a letter or digit;
/// a host the same with `:` (a port) and `[]` (IPv6), and never a user name (`user@host`).
fn check_authority(scheme: &str, authority: &str) -> Result<(), String> {
    let s3 = scheme.starts_with("s3");
    let allowed = |c: char| {
        c.is_ascii_alphanumeric()
            || matches!(c, '.' | '-' | '_')
            || (!s3 && matches!(c, ':' | '[' | ']'))
    };
    let fine = authority.chars().all(allowed)
        && authority.starts_with(|c: char| c.is_ascii_alphanumeric() || (!s3 && c == '['))
        && authority.ends_with(|c: char| c.is_ascii_alphanumeric() || (!s3 && c == ']'));
    if fine {
        Ok(())
    } else if s3 {
        Err(format!("'{authority}' is not a bucket name"))
    } else {
        Err(format!(
            "'{authority}' is not a host (a user name, an empty host and other characters are refused)"
        ))
    }
}

/// An entry of [`AllowedSources`] that is not a plain path or URL of the store.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{entry}' is not an allowed adapter source: {reason}")]
pub struct InvalidSourceEntry {
    /// Its position in the list.
    pub index: usize,
    /// The entry as configured.
    pub entry: String,
    /// What is wrong with it.
    pub reason: String,
}

/// `lora_config.allowed_sources`, parsed: the prefixes (directories, buckets with or without a
/// key prefix, URLs) below which a request may name an adapter by its source. Empty, the
/// default, refuses every source: adapters then come only by id from the repository.
///
/// ```
/// use modelmux_llm::AllowedSources;
///
/// let allowed = AllowedSources::parse(&["s3://adapters/team-a", "/srv/adapters"]).unwrap();
/// assert_eq!(allowed.check("s3://adapters/team-a/pirate").unwrap().relative, "pirate");
/// assert!(allowed.check("s3://adapters/team-ab/pirate").is_err());
/// assert!(allowed.check("/srv/adapters/../etc/pirate").is_err());
/// ```
#[derive(Clone, Debug, Default)]
pub struct AllowedSources {
    /// Each entry as configured (less trailing slashes), and parsed.
    entries: Vec<(String, Location)>,
}

/// Where an allowed source lies: the entry it is below, and its path below that entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceMatch {
    /// The entry's position in the list.
    pub entry: usize,
    /// The source's path below the entry (`team/pirate`): the adapter's id in a repository
    /// opened at the entry.
    pub relative: String,
}

impl AllowedSources {
    /// Parses `entries`: absolute paths, `file:///`, `s3://bucket[/prefix]`,
    /// `s3a://bucket[/prefix]`, `http(s)://host[/path]`. Trailing slashes are ignored; the
    /// filesystem's root is refused (it would allow every file the server can read).
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<Self, InvalidSourceEntry> {
        let entries = entries
            .iter()
            .enumerate()
            .map(|(index, entry)| {
                let entry = entry.as_ref();
                let invalid = |reason: String| InvalidSourceEntry {
                    index,
                    entry: entry.to_owned(),
                    reason,
                };
                let trimmed = entry.trim_end_matches('/');
                // `/` and `file:///` are all the slashes they have.
                if !entry.is_empty() && matches!(trimmed, "" | "file:") {
                    return Err(invalid(
                        "the filesystem's root would allow every file the server can read: \
                         name the directory the adapters are in"
                            .into(),
                    ));
                }
                Ok((trimmed.to_owned(), parse(trimmed).map_err(invalid)?))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { entries })
    }

    /// Whether `adapter` names a source rather than an id in the repository: an absolute path
    /// or a URL. (Ids in a repository are relative paths, and `://` is never one: it has an
    /// empty segment.)
    pub fn is_source(adapter: &str) -> bool {
        adapter.starts_with('/') || adapter.contains("://")
    }

    /// The entries as configured (less trailing slashes).
    pub fn entries(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(text, _)| text.as_str())
    }

    /// Whether there is no entry (every source is refused).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Where `source` lies below an entry, or [`LlmError::SourceNotAllowed`] saying why it
    /// does not: it is decided on the text alone, before anything is read.
    pub fn check(&self, source: &str) -> Result<SourceMatch> {
        let refused = |reason: String| LlmError::SourceNotAllowed {
            adapter: source.to_owned(),
            reason,
        };
        if self.entries.is_empty() {
            return Err(refused(
                "the list is empty, so adapters load only by name from dynamic_lora_loading_path"
                    .into(),
            ));
        }
        let location = parse(source).map_err(refused)?;
        let found = self
            .entries
            .iter()
            .enumerate()
            .find(|(_, (_, entry))| entry.contains(&location));
        match found {
            Some((entry, (_, prefix))) => Ok(SourceMatch {
                entry,
                relative: location.segments[prefix.segments.len()..].join("/"),
            }),
            None if self.entries.iter().any(|(_, entry)| *entry == location) => Err(refused(
                "it is one of the entries itself: an adapter is a directory below an entry".into(),
            )),
            None => {
                let list: Vec<String> = self.entries().map(|e| format!("'{e}'")).collect();
                Err(refused(format!(
                    "it is not below any of its entries [{}]",
                    list.join(", ")
                )))
            }
        }
    }
}

/// [`AllowedSources`] with a repository opened at each entry: where a replica reads the
/// adapters requests name by source.
#[derive(Clone, Default)]
pub struct AdapterSources {
    allowed: AllowedSources,
    /// One per entry, in order.
    repositories: Vec<ModelRepository>,
    /// Adapters registered under a name, each read from its source.
    names: AdapterNames,
}

impl AdapterSources {
    /// `allowed`, with `open(index, entry)`'s repository for each entry.
    pub fn open<E>(
        allowed: AllowedSources,
        mut open: impl FnMut(usize, &str) -> Result<ModelRepository, E>,
    ) -> Result<Self, E> {
        let repositories = allowed
            .entries()
            .enumerate()
            .map(|(i, entry)| open(i, entry))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            allowed,
            repositories,
            names: AdapterNames::default(),
        })
    }

    /// Reads the adapters registered in `names` from their sources.
    pub fn with_names(mut self, names: AdapterNames) -> Self {
        self.names = names;
        self
    }

    /// The adapters registered under a name.
    pub fn names(&self) -> &AdapterNames {
        &self.names
    }

    /// The rule.
    pub fn allowed(&self) -> &AllowedSources {
        &self.allowed
    }

    /// The repository adapter source `source` is read from, and the adapter's id there;
    /// [`LlmError::SourceNotAllowed`] when the rule refuses it.
    pub fn resolve(&self, source: &str) -> Result<(&ModelRepository, ModelId)> {
        let found = self.allowed.check(source)?;
        let id = ModelId::new(&found.relative)
            .map_err(|e| LlmError::InvalidRequest(format!("adapter source '{source}': {e}")))?;
        Ok((&self.repositories[found.entry], id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowed() -> AllowedSources {
        AllowedSources::parse(&[
            "s3://bucket/team-a/",
            "s3://whole-bucket",
            "/srv/adapters",
            "https://host.example:8443/models",
        ])
        .unwrap()
    }

    #[test]
    fn sources_below_an_entry_are_allowed_with_their_path_below_it() {
        let allowed = allowed();
        let cases = [
            ("s3://bucket/team-a/pirate", 0, "pirate"),
            ("s3://bucket/team-a/x/pirate", 0, "x/pirate"),
            ("s3://whole-bucket/anything/pirate", 1, "anything/pirate"),
            ("/srv/adapters/pirate", 2, "pirate"),
            ("file:///srv/adapters/nested/pirate", 2, "nested/pirate"),
            ("https://host.example:8443/models/pirate", 3, "pirate"),
            // A name that merely contains dots is a name.
            ("s3://bucket/team-a/v1..2/...", 0, "v1..2/..."),
        ];
        for (source, entry, relative) in cases {
            let found = allowed
                .check(source)
                .unwrap_or_else(|e| panic!("{source}: {e}"));
            assert_eq!(found.entry, entry, "{source}");
            assert_eq!(found.relative, relative, "{source}");
        }
    }

    #[test]
    fn what_is_not_plainly_below_an_entry_is_refused_naming_the_rule() {
        let allowed = allowed();
        let cases = [
            // A raw string prefix is not a path prefix.
            ("s3://bucket/team-ab/pirate", "not below"),
            ("s3://bucket/team-a-evil/pirate", "not below"),
            ("/srv/adapters-evil/pirate", "not below"),
            // Scheme and bucket or host compare exactly.
            ("s3://other/team-a/pirate", "not below"),
            ("s3a://bucket/team-a/pirate", "not below"),
            ("s3://bucket.evil/team-a/pirate", "not below"),
            ("s3://BUCKET/team-a/pirate", "not below"),
            ("http://host.example:8443/models/pirate", "not below"),
            ("https://host.example/models/pirate", "not below"),
            ("https://host.example:8444/models/pirate", "not below"),
            (
                "https://evil.example/host.example:8443/models/pirate",
                "not below",
            ),
            // Ways out of an entry.
            ("s3://bucket/team-a/../team-b/pirate", "'..'"),
            ("s3://bucket/team-a/pirate/..", "'..'"),
            ("/srv/adapters/../../etc/pirate", "'..'"),
            ("file:///srv/adapters/./../x", "'.'"),
            ("s3://bucket/team-a/%2e%2e/team-b/pirate", "percent"),
            ("s3://bucket/team-a%2F..%2Fteam-b/pirate", "percent"),
            ("s3://bucket/team-a/pirate?versionId=1", "query"),
            ("https://host.example:8443/models/p?x=../../a", "query"),
            ("s3://bucket/team-a/pirate#x", "fragment"),
            ("/srv/adapters\\..\\etc", "backslash"),
            ("s3://bucket/team-a//pirate", "empty path segment"),
            ("s3://bucket/team-a/pirate/", "empty path segment"),
            ("/srv/adapters/pi\nrate", "control character"),
            ("https://user@host.example:8443/models/pirate", "not a host"),
            ("s3://bucket@evil/team-a/pirate", "not a bucket"),
            ("s3:///team-a/pirate", "not a bucket"),
            // An entry is a directory of adapters, not one.
            ("s3://bucket/team-a", "entries itself"),
            ("/srv/adapters", "entries itself"),
            // Not a source the store reads.
            ("ftp://bucket/team-a/pirate", "not a scheme"),
            ("file://host/srv/adapters/pirate", "absolute path"),
        ];
        for (source, why) in cases {
            let Err(e) = allowed.check(source) else {
                panic!("{source} was allowed");
            };
            assert!(
                matches!(e, LlmError::SourceNotAllowed { .. }),
                "{source}: {e:?}"
            );
            let message = e.to_string();
            assert!(message.contains("lora_config.allowed_sources"), "{message}");
            assert!(
                message.contains(why),
                "{source}: {message} should say {why}"
            );
        }
    }

    #[test]
    fn an_empty_list_refuses_every_source() {
        let none = AllowedSources::default();
        let e = none.check("s3://bucket/team-a/pirate").unwrap_err();
        assert!(e.to_string().contains("empty"), "{e}");
        assert_eq!(e.kind(), crate::ErrorKind::Forbidden);
    }

    #[test]
    fn bad_entries_are_refused_with_their_index() {
        let cases = [
            ("ftp://host/x", "not a scheme"),
            ("adapters/team-a", "neither an absolute path"),
            ("", "neither an absolute path"),
            ("/", "root"),
            ("file:///", "root"),
            ("s3:///prefix", "not a bucket"),
            ("s3://bucket/a/../b", "'..'"),
            ("https://host/models?sig=1", "query"),
            ("https://user:pw@host/models", "not a host"),
            ("s3://bucket/a//b", "empty path segment"),
        ];
        for (entry, why) in cases {
            let Err(e) = AllowedSources::parse(&["/srv/fine", entry]) else {
                panic!("{entry:?} was accepted");
            };
            assert_eq!(e.index, 1, "{entry:?}");
            assert!(e.to_string().contains(why), "{entry:?}: {e}");
        }
    }

    #[test]
    fn sources_are_told_from_repository_ids() {
        for source in ["/srv/a/x", "s3://b/x", "file:///a/x", "https://h/x"] {
            assert!(AllowedSources::is_source(source), "{source}");
        }
        for id in ["pirate", "org/pirate", "a:b", "s3:/b/x"] {
            assert!(!AllowedSources::is_source(id), "{id}");
        }
        // No source is an id a repository takes: the two never meet.
        for id in ["s3://b/x", "/abs"] {
            assert!(
                ModelId::new(id).unwrap().as_relative_path().is_err(),
                "{id}"
            );
        }
    }
}
