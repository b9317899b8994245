//! The signing secrets of every webhook endpoint and provider, and their
//! rotation without a restart.
//!
//! An endpoint's secrets come from its inline `secret` (fixed for the life
//! of the process), or else from a secrets file: `secrets_file`, by default
//! `DATA_DIR/secrets/webhooks.NAME` (`providers.NAME` for a provider),
//! generated with one fresh `whsec_` secret on first start, as API tokens
//! are. The file holds one secret per line (`#` starts a comment); every
//! secret in it signs, and any of them verifies. It is read again whenever
//! it changes (looked at no more than every [`RECHECK`]), so rotating is:
//! add a line, let receivers switch, remove the old line. A file that
//! becomes unreadable or holds no valid secret is ignored (with an error in
//! the log) and the last good set stays in force.

use crate::config::Config;
use crate::signing::Secret;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// How often a secrets file is looked at for changes, at most.
pub const RECHECK: Duration = Duration::from_millis(250);

/// The secrets of one endpoint.
pub struct SecretSet {
    /// `webhooks.NAME` or `providers.NAME`, for log lines.
    what: String,
    file: Option<PathBuf>,
    state: Mutex<Loaded>,
}

struct Loaded {
    secrets: Arc<[Secret]>,
    stamp: Option<FileStamp>,
    checked: Instant,
}

/// What tells that a file changed: its modification time, size and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileStamp {
    modified: Option<SystemTime>,
    len: u64,
    inode: u64,
}

impl FileStamp {
    fn of(path: &Path) -> std::io::Result<FileStamp> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path)?;
        Ok(FileStamp {
            modified: meta.modified().ok(),
            len: meta.len(),
            inode: meta.ino(),
        })
    }
}

impl SecretSet {
    /// One fixed secret (`secret = "…"` in the configuration).
    pub fn inline(what: &str, text: &str) -> anyhow::Result<SecretSet> {
        let secret = Secret::parse(text).map_err(|e| anyhow::anyhow!("configuration: {what}.secret: {e}"))?;
        Ok(SecretSet {
            what: what.to_string(),
            file: None,
            state: Mutex::new(Loaded {
                secrets: Arc::from([secret]),
                stamp: None,
                checked: Instant::now(),
            }),
        })
    }

    /// The secrets in `path`, generated (one `whsec_` secret, mode 0600)
    /// when the file does not exist.
    pub fn file(what: &str, path: &Path) -> anyhow::Result<SecretSet> {
        if !path.exists() {
            generate_file(what, path)?;
        }
        let stamp = FileStamp::of(path)?;
        let secrets = read_file(path).map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
        Ok(SecretSet {
            what: what.to_string(),
            file: Some(path.to_path_buf()),
            state: Mutex::new(Loaded {
                secrets,
                stamp: Some(stamp),
                checked: Instant::now(),
            }),
        })
    }

    /// The secrets in force now (the file read again if it changed).
    pub fn current(&self) -> Arc<[Secret]> {
        let mut state = self.state.lock().expect("not poisoned");
        if let Some(path) = &self.file
            && state.checked.elapsed() >= RECHECK
        {
            state.checked = Instant::now();
            self.reload_if_changed(path, &mut state);
        }
        state.secrets.clone()
    }

    fn reload_if_changed(&self, path: &Path, state: &mut Loaded) {
        let stamp = match FileStamp::of(path) {
            Ok(stamp) => stamp,
            Err(e) => {
                if state.stamp.take().is_some() {
                    tracing::error!(what = %self.what, path = %path.display(), error = %e, "cannot read the secrets file; keeping the secrets in force");
                }
                return;
            }
        };
        if state.stamp == Some(stamp) {
            return;
        }
        state.stamp = Some(stamp);
        match read_file(path) {
            Ok(secrets) => {
                tracing::info!(what = %self.what, path = %path.display(), secrets = secrets.len(), "secrets file changed; signing with its secrets");
                state.secrets = secrets;
            }
            Err(e) => {
                tracing::error!(what = %self.what, path = %path.display(), error = %e, "secrets file is not valid; keeping the secrets in force")
            }
        }
    }
}

