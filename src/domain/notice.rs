//! What is announced of each recorded event: `NOTIFY sandbox_events`
//! (sent by `sandbox_record_events` in the state database, in the same
//! transaction as the write) and the webhook (sent by sandboxd). Pure:
//! the type, the channel's name and the webhook's signature.

use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

/// The channel every recorded event is announced on.
pub const NOTIFY_CHANNEL: &str = "sandbox_events";

/// The webhook's signature header.
pub const SIGNATURE_HEADER: &str = "X-Sandboxd-Signature";

/// One recorded event, as the webhook receives it (its JSON body). The
/// `NOTIFY` payload is the same without `sandbox_id`, `owner`, `detail`
/// and `message`, which only a reader allowed to see the event's row may
/// read (the channel cannot be restricted to owners, released ids are no
/// other tenant's business, and a detail may name a fork's source, a seed
/// or a checkpoint); it names the row by its `incarnation`, a random uuid
/// that opens nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventNotice {
    /// The event's row in `sandbox_events` (a repeated event keeps it).
    pub seq: i64,
    /// The sandbox.
    pub sandbox_id: String,
    /// What happened (an `EventReason`, as text).
    pub reason: String,
    /// The engine, if one.
    pub engine: Option<String>,
    /// The detail (heal cause, reap reason, origin, what failed).
    pub detail: Option<String>,
    /// How many times it happened in a row (a repeat is announced again).
    pub count: i32,
    /// The first time it happened.
    pub first_at: DateTime<Utc>,
    /// The last time it happened.
    pub last_at: DateTime<Utc>,
    /// The row's owner when it was recorded.
    pub owner: String,
    /// The incarnation of the row it is about, if known.
    pub incarnation: Option<String>,
    /// The message, scrubbed of every credential.
    pub message: String,
}

/// The value of [`SIGNATURE_HEADER`] for `body` sent at `unix_seconds`:
/// `t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>`. The
/// receiver recomputes it with the shared secret and rejects an old `t`
/// (a replay).
pub fn sign(secret: &[u8], unix_seconds: i64, body: &[u8]) -> String {
    format!(
        "t={unix_seconds},v1={}",
        super::hex::encode(&mac(secret, unix_seconds, body))
    )
}

/// Whether `header` is a valid [`sign`]ature of `body` under `secret`
/// (compared in constant time); returns its time.
pub fn verify(secret: &[u8], header: &str, body: &[u8]) -> Option<i64> {
    let mut t = None;
    let mut v1 = None;
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", value)) => t = value.parse::<i64>().ok(),
            Some(("v1", value)) => v1 = unhex(value),
            _ => {}
        }
    }
    let (t, v1) = (t?, v1?);
    let mut m = keyed(secret);
    m.update(format!("{t}.").as_bytes());
    m.update(body);
    m.verify_slice(&v1).ok().map(|()| t)
}

fn keyed(secret: &[u8]) -> Hmac<Sha256> {
    // HMAC takes a key of any length.
    Hmac::<Sha256>::new_from_slice(secret).expect("HMAC accepts any key length")
}

fn mac(secret: &[u8], unix_seconds: i64, body: &[u8]) -> Vec<u8> {
    let mut m = keyed(secret);
    m.update(format!("{unix_seconds}.").as_bytes());
    m.update(body);
    m.finalize().into_bytes().to_vec()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 || !s.is_ascii() {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_is_the_hmac_of_the_time_and_body_in_hex() {
        // Known answer, computed independently (Python):
        // hmac.new(b"key", b"1.{}", hashlib.sha256).hexdigest()
        let header = sign(b"key", 1, b"{}");
        assert_eq!(
            header,
            "t=1,v1=1ba6b8171186efc613e8bcc0cbdab2748f24984d7c5a84faa2637afa0e40d224"
        );
        assert_eq!(verify(b"key", &header, b"{}"), Some(1));
    }

    #[test]
    fn a_signature_fails_for_another_secret_body_or_time() {
        let header = sign(b"s3cret", 1_700_000_000, br#"{"seq":1}"#);
        assert_eq!(verify(b"other", &header, br#"{"seq":1}"#), None);
        assert_eq!(verify(b"s3cret", &header, br#"{"seq":2}"#), None);
        let moved = header.replace("t=1700000000", "t=1700000001");
        assert_eq!(verify(b"s3cret", &moved, br#"{"seq":1}"#), None);
        assert_eq!(verify(b"s3cret", "t=1,v1=zz", b""), None);
        assert_eq!(verify(b"s3cret", "garbage", b""), None);
    }

    #[test]
    fn a_notice_round_trips_through_the_json_the_database_returns() {
        let json = serde_json::json!({
            "seq": 7, "sandbox_id": "agent-7", "reason": "healed", "engine": "redis",
            "detail": "exited", "count": 2,
            "first_at": "2026-12-02T00:10:00.123456Z", "last_at": "2026-12-02T00:11:00.000001Z",
            "owner": "orch", "incarnation": null, "message": "re-created"
        });
        let n: EventNotice = serde_json::from_value(json).unwrap();
        assert_eq!((n.seq, n.count, n.reason.as_str()), (7, 2, "healed"));
        let back = serde_json::to_value(&n).unwrap();
        assert_eq!(back["last_at"], "2026-12-02T00:11:00.000001Z");
    }
}
