//! `gavel plugin new`: writes a complete rule project that builds as it is,
//! from templates compiled into the binary (`host/templates/`). The contract
//! a template builds against is the one this binary speaks:
//! `rules::contract::WIT` is written into Python and JavaScript projects,
//! and a Rust project's SDK is checked to carry the same text.
//!
//! A plugin name never becomes an identifier that could collide: the Rust
//! rule's type is the name in CamelCase with `Rule` appended (`self` makes
//! `SelfRule`, `ok` makes `OkRule`: no keyword, no prelude name, nothing the
//! template imports ends in `Rule` after a non-empty stem), and in Python
//! and JavaScript the name only ever appears inside string literals. What is
//! refused is what Cargo cannot build under that package name.

use crate::rules::{contract, valid_name};
use anyhow::{Context, bail};
use std::path::{Path, PathBuf};

/// The languages a rule project can be written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    Rust,
    Python,
    /// JavaScript, type-checked through JSDoc against types from the WIT.
    Js,
    /// TypeScript.
    Ts,
}

/// `(path in the project, template text)`.
type Template = (&'static str, &'static str);

const CASES: Template = ("cases.json", include_str!("../../templates/cases.json"));

const RUST: &[Template] = &[
    ("Cargo.toml", include_str!("../../templates/rust/Cargo.toml")),
    (
        ".cargo/config.toml",
        include_str!("../../templates/rust/.cargo/config.toml"),
    ),
    ("src/lib.rs", include_str!("../../templates/rust/src/lib.rs")),
    ("README.md", include_str!("../../templates/rust/README.md")),
    (".gitignore", include_str!("../../templates/rust/.gitignore")),
    CASES,
];

const PYTHON: &[Template] = &[
    ("app.py", include_str!("../../templates/python/app.py")),
    ("README.md", include_str!("../../templates/python/README.md")),
    (".gitignore", include_str!("../../templates/python/.gitignore")),
    CASES,
];

/// Shared by JavaScript and TypeScript; the source file is added per language.
const JS: &[Template] = &[
    ("package.json", include_str!("../../templates/js/package.json")),
    (
        "package-lock.json",
        include_str!("../../templates/js/package-lock.json"),
    ),
    ("tsconfig.json", include_str!("../../templates/js/tsconfig.json")),
    ("README.md", include_str!("../../templates/js/README.md")),
    (".gitignore", include_str!("../../templates/js/.gitignore")),
    CASES,
];
const JS_SOURCE: Template = ("rule.js", include_str!("../../templates/js/rule.js"));
const TS_SOURCE: Template = ("rule.ts", include_str!("../../templates/js/rule.ts"));

/// The SDK of the checkout this binary was built from, if it is still there.
const BUILT_FROM_SDK: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../plugin-sdk");

/// Writes a new rule project named `name` in `lang` into `dir`.
pub fn write_project(name: &str, lang: Lang, dir: &Path, sdk: Option<&Path>) -> anyhow::Result<()> {
    if !valid_name(name) {
        bail!("{name:?} is not a plugin name: use 1-64 lowercase letters, digits and '-', not starting with '-'");
    }
    if lang == Lang::Rust {
        refuse_rust_crate_name(name)?;
    }
    if dir.exists() && std::fs::read_dir(dir)?.next().is_some() {
        bail!("{} already exists and is not empty", dir.display());
    }
    let sdk = match lang {
        Lang::Rust => Some(find_sdk(sdk)?),
        _ => None,
    };
    let vars = Vars {
        name,
        sdk: sdk.as_deref(),
        source: match lang {
            Lang::Ts => TS_SOURCE.0,
            _ => JS_SOURCE.0,
        },
        language: if lang == Lang::Ts { "TypeScript" } else { "JavaScript" },
    };
    let mut files: Vec<Template> = match lang {
        Lang::Rust => RUST.to_vec(),
        Lang::Python => PYTHON.to_vec(),
        Lang::Js => [JS, &[JS_SOURCE]].concat(),
        Lang::Ts => [JS, &[TS_SOURCE]].concat(),
    };
    // The one contract, from this binary: Python and JavaScript build against
    // it directly; a Rust rule builds against it through the SDK.
    if lang != Lang::Rust {
        files.push(("wit/rules.wit", contract::WIT));
    }
    for (path, text) in &files {
        let dest = dir.join(path);
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        }
        let text = if *path == "wit/rules.wit" {
            text.to_string()
        } else {
            vars.fill(text)
        };
        std::fs::write(&dest, text).with_context(|| format!("writing {}", dest.display()))?;
    }
    print_next_steps(name, lang, dir);
    Ok(())
}

