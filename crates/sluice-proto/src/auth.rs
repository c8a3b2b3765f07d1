//! The key proofs of the handshake, one each way. The client's: HMAC-SHA256
//! under the shared key of the server's fresh nonce and the exact `Hello`
//! body the client sent. The server's, in its `HelloOk`: HMAC-SHA256 under
//! the same key, in another context, of the client's own fresh nonce (sent
//! in its `Auth`), the server's nonce and the `Hello` body. A client
//! believes no answer before the server's proof checks out, so whoever
//! took the server's address without its key (a port bound after the
//! server stopped) learns nothing and serves nothing.
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
/// The server's proof is made in its own context, so neither side's MAC
/// can be replayed as the other's.
const PROOF_CONTEXT: &[u8] = b"sluice-server-proof-v1\0";

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

fn proof_keyed(key: &[u8], client_nonce: &[u8; AUTH_BYTES], server_nonce: &[u8; AUTH_BYTES], hello_body: &[u8]) -> Hmac<Sha256> {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key length");
    m.update(PROOF_CONTEXT);
    m.update(client_nonce);
    m.update(server_nonce);
    m.update(hello_body);
    m
}

/// The server's proof of the key, in the `HelloOk` that answers an `Auth`:
/// over the client's nonce, the server's own and the `Hello` body.
pub fn proof_mac(key: &[u8], client_nonce: &[u8; AUTH_BYTES], server_nonce: &[u8; AUTH_BYTES], hello_body: &[u8]) -> [u8; AUTH_BYTES] {
    proof_keyed(key, client_nonce, server_nonce, hello_body).finalize().into_bytes().into()
}

/// Whether the server's `proof` shows it holds `key`; constant time.
pub fn proof_verify(key: &[u8], client_nonce: &[u8; AUTH_BYTES], server_nonce: &[u8; AUTH_BYTES], hello_body: &[u8], proof: &[u8; AUTH_BYTES]) -> bool {
    proof_keyed(key, client_nonce, server_nonce, hello_body).verify_slice(proof).is_ok()
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

    #[test]
    fn the_servers_proof_is_its_own_and_binds_both_nonces() {
        let (key, mine, theirs, hello) = ([7u8; 32], [1u8; AUTH_BYTES], [2u8; AUTH_BYTES], b"hello body".as_slice());
        let p = proof_mac(&key, &mine, &theirs, hello);
        assert!(proof_verify(&key, &mine, &theirs, hello, &p));
        assert!(!proof_verify(&[8u8; 32], &mine, &theirs, hello, &p), "another key");
        assert!(!proof_verify(&key, &[3u8; AUTH_BYTES], &theirs, hello, &p), "another client nonce (replay)");
        assert!(!proof_verify(&key, &mine, &[3u8; AUTH_BYTES], hello, &p), "another server nonce");
        // The client's MAC over the same bytes is no proof, and the other way round.
        assert!(!proof_verify(&key, &mine, &theirs, hello, &auth_mac(&key, &theirs, hello)));
        assert!(!auth_verify(&key, &theirs, hello, &p));
    }
}
