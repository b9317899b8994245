//! Which environment variables are settings: `GAVEL_KEY` for a top-level
//! key of the configuration, `GAVEL_KEY__SUB__...` for a key inside one of
//! its tables. Only those are read. Any other `GAVEL_*` variable, such as
//! the `GAVEL_URL` a client script exports, belongs to someone else and is
//! left alone; one that looks like a mistyped setting is named in a warning.

use figment::providers::Env;
use serde_json::Value;

/// The prefix of every setting's variable.
const PREFIX: &str = "GAVEL_";

/// Joins the keys of nested tables (`GAVEL_INGEST__MAX_BODY_BYTES`).
const NESTING: &str = "__";

/// gavel's own variables that are not settings: read by the command line
/// (`GAVEL_CONFIG`, `GAVEL_LOG_FORMAT`), the rule author's commands
/// (`GAVEL_SDK`, `GAVEL_CACHE_DIR`) and `gavel dev`
/// (`GAVEL_FAKE_PROVIDER_SECRET`). Lowercase, without the prefix.
const NOT_SETTINGS: &[&str] = &["config", "log_format", "sdk", "cache_dir", "fake_provider_secret"];

/// The configuration's top-level keys, and which of them are tables.
#[derive(Debug, Clone)]
pub struct SettingKeys {
    keys: Vec<(String, bool)>,
}

impl SettingKeys {
    /// The keys of `defaults` serialized (a configuration with every key).
    pub fn of(defaults: &impl serde::Serialize) -> Self {
        let Ok(Value::Object(map)) = serde_json::to_value(defaults) else {
            panic!("the configuration serializes to a table");
        };
        SettingKeys {
            keys: map.into_iter().map(|(k, v)| (k, v.is_object())).collect(),
        }
    }

    fn is_key(&self, name: &str) -> bool {
        self.keys.iter().any(|(k, _)| k == name)
    }

    /// The provider reading exactly the settings' variables.
    pub fn environment(&self) -> Env {
        let keys = self.clone();
        Env::prefixed(PREFIX).split(NESTING).filter(move |key| {
            let top = key.as_str().split('.').next().unwrap_or_default();
            keys.is_key(&top.to_ascii_lowercase())
        })
    }

    /// What `variable` is to gavel.
    pub fn classify(&self, variable: &str) -> Variable {
        let Some(rest) = strip_prefix(variable) else {
            return Variable::Foreign;
        };
        let rest = rest.to_ascii_lowercase();
        let top = rest.split(NESTING).next().unwrap_or_default();
        if self.is_key(top) {
            return Variable::Setting;
        }
        if NOT_SETTINGS.contains(&rest.as_str()) {
            return Variable::Foreign;
        }
        match self.suggestion(&rest) {
            Some(meant) => Variable::NearMiss {
                meant: format!("{PREFIX}{}", meant.to_ascii_uppercase()),
            },
            None => Variable::Foreign,
        }
    }

    /// The setting a mistyped `rest` (lowercase, without the prefix) most
    /// likely meant: a table's key joined with one `_` instead of `__`, or
    /// a top-level key one or two edits away.
    fn suggestion(&self, rest: &str) -> Option<String> {
        for (key, table) in &self.keys {
            if let Some(inner) = rest.strip_prefix(key.as_str()).and_then(|r| r.strip_prefix('_'))
                && *table
                && !inner.is_empty()
            {
                return Some(format!("{key}{NESTING}{inner}"));
            }
        }
        let (top, nested) = match rest.split_once(NESTING) {
            Some((top, nested)) => (top, Some(nested)),
            None => (rest, None),
        };
        // Short names are a word apart with two edits ("url" and "role").
        let allowed = if top.len() < 6 { 1 } else { 2 };
        let (key, distance) = self
            .keys
            .iter()
            .map(|(k, _)| (k, strsim::damerau_levenshtein(top, k)))
            .min_by_key(|(_, d)| *d)?;
        (distance <= allowed).then(|| match nested {
            Some(nested) => format!("{key}{NESTING}{nested}"),
            None => key.clone(),
        })
    }

    /// Says which `GAVEL_*` variables of `variables` look like a mistyped
    /// setting; they are ignored, as is every other variable that is not a
    /// setting.
    pub fn warn_about_near_misses(&self, variables: impl Iterator<Item = String>) -> Vec<String> {
        let mut warnings = Vec::new();
        for variable in variables {
            if let Variable::NearMiss { meant } = self.classify(&variable) {
                tracing::warn!("{variable} is not a setting of gavel and is ignored: did you mean {meant}?");
                warnings.push(variable);
            }
        }
        warnings
    }
}

/// What an environment variable is to gavel's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Variable {
    /// Read as a setting.
    Setting,
    /// Not a setting, and not like one: left alone.
    Foreign,
    /// Not a setting, but close to `meant`: left alone, with a warning.
    NearMiss { meant: String },
}

/// `variable` without `GAVEL_`, whatever its case (as the provider reads it).
fn strip_prefix(variable: &str) -> Option<&str> {
    let head = variable.get(..PREFIX.len())?;
    head.eq_ignore_ascii_case(PREFIX).then(|| &variable[PREFIX.len()..])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn keys() -> SettingKeys {
        SettingKeys::of(&Config::default())
    }

    #[test]
    fn only_the_configurations_keys_are_settings() {
        let keys = keys();
        for setting in [
            "GAVEL_LISTEN",
            "GAVEL_DATABASE_URL",
            "GAVEL_INGEST__MAX_BODY_BYTES",
            "GAVEL_PROVIDERS__CLASSIFIER__SECRET",
            "gavel_console__enabled",
        ] {
            assert_eq!(keys.classify(setting), Variable::Setting, "{setting}");
        }
        for foreign in [
            "GAVEL_URL",
            "GAVEL_TOKEN_FILE",
            "GAVEL_CONFIG",
            "GAVEL_LOG_FORMAT",
            "GAVEL_SDK",
            "GAVEL_CACHE_DIR",
            "GAVEL_FAULT_SEED",
            "PATH",
            "GAVEL",
        ] {
            assert_eq!(keys.classify(foreign), Variable::Foreign, "{foreign}");
        }
    }

    #[test]
    fn near_misses_name_the_setting_they_resemble() {
        let keys = keys();
        let meant = |v: &str| match keys.classify(v) {
            Variable::NearMiss { meant } => meant,
            other => panic!("{v}: {other:?}"),
        };
        assert_eq!(meant("GAVEL_LISTN"), "GAVEL_LISTEN");
        assert_eq!(meant("GAVEL_DATABASE_URI"), "GAVEL_DATABASE_URL");
        assert_eq!(meant("GAVEL_INGEST_MAX_BODY_BYTES"), "GAVEL_INGEST__MAX_BODY_BYTES");
        assert_eq!(meant("GAVEL_CONSOL__ENABLED"), "GAVEL_CONSOLE__ENABLED");
        let warned = keys.warn_about_near_misses(
            ["GAVEL_URL", "GAVEL_LISTN", "GAVEL_LISTEN"]
                .map(String::from)
                .into_iter(),
        );
        assert_eq!(warned, ["GAVEL_LISTN"]);
    }
}