/// The crates of Rust's standard library: a rule's library of the same
/// name would shadow it in its own doctests and harness (Cargo refuses
/// `test` and warns about the others).
const STANDARD_CRATES: &[&str] = &["std", "core", "alloc", "proc-macro", "test"];

/// The SDK every Rust rule depends on, which its package cannot also be.
const SDK_PACKAGE: &str = "gavel-plugin-sdk";

/// Refuses the names a Rust rule's package cannot have.
fn refuse_rust_crate_name(name: &str) -> anyhow::Result<()> {
    if name.starts_with(|c: char| c.is_ascii_digit()) {
        bail!(
            "{name:?} starts with a digit, which Cargo refuses as a package name: start a Rust rule's name with a letter"
        );
    }
    if STANDARD_CRATES.contains(&name) {
        bail!(
            "{name:?} is the name of a crate of Rust's standard library ({}), which a Rust rule's crate \
             would shadow: choose another name",
            STANDARD_CRATES.join(", ")
        );
    }
    if name == SDK_PACKAGE {
        bail!("{name:?} is the name of the SDK a Rust rule depends on: choose another name");
    }
    Ok(())
}

/// Placeholder values of the templates.
struct Vars<'a> {
    name: &'a str,
    sdk: Option<&'a Path>,
    source: &'a str,
    language: &'a str,
}

impl Vars<'_> {
    fn fill(&self, text: &str) -> String {
        text.replace("{{name}}", self.name)
            .replace("{{sdk_toml}}", &self.sdk_toml())
            .replace("{{crate}}", &self.name.replace('-', "_"))
            .replace("{{Type}}", &self.type_name())
            .replace("{{contract}}", contract::host_version())
            .replace("{{sdk}}", &self.sdk())
            .replace("{{source}}", self.source)
            .replace("{{language}}", self.language)
    }

    /// The Rust rule's type: the name in CamelCase, then `Rule`. The suffix
    /// keeps it clear of keywords (`self`), of the prelude (`ok`, `some`,
    /// `string`) and of what the template imports (`rule`, `decision`,
    /// `plugin-info`, `snapshot-builder`).
    fn type_name(&self) -> String {
        let stem: String = self
            .name
            .split('-')
            .filter(|p| !p.is_empty())
            .map(|p| {
                let mut c = p.chars();
                c.next()
                    .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                    .unwrap_or_default()
            })
            .collect();
        stem + "Rule"
    }

    fn sdk(&self) -> String {
        self.sdk.map(|p| p.display().to_string()).unwrap_or_default()
    }

    /// The SDK's path as a TOML string, whatever it holds (quotes, backslashes).
    fn sdk_toml(&self) -> String {
        toml::Value::String(self.sdk()).to_string()
    }
}

/// The `plugin-sdk` directory a Rust rule depends on: the one given, or the
/// checkout this binary was built from. Its bindings are generated from
/// `../wit/rules.wit`, which must be this binary's contract.
fn find_sdk(given: Option<&Path>) -> anyhow::Result<PathBuf> {
    let candidate = given
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(BUILT_FROM_SDK));
    let sdk = candidate.canonicalize().map_err(|_| {
        anyhow::anyhow!(
            "gavel-plugin-sdk not found at {}: pass --sdk PATH (the plugin-sdk directory of the gavel \
             checkout this binary was built from) or set GAVEL_SDK",
            candidate.display()
        )
    })?;
    if !sdk.join("Cargo.toml").is_file() {
        bail!("{} is not the gavel-plugin-sdk crate (no Cargo.toml)", sdk.display());
    }
    let wit = sdk.join("../wit/rules.wit");
    let theirs = std::fs::read_to_string(&wit).with_context(|| format!("reading the SDK's {}", wit.display()))?;
    if theirs != contract::WIT {
        let version = contract::version_in(&theirs).unwrap_or("an unknown version");
        bail!(
            "the SDK at {} builds against {} ({version}), not this gavel's contract ({}): use the SDK \
             of the same gavel checkout",
            sdk.display(),
            wit.display(),
            contract::host_version()
        );
    }
    Ok(sdk)
}

