//! What a rule component may import: the `gavel:rules` contract of
//! `wit/rules.wit`, and the few WASI interfaces that grant nothing inside
//! gavel's sandbox (streams, clocks, randomness, an empty environment).
//!
//! Everything else is refused when the file is loaded, naming the import:
//! files (`wasi:filesystem`), the network (`wasi:sockets`, `wasi:http`) and
//! any interface gavel does not know. The sandbox would give such a rule
//! nothing anyway (no preopened directory, no network), so a rule that
//! imports them was built expecting a capability it will never have; saying
//! so at `gavel plugin check` is kinder than an evaluation that fails later,
//! and a rule's imports then state exactly what it can touch.

/// The contract every rule is built against, compiled into the binary:
/// `gavel plugin new` writes this text into new rule projects, so a
/// template never carries a copy that can drift.
pub const WIT: &str = include_str!("../../../wit/rules.wit");

/// The package name of the contract.
pub const PACKAGE: &str = "gavel:rules";

/// The contract version this host speaks, from the `package` line of [`WIT`].
pub fn host_version() -> &'static str {
    static VERSION: std::sync::OnceLock<&str> = std::sync::OnceLock::new();
    VERSION.get_or_init(|| version_in(WIT).expect("wit/rules.wit declares `package gavel:rules@VERSION;`"))
}

/// The version a WIT text declares for the contract package, if it does.
pub fn version_in(wit: &str) -> Option<&str> {
    wit.lines()
        .find_map(|l| l.trim().strip_prefix("package gavel:rules@"))
        .map(|v| v.trim_end_matches(';').trim())
}

/// WASI interfaces a rule may import because the sandbox makes them
/// harmless: output is captured into the host log, the environment and
/// stdin are empty, clocks and randomness reveal nothing of the host.
/// Language runtimes (CPython, a JS engine, Rust's std) import some of these.
const HARMLESS_WASI: &[&str] = &[
    "wasi:io/error",
    "wasi:io/poll",
    "wasi:io/streams",
    "wasi:clocks/monotonic-clock",
    "wasi:clocks/wall-clock",
    "wasi:random/random",
    "wasi:random/insecure",
    "wasi:random/insecure-seed",
    "wasi:cli/environment",
    "wasi:cli/exit",
    "wasi:cli/stdin",
    "wasi:cli/stdout",
    "wasi:cli/stderr",
    "wasi:cli/terminal-input",
    "wasi:cli/terminal-output",
    "wasi:cli/terminal-stdin",
    "wasi:cli/terminal-stdout",
    "wasi:cli/terminal-stderr",
];

/// One import of a component, judged against the contract.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Import {
    /// An interface of the `gavel:rules` package, at this version.
    Contract { version: String },
    /// A WASI interface that grants nothing in the sandbox.
    Harmless,
    /// Outside the contract: the import's name and what it would grant.
    Refused { name: String, grants: &'static str },
}

/// Judges one import name, e.g. `wasi:filesystem/types@0.2.3`.
pub fn classify(name: &str) -> Import {
    let (path, version) = name.split_once('@').unwrap_or((name, ""));
    if let Some(rest) = path.strip_prefix(PACKAGE)
        && rest.starts_with('/')
    {
        return Import::Contract {
            version: version.to_string(),
        };
    }
    if HARMLESS_WASI.contains(&path) {
        return Import::Harmless;
    }
    let grants = if path.starts_with("wasi:filesystem/") {
        "files"
    } else if path.starts_with("wasi:sockets/") {
        "network sockets"
    } else if path.starts_with("wasi:http/") {
        "HTTP requests"
    } else if path.starts_with("wasi:") {
        "a WASI capability gavel does not grant"
    } else {
        "an interface outside the gavel:rules contract"
    };
    Import::Refused {
        name: name.to_string(),
        grants,
    }
}

/// What a component's imports say about it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Imports {
    /// The `gavel:rules` version it was built against (`None` when it
    /// imports no interface of the contract, e.g. a rule that never logs
    /// and whose types were all inlined).
    pub contract: Option<String>,
    /// Imports outside the contract, in the component's order.
    pub refused: Vec<(String, &'static str)>,
    /// Another `gavel:rules` version than `contract`, if the component
    /// imports two (it cannot be linked consistently).
    pub mixed: Option<String>,
}

impl Imports {
    /// Judges every import name of a component.
    pub fn judge<'a>(names: impl IntoIterator<Item = &'a str>) -> Imports {
        let mut out = Imports::default();
        for name in names {
            match classify(name) {
                Import::Contract { version } => match &out.contract {
                    None => out.contract = Some(version),
                    Some(first) if *first != version => out.mixed = Some(version),
                    Some(_) => {}
                },
                Import::Harmless => {}
                Import::Refused { name, grants } => out.refused.push((name, grants)),
            }
        }
        out
    }

    /// The refusal message, naming every import outside the contract and
    /// how each language builds a rule without them; `None` when none.
    pub fn refusal(&self) -> Option<String> {
        if let (Some(first), Some(other)) = (&self.contract, &self.mixed) {
            return Some(format!(
                "imports two versions of the {PACKAGE} contract ({first} and {other}); build it against one"
            ));
        }
        if self.refused.is_empty() {
            return None;
        }
        let list: Vec<String> = self.refused.iter().map(|(n, g)| format!("{n} ({g})")).collect();
        Some(format!(
            "imports outside the {PACKAGE} contract: {}. A rule judges only its snapshot: it gets no files \
             and no network. Rust: drop the code that uses them (std::fs, std::net); Python: build with \
             `componentize-py ... componentize --stub-wasi`; JavaScript: build with `jco componentize ... -d all`",
            list.join(", ")
        ))
    }
}

