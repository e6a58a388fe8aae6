//! `sandbox_quotas` for the operator's `sandboxd quota` commands (the
//! controller reads an owner's limits through [`Store::owner_quota`]).
//!
//! [`Store::owner_quota`]: crate::ports::store::Store::owner_quota

use super::{query, PgStore};
use crate::domain::admission::Quota;
use crate::ports::StoreError;
use sqlx::Row;

/// What `sandboxd quota set` does to one limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setting {
    /// Leave it as the owner's row has it (unlimited for a new row).
    Keep,
    /// No limit (NULL).
    Unlimited,
    /// This value.
    To(u64),
}

impl Setting {
    fn apply(self, current: Option<u64>) -> Option<u64> {
        match self {
            Setting::Keep => current,
            Setting::Unlimited => None,
            Setting::To(v) => Some(v),
        }
    }
}

/// What `sandboxd quota set` does to each of an owner's limits.
#[derive(Debug, Clone, Copy)]
pub struct QuotaSettings {
    /// Sandboxes it may hold.
    pub sandboxes: Setting,
    /// The sum of its sandboxes' memory caps.
    pub memory: Setting,
    /// Seeds it may store.
    pub seeds: Setting,
    /// The bytes of its seeds together.
    pub seed_bytes: Setting,
}

/// An owner's limits (`None`: unlimited).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaLimits {
    /// Sandboxes and memory: what admission counts.
    pub admission: Quota,
    /// Seeds it may store.
    pub seeds: Option<u64>,
    /// The bytes of its seeds together.
    pub seed_bytes: Option<u64>,
}

/// One owner's limits and use, as the state database shows them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct QuotaLine {
    /// The owner (`*`: the default row).
    pub owner: String,
    /// Whose row applies: the owner's own, `*` (the default) or none
    /// (unlimited).
    pub source: Option<String>,
    /// Sandboxes the owner may hold (`None`: unlimited).
    pub max_sandboxes: Option<u64>,
    /// Memory the owner's sandboxes may add up to (`None`: unlimited).
    pub max_memory_bytes: Option<u64>,
    /// Sandboxes whose row is wanted and whose status publishes
    /// credentials.
    pub sandboxes: u64,
    /// The engines they publish.
    pub engines: u64,
    /// Rows pending with a message of admission (`waiting for ...`).
    pub waiting: u64,
    /// Seeds the owner may store (`None`: unlimited).
    pub max_seeds: Option<u64>,
    /// Bytes its seeds may hold together (`None`: unlimited).
    pub max_seed_bytes: Option<u64>,
    /// Seeds it stores.
    pub seeds: u64,
    /// Their bytes.
    pub seed_bytes: u64,
}

fn signed(v: Option<u64>) -> Option<i64> {
    v.map(|v| i64::try_from(v).unwrap_or(i64::MAX))
}

fn unsigned(v: Option<i64>) -> Option<u64> {
    v.map(|v| u64::try_from(v).unwrap_or(0))
}

fn count(v: Option<i32>) -> Option<u64> {
    v.map(|n| u64::try_from(n).unwrap_or(0))
}

fn count_limit(flag: &str, v: Option<u64>) -> Result<Option<i32>, StoreError> {
    v.map(|n| {
        i32::try_from(n).map_err(|_| {
            StoreError::Rejected(format!(
                "{flag} {n} is too large: use at most {} or `unlimited`",
                i32::MAX
            ))
        })
    })
    .transpose()
}

impl PgStore {
    /// Sets `owner`'s limits on sandboxes and memory (its seed limits
    /// kept); see [`PgStore::set_limits`].
    pub async fn set_quota(
        &self,
        owner: &str,
        sandboxes: Setting,
        memory: Setting,
    ) -> Result<Quota, StoreError> {
        let set = QuotaSettings {
            sandboxes,
            memory,
            seeds: Setting::Keep,
            seed_bytes: Setting::Keep,
        };
        Ok(self.set_limits(owner, set).await?.admission)
    }

