//! Reading and writing keys: etcd's KV service (Range, Put, DeleteRange, Compact).

use crate::generated::etcdserverpb::{
    CompactionRequest, CompactionResponse, DeleteRangeRequest, DeleteRangeResponse, PutRequest,
    PutResponse, RangeRequest, RangeResponse,
};
use crate::{Client, Error};

impl Client {
    /// The value of `key` (in `kvs`: empty when there is none), and in `header` the revision
    /// the store was at.
    pub async fn get(&self, key: impl Into<Vec<u8>>) -> Result<RangeResponse, Error> {
        self.range(key.into(), Vec::new()).await
    }

    /// Every key that starts with `prefix`, in key order, and in `header` the revision the
    /// store was at: watch from the next one to follow them without missing a change.
    ///
    /// ```no_run
    /// # async fn example(client: modelmux_etcd::Client) -> Result<(), modelmux_etcd::Error> {
    /// let reply = client.get_prefix("modelmux/").await?;
    /// let revision = reply.header.map_or(0, |h| h.revision);
    /// for kv in &reply.kvs {
    ///     println!("{} at {revision}", String::from_utf8_lossy(&kv.key));
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn get_prefix(&self, prefix: impl Into<Vec<u8>>) -> Result<RangeResponse, Error> {
        let (key, end) = prefix_range(prefix.into());
        self.range(key, end).await
    }

    async fn range(&self, key: Vec<u8>, range_end: Vec<u8>) -> Result<RangeResponse, Error> {
        let request = RangeRequest {
            key,
            range_end,
            ..RangeRequest::default()
        };
        let (kv, request) = (&self.kv, &request);
        self.with_token(
            move || async move { Ok(kv.clone().range(request.clone()).await?.into_inner()) },
        )
        .await
    }

    /// Sets `key` to `value`, on `lease` if given: the key is then deleted when the lease
    /// expires or is revoked (a put on a lease that is gone fails; see
    /// [`Error::is_lease_not_found`]).
    pub async fn put(
        &self,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
        lease: Option<i64>,
    ) -> Result<PutResponse, Error> {
        let request = PutRequest {
            key: key.into(),
            value: value.into(),
            lease: lease.unwrap_or(0),
            ..PutRequest::default()
        };
        let (kv, request) = (&self.kv, &request);
        self.with_token(
            move || async move { Ok(kv.clone().put(request.clone()).await?.into_inner()) },
        )
        .await
    }

    /// Deletes `key` (`deleted` says whether it was there).
    pub async fn delete(&self, key: impl Into<Vec<u8>>) -> Result<DeleteRangeResponse, Error> {
        let request = DeleteRangeRequest {
            key: key.into(),
            ..DeleteRangeRequest::default()
        };
        let (kv, request) = (&self.kv, &request);
        self.with_token(move || async move {
            Ok(kv.clone().delete_range(request.clone()).await?.into_inner())
        })
        .await
    }

    /// Discards the history before `revision`: reads at, and watches from, an older revision
    /// then fail. With `physical`, returns only once the space is freed in the member's
    /// database, rather than as soon as the compaction is agreed.
    pub async fn compact(
        &self,
        revision: i64,
        physical: bool,
    ) -> Result<CompactionResponse, Error> {
        let request = CompactionRequest { revision, physical };
        let (kv, request) = (&self.kv, &request);
        self.with_token(move || async move { Ok(kv.clone().compact(*request).await?.into_inner()) })
            .await
    }
}

/// The key range `[key, end)` holding every key that starts with `prefix`. Its end is the prefix
/// with its last byte below 0xff incremented and what follows dropped; a prefix of only 0xff
/// bytes has no such end, and etcd reads an end of `[0]` as "every key from here on". The empty
/// prefix (every key) is `[0, [0])`: etcd refuses an empty key.
pub(crate) fn prefix_range(prefix: Vec<u8>) -> (Vec<u8>, Vec<u8>) {
    if prefix.is_empty() {
        return (vec![0], vec![0]);
    }
    let end = match prefix.iter().rposition(|&b| b < 0xff) {
        Some(i) => {
            let mut end = prefix[..=i].to_vec();
            end[i] += 1;
            end
        }
        None => vec![0],
    };
    (prefix, end)
}

#[cfg(test)]
mod tests {
    use super::prefix_range;

    #[test]
    fn a_prefix_range_ends_after_its_last_key() {
        let end = |prefix: &[u8]| prefix_range(prefix.to_vec()).1;
        assert_eq!(end(b"mm/"), b"mm0");
        assert_eq!(end(b"a"), b"b");
        assert_eq!(end(b"a\xff"), b"b");
        assert_eq!(end(b"a\xfe\xff\xff"), b"a\xff");
        assert_eq!(end(b"\xff\xff"), [0]);
        assert_eq!(prefix_range(b"mm/".to_vec()).0, b"mm/");
        assert_eq!(prefix_range(Vec::new()), (vec![0], vec![0]));
    }
}
