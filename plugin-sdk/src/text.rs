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
    let mut folded = String::with_capacity(text.len() + 1);
    fold_words_into(text, &mut folded);
    folded.split_terminator(' ').map(str::to_string).collect()
}

/// [`fold_words`] without a string per word: appends each folded word of
/// `text` to `out`, followed by one space.
///
/// ASCII runs are folded byte by byte; only runs of other characters go
/// through NFKD. The result is the same as decomposing the whole text:
/// canonical reordering only moves combining characters among themselves,
/// and an ASCII character, a starter, ends every such sequence.
pub fn fold_words_into(text: &str, out: &mut String) {
    let mut words = Words { out, in_word: false };
    let mut rest = text;
    while !rest.is_empty() {
        let ascii = rest.bytes().position(|b| !b.is_ascii()).unwrap_or(rest.len());
        for b in rest[..ascii].bytes() {
            words.push(char::from(b.to_ascii_lowercase()));
        }
        rest = &rest[ascii..];
        let other = rest.find(|c: char| c.is_ascii()).unwrap_or(rest.len());
        rest[..other]
            .nfkd()
            .filter(|c| !is_combining_mark(*c))
            .flat_map(char::to_lowercase)
            .for_each(|c| words.push(c));
        rest = &rest[other..];
    }
    if words.in_word {
        words.out.push(' ');
    }
}

/// Folded characters being split into space-terminated words.
struct Words<'a> {
    out: &'a mut String,
    in_word: bool,
}

impl Words<'_> {
    fn push(&mut self, c: char) {
        if c.is_alphanumeric() {
            self.out.push(c);
            self.in_word = true;
        } else if self.in_word {
            self.out.push(' ');
            self.in_word = false;
        }
    }
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

    /// The run-by-run folding agrees with decomposing the whole text at
    /// once, the definition, on mixed scripts, marks after ASCII letters
    /// and marks out of canonical order.
    #[test]
    fn folding_by_runs_agrees_with_whole_text_decomposition() {
        fn whole(text: &str) -> Vec<String> {
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
        let texts = [
            "",
            "plain ascii, Words AND 123 numbers!",
            "Ça VA, Señor? ｆｕｌｌ-width",
            "e\u{301}cole a\u{323}\u{302}b x\u{302}\u{323}y",
            "ﬁne ① Ⅻ İstanbul ΣΊΣΥΦΟΣ straße",
            "日本語のテキスト mixed with ascii — and “quotes”",
            "tab\tnew\nline\u{a0}nbsp",
        ];
        for text in texts {
            assert_eq!(fold_words(text), whole(text), "{text:?}");
        }
    }
}
