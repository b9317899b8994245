//! Lists and their versions. An edit is one transaction: the conditional
//! update of the list's row (`version = If-Match`, or the insert of a new
//! list, refused past the deployment's limit) and the insert of the new
//! version, which is the edit's audit row (who, why, when, the digest of
//! the entries). A mismatch writes nothing. Every version keeps its
//! canonical entries in full (JSON, zstd), so any two can be compared.

use super::{StoreError, StoreResult};
use crate::clock::Millis;
use crate::domain::lists::{Entry, ListKind};
use serde::Serialize;

/// One version of a list, without its entries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct ListVersionRecord {
    pub name: String,
    pub kind: ListKind,
    pub version: i64,
    /// sha256 of the canonical entries (see `host/src/domain/lists.rs`).
    pub digest: String,
    pub entry_count: i64,
    /// The moderator token's name that made this version.
    pub actor_name: String,
    pub reason: String,
    pub created_at: Millis,
}

/// One version of a list with its entries, in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListContent {
    pub record: ListVersionRecord,
    pub entries: Vec<Entry>,
}

/// A new version to write.
#[derive(Debug, Clone)]
pub struct NewListVersion<'a> {
    pub name: &'a str,
    pub kind: ListKind,
    /// The version the editor saw; `None` creates the list (refused if it
    /// exists).
    pub if_match: Option<i64>,
    /// Canonical entries and their digest.
    pub entries: &'a [Entry],
    pub digest: &'a str,
    pub actor_name: &'a str,
    pub reason: &'a str,
    /// Creating a list is refused when this many exist.
    pub max_lists: usize,
    pub now: Millis,
}

/// What an edit did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListWrite {
    /// The list is now at `version`.
    Written { version: i64 },
    /// The list is at another version than `If-Match` (`None`: it does not
    /// exist), or exists when creating it: nothing written.
    VersionMismatch { current: Option<i64> },
    /// The list holds another kind: nothing written.
    KindMismatch { current: ListKind },
    /// Creating it would pass `max_lists`: nothing written.
    TooManyLists,
}

/// Lists, their versions and edits.
#[async_trait::async_trait]
pub trait Lists: Send + Sync {
    /// Every list at its current version, by name.
    async fn lists(&self) -> StoreResult<Vec<ListVersionRecord>>;

    /// `(name, version)` of every list: the cheap read every process polls.
    async fn list_versions_now(&self) -> StoreResult<Vec<(String, i64)>>;

    /// A list at `version` (its current one when `None`), with entries.
    async fn list_content(&self, name: &str, version: Option<i64>) -> StoreResult<Option<ListContent>>;

    /// A list's versions, newest first, older than `before` if given.
    async fn list_history(&self, name: &str, before: Option<i64>, limit: i64) -> StoreResult<Vec<ListVersionRecord>>;

