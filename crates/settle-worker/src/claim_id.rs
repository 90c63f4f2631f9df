//! The claim's own id (SPEC §4 claim rule 5a, §11.11): drawn at random for
//! each claim and sent again only when that same claim is retried because
//! its answer was lost, so that the retry is answered with the grant the
//! first one got instead of meeting this worker's own lease as `in_flight`.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use settle_core::ClaimId;

/// A fresh random claim id: 16 bytes (128 bits, above the spec's 96) from
/// the operating system's generator, as 22 characters of URL-safe base64
/// without padding, inside the ledger's `[A-Za-z0-9_-]{16,64}`.
///
/// # Panics
///
/// When the operating system has no random source (`getrandom` fails):
/// a claim without a usable id must not be sent as if it had one, and no
/// supported platform lacks one.
pub fn new_claim_id() -> ClaimId {
    let mut bytes = [0u8; 16];
    getrandom::getrandom(&mut bytes).expect("the operating system's random source");
    ClaimId::new(URL_SAFE_NO_PAD.encode(bytes)).expect("22 characters of URL-safe base64")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_ids_are_22_url_safe_characters_and_differ() {
        let a = new_claim_id();
        let b = new_claim_id();
        assert_eq!(a.as_str().len(), 22);
        assert!(
            a.as_str()
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
        );
        assert_ne!(a, b);
    }
}
