//! The SCRAM-SHA-256 verifier Postgres stores for a password (RFC 5802,
//! RFC 7677; the format of `pg_authid.rolpassword`), computed here so that
//! `ALTER ROLE ... PASSWORD` carries the verifier and never the password:
//! a statement the server logs (on an error, say) shows nothing that logs in.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// Postgres's default iteration count (`scram_iterations`).
const ITERATIONS: u32 = 4096;

type HmacSha256 = Hmac<Sha256>;

fn hmac(key: &[u8], message: &[u8]) -> [u8; 32] {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(message);
    mac.finalize().into_bytes().into()
}

/// PBKDF2-HMAC-SHA-256 with one output block (SCRAM's `Hi`).
fn salted(password: &[u8], salt: &[u8], iterations: u32) -> [u8; 32] {
    let mut first = salt.to_vec();
    first.extend_from_slice(&1u32.to_be_bytes());
    let mut u = hmac(password, &first);
    let mut out = u;
    for _ in 1..iterations {
        u = hmac(password, &u);
        out.iter_mut().zip(u).for_each(|(o, b)| *o ^= b);
    }
    out
}

/// The verifier of `password` with `salt` (the password is used as is:
/// sandboxd's are ASCII letters and digits, which SASLprep leaves alone).
pub(crate) fn verifier_with_salt(password: &str, salt: &[u8], iterations: u32) -> String {
    let salted = salted(password.as_bytes(), salt, iterations);
    let stored_key = Sha256::digest(hmac(&salted, b"Client Key"));
    let server_key = hmac(&salted, b"Server Key");
    format!(
        "SCRAM-SHA-256${iterations}:{}${}:{}",
        STANDARD.encode(salt),
        STANDARD.encode(stored_key),
        STANDARD.encode(server_key)
    )
}

/// The verifier of `password` with a fresh random 16-byte salt.
pub(crate) fn verifier(password: &str) -> String {
    let salt: [u8; 16] = rand::random();
    verifier_with_salt(password, &salt, ITERATIONS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_verifier_matches_the_rfc_7677_test_vector() {
        // RFC 7677, section 3: user "user", password "pencil", salt
        // W22ZaJ0SNY7soEsUEjb6gQ==, 4096 iterations; the exchange's server
        // signature proves ServerKey and its client proof StoredKey.
        let salt = STANDARD.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let v = verifier_with_salt("pencil", &salt, 4096);
        let parts: Vec<&str> = v.split(['$', ':']).collect();
        assert_eq!(parts[0], "SCRAM-SHA-256");
        assert_eq!(parts[1], "4096");
        assert_eq!(parts[2], "W22ZaJ0SNY7soEsUEjb6gQ==");
        let server_key = STANDARD.decode(parts[4]).unwrap();
        let auth_message = "n=user,r=rOprNGfwEbeRWgbNEkqO,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096,c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
        let signature = hmac(&server_key, auth_message.as_bytes());
        assert_eq!(
            STANDARD.encode(signature),
            "6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
        );
        // The client's proof XOR its signature is the client key, whose
        // hash is the stored key.
        let stored_key = STANDARD.decode(parts[3]).unwrap();
        let proof = STANDARD
            .decode("dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
            .unwrap();
        let client_signature = hmac(&stored_key, auth_message.as_bytes());
        let client_key: Vec<u8> = proof
            .iter()
            .zip(client_signature)
            .map(|(p, s)| p ^ s)
            .collect();
        assert_eq!(
            Sha256::digest(&client_key).as_slice(),
            stored_key.as_slice()
        );
    }

    #[test]
    fn two_verifiers_of_one_password_differ_by_their_salt() {
        assert_ne!(verifier("secret"), verifier("secret"));
        assert!(verifier("secret").starts_with("SCRAM-SHA-256$4096:"));
    }
}