/// Whether a contract version `built` runs on this host, and if it is older,
/// a warning that says so. Versions compare by semver: within `0.x`, the
/// minor version must match; `1.x` and later, the major. A component built
/// against a newer contract than the host's may use what the host lacks, so
/// it is refused too.
pub fn compatibility(built: &str) -> Result<Option<String>, String> {
    compatibility_with(built, host_version())
}

fn compatibility_with(built: &str, host: &str) -> Result<Option<String>, String> {
    let parse = |v: &str| -> Option<(u64, u64, u64)> {
        let mut it = v.split(['.', '-', '+']).map(|p| p.parse::<u64>());
        Some((it.next()?.ok()?, it.next()?.ok()?, it.next()?.ok()?))
    };
    let (Some(b), Some(h)) = (parse(built), parse(host)) else {
        return Err(format!(
            "{PACKAGE}@{built} is not a version this host understands ({host})"
        ));
    };
    let compatible = if h.0 == 0 { b.0 == 0 && b.1 == h.1 } else { b.0 == h.0 };
    if !compatible {
        return Err(format!(
            "built against {PACKAGE}@{built}; this host speaks {PACKAGE}@{host}: rebuild the rule against the \
             host's WIT (`gavel plugin new` writes it; Rust rules: update gavel-plugin-sdk)"
        ));
    }
    if b > h {
        return Err(format!(
            "built against {PACKAGE}@{built}, newer than this host's {PACKAGE}@{host}: upgrade gavel, \
             or rebuild the rule against the host's WIT"
        ));
    }
    Ok((b < h).then(|| {
        format!(
            "built against {PACKAGE}@{built}, older than this host's {PACKAGE}@{host}: it loads, but \
             rebuild it to see what the newer contract adds"
        )
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_version_comes_from_the_wit_file() {
        let v = host_version();
        assert!(WIT.contains(&format!("package gavel:rules@{v};")), "{v}");
        assert_eq!(v.split('.').count(), 3);
    }

    #[test]
    fn imports_are_judged_by_interface() {
        assert_eq!(
            classify("gavel:rules/host@0.2.0"),
            Import::Contract {
                version: "0.2.0".into()
            }
        );
        assert_eq!(classify("wasi:io/streams@0.2.9"), Import::Harmless);
        assert_eq!(classify("wasi:cli/stderr@0.2.3"), Import::Harmless);
        for (name, grants) in [
            ("wasi:filesystem/preopens@0.2.3", "files"),
            ("wasi:sockets/tcp@0.2.9", "network sockets"),
            ("wasi:http/outgoing-handler@0.2.3", "HTTP requests"),
            ("wasi:keyvalue/store@0.2.0", "a WASI capability gavel does not grant"),
            (
                "gavel:rulesx/host@0.2.0",
                "an interface outside the gavel:rules contract",
            ),
            ("evil", "an interface outside the gavel:rules contract"),
        ] {
            assert_eq!(
                classify(name),
                Import::Refused {
                    name: name.into(),
                    grants
                },
                "{name}"
            );
        }
    }

    #[test]
    fn a_refusal_names_every_import_outside_the_contract() {
        let imports = Imports::judge([
            "wasi:io/error@0.2.3",
            "wasi:filesystem/types@0.2.3",
            "gavel:rules/types@0.2.0",
            "wasi:sockets/tcp@0.2.3",
        ]);
        assert_eq!(imports.contract.as_deref(), Some("0.2.0"));
        let msg = imports.refusal().expect("refused");
        assert!(msg.contains("wasi:filesystem/types@0.2.3 (files)"), "{msg}");
        assert!(msg.contains("wasi:sockets/tcp@0.2.3 (network sockets)"), "{msg}");
        assert!(!msg.contains("wasi:io"), "{msg}");
        assert_eq!(Imports::judge(["gavel:rules/host@0.2.0"]).refusal(), None);
        let mixed = Imports::judge(["gavel:rules/types@0.2.0", "gavel:rules/host@0.2.1"]).refusal();
        assert!(mixed.is_some_and(|m| m.contains("two versions")));
    }

    #[test]
    fn versions_are_compatible_within_the_host_minor() {
        assert_eq!(compatibility(host_version()), Ok(None));
        // 0.x: the minor decides; an older patch warns, a newer one is refused.
        assert_eq!(compatibility_with("0.2.3", "0.2.3"), Ok(None));
        assert!(compatibility_with("0.2.1", "0.2.3").unwrap().unwrap().contains("older"));
        assert!(
            compatibility_with("0.2.4", "0.2.3")
                .unwrap_err()
                .contains("newer than this host")
        );
        assert!(compatibility_with("0.1.9", "0.2.3").is_err());
        assert!(compatibility_with("0.3.0", "0.2.3").is_err());
        assert!(compatibility_with("1.2.3", "0.2.3").is_err());
        // 1.x and later: the major decides.
        assert!(compatibility_with("1.1.0", "1.2.0").unwrap().is_some());
        assert!(compatibility_with("1.3.0", "1.2.0").unwrap_err().contains("newer"));
        assert!(compatibility_with("2.0.0", "1.2.0").is_err());
        assert!(compatibility_with("banana", "0.2.3").is_err());
    }
}
