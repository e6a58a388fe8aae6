//! `NOTIFY sandbox_desired` as the controller reads it.
//!
//! Postgres cannot restrict a channel: every role that may connect can
//! `LISTEN` on it and `NOTIFY` on it. So the database names a changed row
//! by its incarnation (a random uuid per life of a row, which names no id
//! and no owner), never by its id, and this module finds the id: in
//! `sandbox_desired`, or for a deleted row in its tombstone
//! (`sandbox_released`). A payload the database does not back (one any
//! role made up) asks nothing: an unknown incarnation is dropped, and
//! [`NOTIFY_EVERY_ROW`] relists only when `sandbox_relist_requests` moved,
//! which only the tables' owner can make it do (a `TRUNCATE` of
//! `sandbox_desired`, `sandbox_resume_reaping`). One indexed lookup per
//! notification keeps the controller reconciling just the row that
//! changed.

use super::{connect_error, listen, query, DESIRED_CHANNEL};
use crate::domain::identity::Incarnation;
use crate::ports::store::{NotifyStream, StoreError, NOTIFY_EVERY_ROW};
use futures::StreamExt;
use sqlx::postgres::PgListener;
use sqlx::PgPool;

/// The ids of the rows `NOTIFY sandbox_desired` announces (and
/// [`NOTIFY_EVERY_ROW`] for a relist the owner asked for), until the
/// listener's connection drops or a lookup fails: then the stream ends,
/// and the watcher reconnects and relists.
pub(super) async fn desired_rows(pool: &PgPool) -> Result<NotifyStream, StoreError> {
    let listener = listen(pool, &[DESIRED_CHANNEL]).await?;
    // Read once subscribed: a relist asked before is covered by the relist
    // every (re)connect brings.
    let relists = relist_requests(pool).await?;
    let watch = Notifications {
        listener,
        pool: pool.clone(),
        relists,
    };
    let stream = futures::stream::unfold(Some(watch), |watch| async move {
        let mut watch = watch?;
        loop {
            let payload = match watch.listener.try_recv().await {
                Ok(Some(n)) => n.payload().to_owned(),
                // `try_recv` answers `Ok(None)` when the connection drops.
                Ok(None) => return None,
                Err(e) => return Some((Err(connect_error(e)), None)),
            };
            match watch.resolve(&payload).await {
                Ok(Some(found)) => return Some((Ok(found), Some(watch))),
                Ok(None) => continue,
                Err(e) => return Some((Err(e), None)),
            }
        }
    });
    Ok(stream.boxed())
}

/// A subscription to `sandbox_desired`, and the relist requests seen.
struct Notifications {
    listener: PgListener,
    pool: PgPool,
    /// `sandbox_relist_requests` when last looked at.
    relists: i64,
}

impl Notifications {
    /// What `payload` asks of the controller: the id of the row whose
    /// incarnation it is, [`NOTIFY_EVERY_ROW`] if the owner asked for a
    /// relist since the last one, or nothing.
    async fn resolve(&mut self, payload: &str) -> Result<Option<String>, StoreError> {
        if payload == NOTIFY_EVERY_ROW {
            let now = relist_requests(&self.pool).await?;
            if now == self.relists {
                tracing::debug!("ignoring a NOTIFY '*' that no relist request backs");
                return Ok(None);
            }
            self.relists = now;
            return Ok(Some(NOTIFY_EVERY_ROW.to_owned()));
        }
        let Ok(incarnation) = Incarnation::parse(payload) else {
            tracing::debug!("ignoring a NOTIFY that is no incarnation");
            return Ok(None);
        };
        sqlx::query_scalar(
            "SELECT id FROM sandbox_desired WHERE incarnation = $1::uuid
             UNION ALL
             SELECT id FROM sandbox_released WHERE incarnation = $1::uuid
             LIMIT 1",
        )
        .bind(incarnation.as_str())
        .fetch_optional(&self.pool)
        .await
        .map_err(query("find the row a notification names"))
    }
}

/// How many relists the owner has asked for (0: none yet).
async fn relist_requests(pool: &PgPool) -> Result<i64, StoreError> {
    sqlx::query_scalar(
        "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM sandbox_relist_requests",
    )
    .fetch_one(pool)
    .await
    .map_err(query("read sandbox_relist_requests"))
}
