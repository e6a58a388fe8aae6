//! Lowercase hex of bytes: digests in names and labels, signatures.

use std::fmt::Write as _;

/// `bytes` as lowercase hex, two digits each.
pub(crate) fn encode(bytes: &[u8]) -> String {
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// The first 6 bytes of `digest` as 12 hex digits: what a Docker name or
/// label carries of a SHA-256 (short enough for a name, 48 bits).
pub(crate) fn short(digest: &[u8]) -> String {
    encode(&digest[..digest.len().min(6)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_become_two_lowercase_digits_each_and_short_keeps_six_bytes() {
        for (bytes, full, short_) in [
            (&[][..], "", ""),
            (&[0x0a, 0xff][..], "0aff", "0aff"),
            (
                &[1, 2, 3, 4, 5, 6, 7, 8][..],
                "0102030405060708",
                "010203040506",
            ),
        ] {
            assert_eq!(encode(bytes), full);
            assert_eq!(short(bytes), short_);
        }
    }
}
