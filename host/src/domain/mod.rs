//! The domain: the words gavel thinks in, and the decisions it makes with
//! them, as plain types and pure functions. Nothing here touches a database,
//! a socket, a clock or a plugin, and no module here imports anything of the
//! crate outside `domain` — every other room may import these.
//!
//! - [`status`]: an item's life ([`ItemStatus`], [`Actor`], the transition table).
//! - [`verdict`]: what a rule concludes ([`Verdict`]) and its severity order.
//! - [`evaluation`]: how an evaluation went ([`Outcome`]), when it ran
//!   ([`Phase`], [`DecisionPhase`]), whether it counts ([`Mode`]), which code
//!   ran ([`Digest`]).
//! - [`lifecycle`]: the states of deliveries, provider requests, callbacks,
//!   plugin versions and idempotency keys, and the interaction kinds.
//! - [`policy`]: what a submission and an evaluation decide, as functions of
//!   their inputs.
//! - [`standing`]: an author's strikes, derived from decisions in a window,
//!   and the account tier they reach.
//! - [`lists`]: the entries of moderators' lists in canonical form, their
//!   limits, digest and diff.
//! - [`signals`]: entity signals as rules declare them, the keys and
//!   values an item adds to them, and the buckets of their windows.
//! - [`statements`]: the policies decisions are taken under and the
//!   Transparency Database's field set of a statement of reasons.
//!
//! Every stored status or outcome column has an enum here, converted to
//! and from its string in one place ([`string_enum!`]); the migrations'
//! CHECK constraints list the same strings (a unit test compares them).

pub mod evaluation;
pub mod lifecycle;
pub mod lists;
pub mod policy;
pub mod signals;
pub mod standing;
pub mod statements;
pub mod status;
pub mod verdict;

pub use evaluation::{DecisionPhase, Digest, Mode, Outcome, Phase};
pub use lifecycle::{
    BacktestStatus, CallbackResult, DeliveryStatus, EventKind, IdempotencyState, InputKind, PluginEvent,
    PluginVersionStatus, ProviderRequestStatus,
};
pub use status::{Actor, ItemStatus, can_transition};
pub use verdict::Verdict;

/// A number as cursors and `If-Match` carry it: 1-18 ASCII digits, nothing
/// else (no sign, no space), so it is exactly what the OpenAPI patterns
/// `[0-9]{1,18}` say and always fits an `i64`.
pub fn parse_decimal(s: &str) -> Option<i64> {
    let digits = (1..=18).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_digit());
    digits.then(|| s.parse().expect("18 digits fit an i64"))
}

/// A parse failure of a [`string_enum!`] type: which type, which string.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {value:?}")]
pub struct UnknownVariant {
    pub what: &'static str,
    pub value: String,
}

/// Declares an enum stored as a string: `as_str`, `ALL`, `FromStr`,
/// `Display` and serde (the same strings) in one place.
///
/// ```text
/// string_enum! {
///     /// Doc.
///     pub enum DeliveryStatus("delivery status") { Pending = "pending", Delivered = "delivered" }
/// }
/// ```
macro_rules! string_enum {
    ($(#[$meta:meta])* pub enum $name:ident($what:literal) { $($(#[$vmeta:meta])* $variant:ident = $s:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $($(#[$vmeta])* $variant),+
        }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The stored (and serialized) string.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $s),+
                }
            }
        }

        impl ::std::str::FromStr for $name {
            type Err = $crate::domain::UnknownVariant;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($s => Ok($name::$variant),)+
                    _ => Err($crate::domain::UnknownVariant { what: $what, value: s.to_string() }),
                }
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl ::serde::Serialize for $name {
            fn serialize<S: ::serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> ::serde::Deserialize<'de> for $name {
            fn deserialize<D: ::serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <::std::borrow::Cow<'de, str> as ::serde::Deserialize>::deserialize(d)?;
                s.parse().map_err(|_| {
                    ::serde::de::Error::unknown_variant(&s, &[$($s),+])
                })
            }
        }

        impl ::utoipa::PartialSchema for $name {
            fn schema() -> ::utoipa::openapi::RefOr<::utoipa::openapi::schema::Schema> {
                ::utoipa::openapi::ObjectBuilder::new()
                    .schema_type(::utoipa::openapi::schema::Type::String)
                    .enum_values(Some([$($s),+]))
                    .into()
            }
        }

        impl ::utoipa::ToSchema for $name {}
    };
}
pub(crate) use string_enum;