    /// Sets `owner`'s limits (`*`: the default for every owner without a
    /// row), creating its row (a new row has no limit on sandboxes and
    /// memory, and the seed limits the table's columns default to);
    /// returns the limits it now has. Only the owner of sandboxd's tables
    /// may write them.
    pub async fn set_limits(
        &self,
        owner: &str,
        set: QuotaSettings,
    ) -> Result<QuotaLimits, StoreError> {
        let mut tx = self.pool.begin().await.map_err(query("set a quota"))?;
        // A new row first, with the columns' defaults: what `Keep` keeps.
        sqlx::query(
            "INSERT INTO sandbox_quotas (owner) VALUES ($1) ON CONFLICT (owner) DO NOTHING",
        )
        .bind(owner)
        .execute(&mut *tx)
        .await
        .map_err(query("set a quota"))?;
        let (now_sandboxes, now_memory, now_seeds, now_seed_bytes): (
            Option<i32>,
            Option<i64>,
            Option<i32>,
            Option<i64>,
        ) = sqlx::query_as(
            "SELECT max_sandboxes, max_memory_bytes, max_seeds, max_seed_bytes
               FROM sandbox_quotas WHERE owner = $1 FOR UPDATE",
        )
        .bind(owner)
        .fetch_one(&mut *tx)
        .await
        .map_err(query("set a quota"))?;
        let limits = QuotaLimits {
            admission: Quota {
                sandboxes: set.sandboxes.apply(count(now_sandboxes)),
                memory_bytes: set.memory.apply(unsigned(now_memory)),
            },
            seeds: set.seeds.apply(count(now_seeds)),
            seed_bytes: set.seed_bytes.apply(unsigned(now_seed_bytes)),
        };
        sqlx::query(
            "UPDATE sandbox_quotas
                SET max_sandboxes = $2, max_memory_bytes = $3,
                    max_seeds = $4, max_seed_bytes = $5, updated_at = now()
              WHERE owner = $1",
        )
        .bind(owner)
        .bind(count_limit("--sandboxes", limits.admission.sandboxes)?)
        .bind(signed(limits.admission.memory_bytes))
        .bind(count_limit("--seeds", limits.seeds)?)
        .bind(signed(limits.seed_bytes))
        .execute(&mut *tx)
        .await
        .map_err(query("set a quota"))?;
        tx.commit().await.map_err(query("set a quota"))?;
        Ok(limits)
    }

    /// Deletes `owner`'s row (it falls back to the default); true if it
    /// had one.
    pub async fn delete_quota(&self, owner: &str) -> Result<bool, StoreError> {
        let done = sqlx::query("DELETE FROM sandbox_quotas WHERE owner = $1")
            .bind(owner)
            .execute(&self.pool)
            .await
            .map_err(query("delete a quota"))?;
        Ok(done.rows_affected() > 0)
    }

    /// Every owner with a row in `sandbox_quotas` or `sandbox_desired`:
    /// the limits that apply to it and its use as the status rows show it.
    pub async fn quota_lines(&self) -> Result<Vec<QuotaLine>, StoreError> {
        let rows = sqlx::query(
            "WITH used AS (
                 SELECT d.owner,
                        count(*) FILTER (WHERE s.phase <> 'terminating'
                                           AND jsonb_typeof(s.services) = 'object'
                                           AND s.services <> '{}'::jsonb) AS sandboxes,
                        coalesce(sum(CASE WHEN s.phase <> 'terminating'
                                           AND jsonb_typeof(s.services) = 'object'
                                          THEN (SELECT count(*) FROM jsonb_object_keys(s.services))
                                     END), 0)::bigint AS engines,
                        count(*) FILTER (WHERE s.phase = 'pending'
                                           AND s.message LIKE 'waiting for %') AS waiting
                   FROM sandbox_desired d LEFT JOIN sandbox_status s ON s.id = d.id
                  GROUP BY d.owner),
             stored AS (
                 SELECT owner, count(*) AS seeds, sum(size_bytes)::bigint AS seed_bytes
                   FROM sandbox_seeds GROUP BY owner),
             owners AS (SELECT owner FROM used UNION SELECT owner FROM sandbox_quotas
                        UNION SELECT owner FROM stored)
             SELECT o.owner, q.source, q.max_sandboxes, q.max_memory_bytes,
                    q.max_seeds, q.max_seed_bytes,
                    coalesce(u.sandboxes, 0) AS sandboxes, coalesce(u.engines, 0) AS engines,
                    coalesce(u.waiting, 0) AS waiting,
                    coalesce(st.seeds, 0) AS seeds, coalesce(st.seed_bytes, 0) AS seed_bytes
               FROM owners o
               LEFT JOIN used u ON u.owner = o.owner
               LEFT JOIN stored st ON st.owner = o.owner
               LEFT JOIN LATERAL sandbox_quota_for(o.owner) q ON true
              ORDER BY o.owner <> '*', o.owner",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(query("list quotas"))?;
        Ok(rows
            .iter()
            .map(|r| QuotaLine {
                owner: r.get("owner"),
                source: r.get("source"),
                max_sandboxes: count(r.get("max_sandboxes")),
                max_memory_bytes: unsigned(r.get("max_memory_bytes")),
                sandboxes: u64::try_from(r.get::<i64, _>("sandboxes")).unwrap_or(0),
                engines: u64::try_from(r.get::<i64, _>("engines")).unwrap_or(0),
                waiting: u64::try_from(r.get::<i64, _>("waiting")).unwrap_or(0),
                max_seeds: count(r.get("max_seeds")),
                max_seed_bytes: unsigned(r.get("max_seed_bytes")),
                seeds: u64::try_from(r.get::<i64, _>("seeds")).unwrap_or(0),
                seed_bytes: u64::try_from(r.get::<i64, _>("seed_bytes")).unwrap_or(0),
            })
            .collect())
    }
}
