//! Bearer tokens with roles, compared in constant time.

use super::{AppState, error::ApiError};
use crate::config::{Role, TokenConfig};
use axum::extract::FromRequestParts;
use axum::http::StatusCode;
use axum::http::request::Parts;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The configured tokens, kept as sha256 digests so every comparison is
/// between equal-length values, in constant time.
pub struct Tokens {
    entries: Vec<([u8; 32], Caller)>,
}

/// Who is calling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub name: String,
    pub role: Role,
}

impl Caller {
    /// Whether the caller may see an item submitted by `client`.
    pub fn may_read(&self, client: &str) -> bool {
        self.may_read_all() || self.name == client
    }

    /// Whether every client's items are the caller's to read (a moderator).
    pub fn may_read_all(&self) -> bool {
        self.role == Role::Moderator
    }
}

impl Tokens {
    pub fn new(tokens: &[TokenConfig]) -> Self {
        Tokens {
            entries: tokens
                .iter()
                .map(|t| {
                    (
                        Sha256::digest(t.token.as_bytes()).into(),
                        Caller {
                            name: t.name.clone(),
                            role: t.role,
                        },
                    )
                })
                .collect(),
        }
    }

    /// The sha256 of the moderator token named `name`, if one is configured
    /// (a console session lasts only while the secret it was signed in with
    /// does; names are unique).
    pub fn moderator_digest(&self, name: &str) -> Option<[u8; 32]> {
        self.entries
            .iter()
            .find(|(_, c)| c.role == Role::Moderator && c.name == name)
            .map(|(digest, _)| *digest)
    }

    /// The names of the client tokens (the scopes items are submitted in).
    pub fn client_names(&self) -> impl Iterator<Item = &str> {
        self.entries
            .iter()
            .filter(|(_, c)| c.role == Role::Client)
            .map(|(_, c)| c.name.as_str())
    }

    /// The caller a presented token belongs to. Every entry is compared, so
    /// timing does not reveal which (if any) matched.
    pub fn verify(&self, presented: &str) -> Option<Caller> {
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let mut found = None;
        for (d, caller) in &self.entries {
            if bool::from(d.ct_eq(&digest)) {
                found = Some(caller.clone());
            }
        }
        found
    }
}

fn unauthorized(message: &str) -> ApiError {
    ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let header = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .ok_or_else(|| unauthorized("missing `Authorization: Bearer TOKEN`"))?;
        let token = header
            .to_str()
            .ok()
            .and_then(|h| h.strip_prefix("Bearer "))
            .map(str::trim)
            .ok_or_else(|| unauthorized("expected `Authorization: Bearer TOKEN`"))?;
        state.tokens.verify(token).ok_or_else(|| unauthorized("unknown token"))
    }
}

/// A caller with the moderator role; client tokens get 403.
pub struct Moderator(pub Caller);

impl FromRequestParts<AppState> for Moderator {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let caller = Caller::from_request_parts(parts, state).await?;
        if caller.role != Role::Moderator {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                "this route needs a moderator token",
            ));
        }
        Ok(Moderator(caller))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_verify_by_value_only() {
        let tokens = Tokens::new(&[
            TokenConfig {
                name: "web".into(),
                token: "secret-a".into(),
                role: Role::Client,
            },
            TokenConfig {
                name: "mod".into(),
                token: "secret-b".into(),
                role: Role::Moderator,
            },
        ]);
        assert_eq!(tokens.verify("secret-a").unwrap().name, "web");
        assert_eq!(tokens.verify("secret-b").unwrap().role, Role::Moderator);
        assert!(tokens.verify("secret-").is_none());
        assert!(tokens.verify("").is_none());
    }
}
