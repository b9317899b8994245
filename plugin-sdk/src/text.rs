//! Word folding for whole-word matching: the host's `terms` lists and the
//! banned-terms example fold text with this one function, so a term means
//! the same thing to both.

use unicode_normalization::UnicodeNormalization;
use unicode_normalization::char::is_combining_mark;

/// The words of `text`, lowercased and without accents: compatibility
/// decomposition (NFKD, so full-width letters become ASCII), combining
/// marks dropped, then split on every character that is not a letter or a
/// digit (`Ça VA, Señor?` → `ca`, `va`, `senor`).
pub fn fold_words(text: &str) -> Vec<String> {
    let folded: String = text
        .nfkd()
        .filter(|c| !is_combining_mark(*c))
        .flat_map(char::to_lowercase)
        .collect();
    folded
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folds_case_accents_width_and_punctuation() {
        assert_eq!(
            fold_words("Ça VA, Señor? ｆｕｌｌ-width"),
            vec!["ca", "va", "senor", "full", "width"]
        );
        assert!(fold_words(" ,.!? ").is_empty());
    }
}
