//! The key proof of the handshake: HMAC-SHA256 under the shared key of the
//! server's fresh nonce and the exact `Hello` body the client sent.
//!
//! Binding the `Hello` body means the identity the client states is part
//! of what it proves: a stolen MAC is useless for another identity, and a
//! nonce is never reused, so a recorded exchange cannot be replayed. The
//! key authenticates the start of a connection only; on a network where
//! connections can be hijacked, run sluice inside a tunnel (WireGuard,
//! IPsec, TLS) — see the README's security model.

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::AUTH_BYTES;

/// Domain separation: a MAC made for sluice's handshake means nothing
/// elsewhere.
const AUTH_CONTEXT: &[u8] = b"sluice-auth-v2\0";

fn keyed(key: &[u8], nonce: &[u8; AUTH_BYTES], hello_body: &[u8]) -> Hmac<Sha256> {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key length");
    m.update(AUTH_CONTEXT);
    m.update(nonce);
    m.update(hello_body);
    m
}

/// The `Auth` MAC for `nonce` and the `Hello` body.
pub fn auth_mac(key: &[u8], nonce: &[u8; AUTH_BYTES], hello_body: &[u8]) -> [u8; AUTH_BYTES] {
    keyed(key, nonce, hello_body).finalize().into_bytes().into()
}

/// Whether `mac` proves `key` for `nonce` and the `Hello` body; compared in
/// constant time.
pub fn auth_verify(key: &[u8], nonce: &[u8; AUTH_BYTES], hello_body: &[u8], mac: &[u8; AUTH_BYTES]) -> bool {
    keyed(key, nonce, hello_body).verify_slice(mac).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mac_proves_only_its_key_nonce_and_hello() {
        let (key, nonce, hello) = ([7u8; 32], [9u8; AUTH_BYTES], b"hello body".as_slice());
        let mac = auth_mac(&key, &nonce, hello);
        assert!(auth_verify(&key, &nonce, hello, &mac));
        assert!(!auth_verify(&[8u8; 32], &nonce, hello, &mac), "another key");
        assert!(!auth_verify(&key, &[1u8; AUTH_BYTES], hello, &mac), "another nonce (replay)");
        assert!(!auth_verify(&key, &nonce, b"hello bodz", &mac), "another identity");
    }
}