fn print_next_steps(name: &str, lang: Lang, dir: &Path) {
    let d = dir.display();
    let language = match lang {
        Lang::Rust => "Rust",
        Lang::Python => "Python",
        Lang::Js => "JavaScript",
        Lang::Ts => "TypeScript",
    };
    println!("wrote a {language} rule `{name}` into {d}");
    match lang {
        Lang::Rust => println!(
            "next:\n  cd {d}\n  cargo test\n  cargo build --release --target wasm32-wasip2\n  \
             gavel plugin test target/wasm32-wasip2/release/{}.wasm --cases cases.json",
            name.replace('-', "_")
        ),
        Lang::Python => println!(
            "next:\n  cd {d}\n  componentize-py -d wit -w rule componentize --stub-wasi app -o {name}.wasm\n  \
             gavel plugin test {name}.wasm --cases cases.json"
        ),
        Lang::Js | Lang::Ts => println!(
            "next:\n  cd {d}\n  npm ci\n  npm run check\n  npm run build\n  \
             gavel plugin test {name}.wasm --cases cases.json"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_fill_every_placeholder() {
        let vars = Vars {
            name: "watch-words",
            sdk: Some(Path::new("/sdk")),
            source: "rule.ts",
            language: "TypeScript",
        };
        for (path, text) in RUST.iter().chain(PYTHON).chain(JS).chain([&JS_SOURCE, &TS_SOURCE]) {
            let filled = vars.fill(text);
            assert!(!filled.contains("{{"), "{path} keeps a placeholder:\n{filled}");
        }
        assert!(vars.fill(RUST[2].1).contains("pub struct WatchWordsRule;"));
        let odd = Vars {
            sdk: Some(Path::new("/a \"quoted\" \\ dir")),
            ..vars
        };
        let manifest: toml::Value = toml::from_str(&odd.fill(RUST[0].1)).expect("the manifest is TOML");
        assert_eq!(
            manifest["dependencies"]["gavel-plugin-sdk"]["path"].as_str(),
            Some("/a \"quoted\" \\ dir")
        );
        assert!(
            vars.fill(JS_SOURCE.1)
                .contains(&format!("gavel:rules/host@{}", contract::host_version()))
        );
    }

    #[test]
    fn type_names_are_rust_identifiers() {
        let vars = |name| Vars {
            name,
            sdk: None,
            source: "",
            language: "",
        };
        assert_eq!(vars("a-b-c").fill("{{Type}}"), "ABCRule");
        assert_eq!(vars("watch-words-2").fill("{{Type}}"), "WatchWords2Rule");
        // Keywords, the prelude and the template's imports stay clear.
        assert_eq!(vars("self").fill("{{Type}}"), "SelfRule");
        assert_eq!(vars("ok").fill("{{Type}}"), "OkRule");
        assert_eq!(vars("plugin-info").fill("{{Type}}"), "PluginInfoRule");
    }

    #[test]
    fn a_bad_name_or_a_full_directory_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(write_project("Bad Name", Lang::Python, &tmp.path().join("x"), None).is_err());
        std::fs::write(tmp.path().join("keep"), "x").unwrap();
        let err = write_project("ok", Lang::Python, tmp.path(), None).unwrap_err();
        assert!(err.to_string().contains("not empty"), "{err}");
        let err = write_project("2fast", Lang::Rust, &tmp.path().join("r"), None).unwrap_err();
        assert!(err.to_string().contains("starts with a digit"), "{err}");
        for name in ["std", "core", "alloc", "proc-macro", "test"] {
            let err = write_project(name, Lang::Rust, &tmp.path().join("r"), None).unwrap_err();
            assert!(err.to_string().contains("standard library"), "{err}");
        }
        let err = write_project("gavel-plugin-sdk", Lang::Rust, &tmp.path().join("r"), None).unwrap_err();
        assert!(err.to_string().contains("the SDK"), "{err}");
        assert!(!tmp.path().join("r").exists());
        assert_eq!(std::fs::read_to_string(tmp.path().join("keep")).unwrap(), "x");
    }
}
