//! API tokens: who may call, in which role; generated on first start when
//! none are configured, so gavel never runs open.

use serde::{Deserialize, Serialize};
use std::path::Path;

/// An API token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    /// Who holds it; items are scoped to the submitting client's name.
    pub name: String,
    pub token: String,
    pub role: Role,
}

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Submits content and events, reads its own items.
    Client,
    /// Everything a client may, on every item, plus moderation and plugin views.
    Moderator,
}

/// Every token is at least 16 bytes, and no token or name is given twice
/// (two clients sharing a token could not be told apart).
pub fn validate_tokens(tokens: &[TokenConfig]) -> anyhow::Result<()> {
    let mut names = std::collections::HashSet::new();
    let mut values = std::collections::HashSet::new();
    for t in tokens {
        anyhow::ensure!(
            !t.name.trim().is_empty() && t.name.len() <= 64 && !t.name.chars().any(|c| c.is_control() || c == ':'),
            "configuration: a token name must be 1-64 printable characters without ':' (it separates the client \
             from the author in account event ids), got {:?}",
            t.name
        );
        anyhow::ensure!(
            t.token.len() >= 16 && t.token.bytes().all(|b| b.is_ascii_graphic()),
            "configuration: token {:?} must be at least 16 printable ASCII characters without spaces",
            t.name
        );
        anyhow::ensure!(
            names.insert(t.name.as_str()),
            "configuration: token name {:?} is given twice",
            t.name
        );
        anyhow::ensure!(
            values.insert(t.token.as_str()),
            "configuration: token {:?} has the same value as another token",
            t.name
        );
    }
    Ok(())
}

/// The tokens to accept: the configured ones, else those in
/// `DATA_DIR/tokens.toml`, generated on first start (never run open).
pub fn resolve_tokens(configured: &[TokenConfig], data_dir: &Path) -> anyhow::Result<Vec<TokenConfig>> {
    if !configured.is_empty() {
        return Ok(configured.to_vec());
    }
    let path = data_dir.join("tokens.toml");
    if path.exists() {
        return read_tokens_file(&path);
    }
    std::fs::create_dir_all(data_dir)?;
    let tokens = vec![
        TokenConfig {
            name: "default-client".into(),
            token: new_token(),
            role: Role::Client,
        },
        TokenConfig {
            name: "default-moderator".into(),
            token: new_token(),
            role: Role::Moderator,
        },
    ];
    write_tokens_file(&path, &tokens)?;
    tracing::warn!(path = %path.display(), "no API tokens configured: generated a client and a moderator token");
    eprintln!(
        "gavel: generated API tokens in {} (one client, one moderator)",
        path.display()
    );
    Ok(tokens)
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    tokens: Vec<TokenConfig>,
}

fn read_tokens_file(path: &Path) -> anyhow::Result<Vec<TokenConfig>> {
    let text = std::fs::read_to_string(path)?;
    let file: TokensFile = toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    anyhow::ensure!(!file.tokens.is_empty(), "{} lists no token", path.display());
    validate_tokens(&file.tokens).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Ok(file.tokens)
}

fn write_tokens_file(path: &Path, tokens: &[TokenConfig]) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let text = toml::to_string(&TokensFile {
        tokens: tokens.to_vec(),
    })?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(b"# gavel API tokens, generated on first start. Keep this file secret.\n")?;
    f.write_all(text.as_bytes())?;
    Ok(())
}

/// A random bearer token (256 bits from the OS generator).
pub fn new_token() -> String {
    format!("gvl_{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_short_and_duplicate_tokens_are_refused() {
        let token = |name: &str, token: &str| TokenConfig {
            name: name.into(),
            token: token.into(),
            role: Role::Client,
        };
        assert!(validate_tokens(&[token("a", "0123456789abcdef")]).is_ok());
        assert!(validate_tokens(&[token("a", "")]).is_err());
        assert!(validate_tokens(&[token("a", "short")]).is_err());
        assert!(validate_tokens(&[token("a", "0123456789abcdef 0")]).is_err());
        assert!(validate_tokens(&[token("", "0123456789abcdef")]).is_err());
        // ':' separates the client from the author in account event ids.
        let colon = validate_tokens(&[token("web:eu", "0123456789abcdef")]).unwrap_err();
        assert!(colon.to_string().contains("without ':'"), "{colon}");
        assert!(validate_tokens(&[token("a", "0123456789abcdef"), token("a", "0123456789abcdeF")]).is_err());
        assert!(validate_tokens(&[token("a", "0123456789abcdef"), token("b", "0123456789abcdef")]).is_err());
    }

    #[test]
    fn tokens_are_generated_once_and_kept() {
        let dir = tempfile_dir();
        let first = resolve_tokens(&[], &dir).unwrap();
        assert_eq!(first.len(), 2);
        assert!(first.iter().any(|t| t.role == Role::Moderator));
        assert_eq!(resolve_tokens(&[], &dir).unwrap(), first);
        let mode = std::fs::metadata(dir.join("tokens.toml")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(mode.permissions().mode() & 0o777, 0o600);
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("gavel-tokens-test-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