#[cfg(test)]
pub(crate) mod check_constraints {
    //! The migrations' CHECK constraints name exactly the strings the enums know.

    /// All migrations of `dialect`, concatenated in order.
    fn migrations(dialect: &str) -> String {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("migrations")
            .join(dialect);
        let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
        files.sort();
        files
            .iter()
            .map(|f| std::fs::read_to_string(f).unwrap())
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The CHECK list in force for `table.column`: the last one found in a
    /// `CREATE TABLE table` (or a rebuilt `table_vN`) or in an
    /// `ADD CONSTRAINT table_column_check`, written either as
    /// `CHECK (column IN ('a', 'b'))` or as `CHECK (column = 'a' OR column = 'b')`
    /// (SQLite's form, which it checks without building a temporary table).
    fn check_list(sql: &str, table: &str, column: &str) -> Option<Vec<String>> {
        let forms = [format!("CHECK ({column} IN ("), format!("CHECK ({column} = '")];
        let mut found: Option<usize> = None;
        let mut consider = |at: usize| {
            if found.is_none_or(|f| at > f) {
                found = Some(at);
            }
        };
        for (start, _) in sql.match_indices("CREATE TABLE ") {
            let rest = &sql[start + 13..];
            let name = rest.split([' ', '(']).next().unwrap_or("");
            if name != table && !name.starts_with(&format!("{table}_v")) {
                continue;
            }
            let end = rest.find("\n);").unwrap_or(rest.len());
            for check in &forms {
                if let Some(at) = rest[..end].find(check.as_str()) {
                    consider(start + 13 + at);
                }
            }
        }
        let added = format!("ALTER TABLE {table} ADD COLUMN {column} ");
        for (start, _) in sql.match_indices(&added) {
            let line = &sql[start..sql[start..].find('\n').map_or(sql.len(), |e| start + e)];
            for check in &forms {
                if let Some(at) = line.find(check.as_str()) {
                    consider(start + at);
                }
            }
        }
        for check in &forms {
            let constraint = format!("ADD CONSTRAINT {table}_{column}_check {check}");
            for (at, _) in sql.match_indices(&constraint) {
                consider(at + constraint.len() - check.len());
            }
        }
        let at = found?;
        // The constraint's text: from `CHECK (` to its closing parenthesis.
        let body = &sql[at + "CHECK (".len()..];
        let mut depth = 1;
        let end = body.char_indices().find_map(|(i, c)| {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                _ => {}
            }
            (depth == 0).then_some(i)
        })?;
        let body = &body[..end];
        if let Some(list) = body.strip_prefix(&format!("{column} IN (")) {
            let list = list.strip_suffix(')').unwrap_or(list);
            return Some(
                list.split(',')
                    .map(|s| s.trim().trim_matches('\'').to_string())
                    .collect(),
            );
        }
        body.split(" OR ")
            .map(|term| {
                let value = term.split_whitespace().collect::<Vec<_>>().join(" ");
                value
                    .strip_prefix(&format!("{column} = '"))
                    .and_then(|v| v.strip_suffix('\''))
                    .map(str::to_string)
            })
            .collect()
    }

    /// The CHECK on `table.column` in both dialects lists exactly `expected`.
    pub fn assert_mirrors(table: &str, column: &str, expected: &[&str]) {
        for dialect in ["sqlite", "postgres"] {
            let list = check_list(&migrations(dialect), table, column)
                .unwrap_or_else(|| panic!("no CHECK on {table}.{column} in the {dialect} migrations"));
            assert_eq!(list, expected, "{table}.{column} in the {dialect} migrations");
        }
    }
}
