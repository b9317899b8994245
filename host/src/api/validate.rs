//! Checks on every string a request stores, so the database never sees a
//! value it refuses (PostgreSQL refuses NUL in text) and no stored string
//! carries invisible control characters. Each failure names its field; a
//! bad entry is refused alone, before it reaches a shared transaction.

use super::ApiError;

/// What [`identifier`] accepts, as the OpenAPI document states it (JSON
/// Schema `pattern`, ECMA-262 syntax): no control character but tab and
/// newline, and one character at least that is not blank. ECMA-262's `\s`
/// is Unicode White_Space plus U+FEFF, so U+FEFF is named for engines (like
/// Rust's) whose `\s` lacks it. Lengths count characters, as JSON Schema's
/// `maxLength` does.
pub const IDENTIFIER_PATTERN: &str = r"^[^\u0000-\u0008\u000b-\u001f\u007f-\u009f]*[^\u0000-\u0008\u000b-\u001f\u007f-\u009f\s\ufeff][^\u0000-\u0008\u000b-\u001f\u007f-\u009f]*$";

/// What [`text`] accepts: anything without NUL.
pub const NUL_FREE_PATTERN: &str = r"^[^\u0000]*$";

fn blank(c: char) -> bool {
    c.is_whitespace() || c == '\u{feff}'
}

/// An identifier (`author`, `kind`, `actor`, `external_id`, path ids):
/// 1-`max` characters, not blank, no control characters but tab and newline.
pub fn identifier(field: &str, value: &str, max: usize) -> Result<(), ApiError> {
    if value.chars().all(blank) {
        return Err(invalid(field, "must not be blank"));
    }
    let chars = value.chars().count();
    if chars > max {
        return Err(invalid(
            field,
            &format!("is {chars} characters, over the limit of {max}"),
        ));
    }
    if let Some(c) = value.chars().find(|c| c.is_control() && *c != '\t' && *c != '\n') {
        return Err(invalid(
            field,
            &format!("contains the control character U+{:04X}", c as u32),
        ));
    }
    Ok(())
}

/// Free text (`text`, `reason`): at most `max` characters, no NUL.
pub fn text(field: &str, value: &str, max: usize) -> Result<(), ApiError> {
    // Bytes bound characters from above: count only when it could matter.
    if value.len() > max {
        let chars = value.chars().count();
        if chars > max {
            return Err(invalid(
                field,
                &format!("is {chars} characters, over the limit of {max}"),
            ));
        }
    }
    if value.contains('\0') {
        return Err(invalid(field, "contains a NUL character"));
    }
    Ok(())
}

/// Every key and string inside a JSON value: no NUL.
pub fn json(field: &str, value: &serde_json::Value) -> Result<(), ApiError> {
    match value {
        serde_json::Value::String(s) => text(field, s, usize::MAX),
        serde_json::Value::Array(items) => items.iter().try_for_each(|v| json(field, v)),
        serde_json::Value::Object(map) => map.iter().try_for_each(|(k, v)| {
            text(&format!("{field}.{k}"), k, usize::MAX)?;
            json(&format!("{field}.{k}"), v)
        }),
        _ => Ok(()),
    }
}

/// A path segment naming a stored thing (an item id, a provider): refused
/// as malformed when it could not name one.
pub fn path_id(field: &str, value: &str) -> Result<(), ApiError> {
    identifier(field, value, 256).map_err(|e| ApiError::bad_request("invalid_path", e.message))
}

fn invalid(field: &str, why: &str) -> ApiError {
    ApiError::bad_request("invalid_body", format!("`{field}` {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_refuse_control_characters_but_tab_and_newline() {
        assert!(identifier("author", "alice", 256).is_ok());
        assert!(identifier("author", "a\tb\nc", 256).is_ok());
        for bad in ["", "   ", "a\0b", "a\u{7}b", "a\rb", "a\u{9b}b"] {
            let e = identifier("author", bad, 256).unwrap_err();
            assert_eq!(e.status, 400, "{bad:?}");
            assert!(e.message.contains("`author`"), "{}", e.message);
        }
        assert!(identifier("author", &"a".repeat(257), 256).is_err());
        assert!(
            identifier("author", &"é".repeat(256), 256).is_ok(),
            "characters, not bytes"
        );
    }

    #[test]
    fn text_refuses_only_nul_and_length() {
        assert!(text("text", "bell \u{7} and\r\nnewlines", 100).is_ok());
        assert!(text("text", "", 100).is_ok());
        assert!(text("text", "nul\0", 100).unwrap_err().message.contains("NUL"));
        assert!(text("text", "long", 3).is_err());
    }

    #[test]
    fn json_checks_nested_keys_and_strings() {
        assert!(json("context", &serde_json::json!({"a": ["x", {"b": 1}]})).is_ok());
        let e = json("context", &serde_json::json!({"a": [{"b": "x\u{0}"}]})).unwrap_err();
        assert!(e.message.contains("`context.a.b`"), "{}", e.message);
        assert!(json("context", &serde_json::json!({"k\u{0}": 1})).is_err());
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    /// The OpenAPI pattern itself, evaluated by a regex engine.
    fn pattern_accepts(value: &str) -> bool {
        static PATTERN: std::sync::LazyLock<regex::Regex> =
            std::sync::LazyLock::new(|| regex::Regex::new(IDENTIFIER_PATTERN).expect("the pattern compiles"));
        PATTERN.is_match(value)
    }

    proptest! {
        #[test]
        fn the_documented_pattern_is_what_identifier_checks(value in "\\PC{0,6}[\\x00-\\x1f\\x7f-\\u{9f}\\s\\u{feff}]?\\PC{0,6}|[\\s\\u{feff}]{0,3}") {
            prop_assert_eq!(identifier("f", &value, 64).is_ok(), pattern_accepts(&value), "{:?}", value);
        }

        #[test]
        fn identifiers_accept_exactly_the_documented_strings(value in "\\PC{0,8}[\\x00-\\x1f\\x7f-\\u{9f}]?\\PC{0,8}|\\s{0,3}", max in 1usize..32) {
            let ok = identifier("f", &value, max).is_ok();
            let expected = !value.chars().all(blank)
                && value.chars().count() <= max
                && value.chars().all(|c| !c.is_control() || c == '\t' || c == '\n');
            prop_assert_eq!(ok, expected, "{:?}", value);
        }

        #[test]
        fn text_refuses_only_nul_and_length(value in any::<String>(), max in 0usize..64) {
            let ok = text("f", &value, max).is_ok();
            prop_assert_eq!(ok, value.chars().count() <= max && !value.contains('\0'));
        }

        #[test]
        fn failures_name_their_field_and_are_400(value in any::<String>()) {
            if let Err(e) = identifier("author", &value, 16) {
                prop_assert_eq!(e.status, 400);
                prop_assert!(e.message.contains("`author`"));
            }
        }
    }
}