/// Reads a secrets file: one secret per line, `#` comments, at least one.
fn read_file(path: &Path) -> anyhow::Result<Arc<[Secret]>> {
    let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let secrets = text
        .lines()
        .map(|line| line.split('#').next().unwrap_or_default().trim())
        .enumerate()
        .filter(|(_, line)| !line.is_empty())
        .map(|(n, line)| Secret::parse(line).map_err(|e| anyhow::anyhow!("{} line {}: {e}", path.display(), n + 1)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    anyhow::ensure!(!secrets.is_empty(), "{} holds no secret", path.display());
    Ok(secrets.into())
}

fn generate_file(what: &str, path: &Path) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", path.display()))?;
    writeln!(
        f,
        "# Signing secrets of {what}, generated by gavel. Keep this file secret.\n\
         # One per line; every line signs. To rotate: add a line (`gavel secret`), let the\n\
         # receiver switch to it, then remove the old line. Read again when it changes.\n{}",
        Secret::generate()
    )?;
    tracing::warn!(%what, path = %path.display(), "no secret configured: generated one");
    eprintln!("gavel: generated the signing secret of {what} in {}", path.display());
    Ok(())
}

/// Every endpoint's and provider's secrets, built once at start.
#[derive(Default)]
pub struct Keyring {
    webhooks: BTreeMap<String, Arc<SecretSet>>,
    providers: BTreeMap<String, Arc<SecretSet>>,
}

impl Keyring {
    /// Loads (or generates) the secrets of every configured webhook endpoint and provider.
    pub fn load(config: &Config) -> anyhow::Result<Keyring> {
        let set = |kind: &str, name: &str, secret: &str, file: &Option<PathBuf>| -> anyhow::Result<Arc<SecretSet>> {
            let what = format!("{kind}.{name}");
            Ok(Arc::new(if secret.is_empty() {
                let path = file
                    .clone()
                    .unwrap_or_else(|| config.data_dir.join("secrets").join(&what));
                SecretSet::file(&what, &path)?
            } else {
                SecretSet::inline(&what, secret)?
            }))
        };
        let mut keyring = Keyring::default();
        for (name, w) in &config.webhooks {
            keyring
                .webhooks
                .insert(name.clone(), set("webhooks", name, &w.secret, &w.secrets_file)?);
        }
        for (name, p) in &config.providers {
            keyring
                .providers
                .insert(name.clone(), set("providers", name, &p.secret, &p.secrets_file)?);
        }
        Ok(keyring)
    }

    /// The secrets of webhook endpoint `name` in force now.
    pub fn webhook(&self, name: &str) -> Option<Arc<[Secret]>> {
        self.webhooks.get(name).map(|s| s.current())
    }

    /// The secrets of provider `name` in force now.
    pub fn provider(&self, name: &str) -> Option<Arc<[Secret]>> {
        self.providers.get(name).map(|s| s.current())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secrets_file_is_generated_then_read_again_when_it_changes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secrets/webhooks.platform");
        let set = SecretSet::file("webhooks.platform", &path).unwrap();
        let generated = std::fs::read_to_string(&path).unwrap();
        let first = generated.lines().find(|l| !l.starts_with('#')).unwrap().to_string();
        assert!(first.starts_with("whsec_"));
        assert_eq!(&*set.current(), &[Secret::parse(&first).unwrap()]);
        let second = Secret::generate();
        std::fs::write(&path, format!("{first}\n{second} # new\n")).unwrap();
        std::thread::sleep(RECHECK);
        assert_eq!(set.current().len(), 2);
        // A broken file keeps the set in force; a fixed one takes over.
        std::fs::write(&path, "whsec_!!\n").unwrap();
        std::thread::sleep(RECHECK);
        assert_eq!(set.current().len(), 2);
        std::fs::write(&path, format!("{second}\n")).unwrap();
        std::thread::sleep(RECHECK);
        assert_eq!(&*set.current(), &[Secret::parse(&second).unwrap()]);
    }
}
