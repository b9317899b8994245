//! Normalised-content fingerprints: the same text, give or take case,
//! accents, punctuation and spacing, has the same fingerprint.

use sha2::{Digest, Sha256};
use unicode_normalization::UnicodeNormalization;
use unicode_normalization::char::is_combining_mark;

/// Lowercase, accents removed (NFKD), runs of anything but letters and
/// digits collapsed to one space, trimmed.
pub fn normalise(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut gap = false;
    for c in text
        .nfkd()
        .filter(|c| !is_combining_mark(*c))
        .flat_map(char::to_lowercase)
    {
        if c.is_alphanumeric() {
            if gap && !out.is_empty() {
                out.push(' ');
            }
            gap = false;
            out.push(c);
        } else {
            gap = true;
        }
    }
    out
}

/// sha256 of the normalised text, hex (first 16 bytes).
pub fn fingerprint(text: &str) -> String {
    hex::encode(&Sha256::digest(normalise(text).as_bytes())[..16])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variants_of_one_text_share_a_fingerprint() {
        assert_eq!(normalise("  Héllo,   WORLD!! "), "hello world");
        assert_eq!(
            fingerprint("Buy NOW: cheap pills"),
            fingerprint("buy now... cheap   pills!")
        );
        assert_ne!(fingerprint("buy now"), fingerprint("buy later"));
    }
}