    /// Writes a new version if the list is still at `if_match`.
    async fn write_list(&self, edit: &NewListVersion<'_>) -> StoreResult<ListWrite>;
}

/// The stored form of canonical entries: JSON, zstd-compressed.
pub(crate) fn pack_entries(entries: &[Entry]) -> Vec<u8> {
    let json = serde_json::to_vec(entries).expect("entries serialize");
    zstd::stream::encode_all(json.as_slice(), 3).expect("compressing to memory cannot fail")
}

pub(crate) fn unpack_entries(body: &[u8]) -> StoreResult<Vec<Entry>> {
    let json = zstd::stream::decode_all(body).map_err(|e| StoreError::Corrupt(format!("list entries: {e}")))?;
    serde_json::from_slice(&json).map_err(|e| StoreError::Corrupt(format!("list entries: {e}")))
}

/// Instantiates [`Lists`] for one backend.
macro_rules! impl_lists {
    ($store:ty, $db:ty, $row:ty) => {
        const _: () = {
            use $crate::domain::lists::ListKind;
            use $crate::store::dialect::{Dialect, retry_conflicts};
            use $crate::store::lists::{pack_entries, unpack_entries};
            use $crate::store::rows;
            use $crate::store::*;

            const RECORD: &str = "SELECT l.name, l.kind, v.version, v.digest, v.entry_count, v.actor_name, v.reason, \
                 v.created_at FROM lists l JOIN list_versions v ON v.list = l.name";

            type RecordRow = (String, String, i64, String, i64, String, String, i64);

            fn record(r: RecordRow) -> StoreResult<ListVersionRecord> {
                let (name, kind, version, digest, entry_count, actor_name, reason, created_at) = r;
                Ok(ListVersionRecord {
                    name,
                    kind: rows::parse(&kind)?,
                    version,
                    digest,
                    entry_count,
                    actor_name,
                    reason,
                    created_at,
                })
            }

            /// Creates the list at version 1, unless it exists or the
            /// deployment has `max_lists` already.
            async fn create(tx: &mut txn::Tx<'_>, e: &NewListVersion<'_>) -> StoreResult<Result<i64, ListWrite>> {
                let created: Option<i64> = sqlx::query_scalar(
                    "INSERT INTO lists (name, kind, version, created_at, updated_at) \
                     SELECT $1, $2, 1, $3, $3 WHERE (SELECT COUNT(*) FROM lists) < $4 \
                     ON CONFLICT (name) DO NOTHING RETURNING version",
                )
                .bind(e.name)
                .bind(e.kind.as_str())
                .bind(e.now)
                .bind(e.max_lists as i64)
                .fetch_optional(&mut **tx)
                .await?;
                if let Some(version) = created {
                    return Ok(Ok(version));
                }
                Ok(Err(match current(tx, e.name).await? {
                    Some((version, _)) => ListWrite::VersionMismatch { current: Some(version) },
                    None => ListWrite::TooManyLists,
                }))
            }

            /// Moves the list from `if_match` to the next version.
            async fn advance(tx: &mut txn::Tx<'_>, e: &NewListVersion<'_>, if_match: i64) -> StoreResult<Result<i64, ListWrite>> {
                let advanced: Option<i64> = sqlx::query_scalar(
                    "UPDATE lists SET version = version + 1, updated_at = $3 \
                     WHERE name = $1 AND version = $2 AND kind = $4 RETURNING version",
                )
                .bind(e.name)
                .bind(if_match)
                .bind(e.now)
                .bind(e.kind.as_str())
                .fetch_optional(&mut **tx)
                .await?;
                if let Some(version) = advanced {
                    return Ok(Ok(version));
                }
                Ok(Err(match current(tx, e.name).await? {
                    Some((_, kind)) if kind != e.kind => ListWrite::KindMismatch { current: kind },
                    Some((version, _)) => ListWrite::VersionMismatch { current: Some(version) },
                    None => ListWrite::VersionMismatch { current: None },
                }))
            }

            async fn current(tx: &mut txn::Tx<'_>, name: &str) -> StoreResult<Option<(i64, ListKind)>> {
                let row: Option<(i64, String)> = sqlx::query_as("SELECT version, kind FROM lists WHERE name = $1")
                    .bind(name)
                    .fetch_optional(&mut **tx)
                    .await?;
                row.map(|(v, k)| Ok((v, rows::parse(&k)?))).transpose()
            }

            async fn insert_version(tx: &mut txn::Tx<'_>, e: &NewListVersion<'_>, version: i64) -> StoreResult<()> {
                sqlx::query(
                    "INSERT INTO list_versions (list, version, digest, entry_count, entries, actor_name, reason, created_at) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                )
                .bind(e.name)
                .bind(version)
                .bind(e.digest)
                .bind(e.entries.len() as i64)
                .bind(pack_entries(e.entries))
                .bind(e.actor_name)
                .bind(e.reason)
                .bind(e.now)
                .execute(&mut **tx)
                .await?;
                Ok(())
            }

            #[async_trait::async_trait]
            impl Lists for $store {
                async fn lists(&self) -> StoreResult<Vec<ListVersionRecord>> {
                    let sql = format!("{RECORD} AND v.version = l.version ORDER BY l.name{}", <$store as Dialect>::BYTE_ORDER);
                    sqlx::query_as::<_, RecordRow>(&sql)
                        .fetch_all(self.read_pool())
                        .await?
                        .into_iter()
                        .map(record)
                        .collect()
                }

                async fn list_versions_now(&self) -> StoreResult<Vec<(String, i64)>> {
                    Ok(sqlx::query_as("SELECT name, version FROM lists").fetch_all(self.read_pool()).await?)
                }

                async fn list_content(&self, name: &str, version: Option<i64>) -> StoreResult<Option<ListContent>> {
                    let sql = format!(
                        "SELECT l.name, l.kind, v.version, v.digest, v.entry_count, v.actor_name, v.reason, \
                         v.created_at, v.entries FROM lists l JOIN list_versions v ON v.list = l.name \
                         WHERE l.name = $1 AND v.version = {}",
                        if version.is_some() { "$2" } else { "l.version" }
                    );
                    let mut q = sqlx::query_as::<_, (String, String, i64, String, i64, String, String, i64, Vec<u8>)>(&sql).bind(name);
                    if let Some(v) = version {
                        q = q.bind(v);
                    }
                    let Some((n, k, v, d, c, a, r, t, body)) = q.fetch_optional(self.read_pool()).await? else {
                        return Ok(None);
                    };
                    Ok(Some(ListContent {
                        record: record((n, k, v, d, c, a, r, t))?,
                        entries: unpack_entries(&body)?,
                    }))
                }

                async fn list_history(&self, name: &str, before: Option<i64>, limit: i64) -> StoreResult<Vec<ListVersionRecord>> {
                    let sql = format!("{RECORD} WHERE l.name = $1 AND v.version < $2 ORDER BY v.version DESC LIMIT $3");
                    sqlx::query_as::<_, RecordRow>(&sql)
                        .bind(name)
                        .bind(before.unwrap_or(i64::MAX))
                        .bind(limit)
                        .fetch_all(self.read_pool())
                        .await?
                        .into_iter()
                        .map(record)
                        .collect()
                }

                async fn write_list(&self, e: &NewListVersion<'_>) -> StoreResult<ListWrite> {
                    retry_conflicts!(async {
                        let mut tx = self.begin_write().await?;
                        let version = match e.if_match {
                            None => create(&mut tx, e).await?,
                            Some(if_match) => advance(&mut tx, e, if_match).await?,
                        };
                        let version = match version {
                            Ok(version) => version,
                            Err(refused) => {
                                tx.rollback().await?;
                                return Ok(refused);
                            }
                        };
                        insert_version(&mut tx, e, version).await?;
                        tx.commit().await?;
                        Ok(ListWrite::Written { version })
                    })
                }
            }
        };
    };
}
pub(super) use impl_lists;
