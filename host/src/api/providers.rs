//! `POST /v1/provider-callbacks/{provider}`: an external classifier's answer.
//!
//! Authenticated by the provider's HMAC signature (not a bearer token),
//! stored with its raw payload, and applied only while its request is the
//! item's active one: a duplicate or a stale answer never overwrites a
//! newer request's outcome or a moderator's decision.

use super::AppState;
use super::error::{ApiError, ErrorBody, Path};
use super::validate;
use crate::domain::{CallbackResult, Verdict};
use crate::providers::Callback;
use crate::store::{CallbackOutcome, NewCallback};
use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use serde::Serialize;
use utoipa::ToSchema;

/// What a callback did.
#[derive(Debug, Serialize, ToSchema)]
pub struct CallbackResponse {
    /// `applied`, `duplicate` or `stale`.
    pub outcome: &'static str,
    /// The item's version after an applied callback.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub item_version: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// A provider's signed answer, per Standard Webhooks: `webhook-id`,
/// `webhook-timestamp: SECONDS` and `webhook-signature: v1,BASE64` (HMAC-SHA256
/// of `ID.TIMESTAMP.BODY`; any of the provider's secrets). During the
/// migration window (`legacy_headers`), `X-Gavel-Timestamp` and
/// `X-Gavel-Signature: sha256=HEX` over `TIMESTAMP.BODY` are accepted too.
/// 200 applied or duplicate, 202 stale (recorded, not applied), 401 bad or
/// old signature, 404 unknown provider, item or request.
#[utoipa::path(
    post, path = "/v1/provider-callbacks/{provider}", tag = "providers",
    request_body = Callback,
    params(
        ("provider" = String, Path),
        ("webhook-id" = Option<String>, Header, description = "The message's id (Standard Webhooks)"),
        ("webhook-timestamp" = Option<String>, Header, description = "Unix seconds; at most 5 minutes old"),
        ("webhook-signature" = Option<String>, Header, description = "v1,BASE64 over ID.TIMESTAMP.BODY; several space-separated"),
        ("X-Gavel-Timestamp" = Option<String>, Header, description = "Legacy (migration window): Unix seconds"),
        ("X-Gavel-Signature" = Option<String>, Header, description = "Legacy (migration window): sha256=HEX over TIMESTAMP.BODY"),
    ),
    responses(
        (status = 200, body = CallbackResponse), (status = 202, body = CallbackResponse),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
    )
)]
pub async fn callback(
    State(state): State<AppState>,
    Path(provider): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<(StatusCode, Json<CallbackResponse>), ApiError> {
    let count = |outcome: &'static str| {
        state
            .metrics
            .provider_callbacks
            .get_or_create(&crate::metrics::OutcomeLabel { outcome })
            .inc();
    };
    validate::path_id("provider", &provider)?;
    if !state.config.providers.contains_key(&provider) {
        return Err(ApiError::not_found("provider"));
    }
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let secrets = state
        .keyring
        .provider(&provider)
        .expect("every configured provider has its secrets");
    if let Err(e) = crate::signing::verify(
        &secrets,
        state.config.legacy_headers,
        header,
        &body,
        crate::signing::now_secs(),
    ) {
        count("bad_signature");
        tracing::warn!(%provider, error = %e, "provider callback refused");
        return Err(ApiError::new(StatusCode::UNAUTHORIZED, "bad_signature", e.to_string()));
    }
    let mut new = parse_callback(&provider, &body)?;
    // A provider's verdict that weighs against the author: the store marks
    // the author in the callback's transaction, and the author is queued.
    new.weighs = state.standing.enabled
        && state.standing.weighs(
            crate::domain::Mode::Enforce,
            true,
            crate::domain::Outcome::Ok,
            Some(new.verdict),
            &new.labels,
        );
    let span = tracing::info_span!(
        "provider.callback",
        %provider, item = %new.item_id, request_key = %new.request_key, event_id = %new.event_id
    );
    let outcome = {
        use tracing::Instrument;
        state.store.apply_callback(&new).instrument(span.clone()).await?
    };
    if new.weighs
        && matches!(outcome, CallbackOutcome::Applied { .. })
        && let Ok(Some(item)) = state.store.item(&new.item_id).await
    {
        state.scheduler.schedule_author(&item.client, &item.author).await;
    }
    let _enter = span.enter();
    answer(outcome, new.verdict, count)
}

/// The response to a stored callback (and its count).
fn answer(
    outcome: CallbackOutcome,
    verdict: Verdict,
    count: impl Fn(&'static str),
) -> Result<(StatusCode, Json<CallbackResponse>), ApiError> {
    let response = |status, outcome, item_version, detail| {
        count(outcome);
        Ok((
            status,
            Json(CallbackResponse {
                outcome,
                item_version,
                detail,
            }),
        ))
    };
    match outcome {
        CallbackOutcome::Applied { version, attempt } => {
            tracing::info!(version, attempt, %verdict, "provider callback applied");
            response(StatusCode::OK, "applied", Some(version), None)
        }
        // A repeat gets the answer its first delivery got, without effect.
        CallbackOutcome::Duplicate {
            first: CallbackResult::Stale,
        } => {
            tracing::info!("provider callback repeats a stale one; no effect");
            response(
                StatusCode::ACCEPTED,
                "stale",
                None,
                Some("a repeat of a stale callback".into()),
            )
        }
        CallbackOutcome::Duplicate { first } => {
            tracing::info!(%first, "provider callback is a duplicate; no effect");
            response(StatusCode::OK, "duplicate", None, Some(format!("already {first}")))
        }
        CallbackOutcome::Stale { detail } => {
            tracing::info!(%detail, "provider callback is stale; recorded, not applied");
            response(StatusCode::ACCEPTED, "stale", None, Some(detail))
        }
        CallbackOutcome::Unknown => {
            count("unknown");
            Err(ApiError::not_found("request for this provider and item"))
        }
    }
}

/// Reads and checks a signed callback's body.
fn parse_callback(provider: &str, body: &[u8]) -> Result<NewCallback, ApiError> {
    let cb: Callback = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request("invalid_body", format!("not a callback: {e}")))?;
    let verdict: Verdict = cb
        .verdict
        .parse()
        .ok()
        .filter(|v| *v != Verdict::Defer)
        .ok_or_else(|| ApiError::bad_request("invalid_body", "`verdict` must be allow, flag, hold or reject"))?;
    for (field, value) in [
        ("event_id", &cb.event_id),
        ("request_key", &cb.request_key),
        ("item_id", &cb.item_id),
    ] {
        validate::identifier(field, value, 512)?;
    }
    validate::text("reason", &cb.reason, 1024)?;
    if !cb.score.is_finite() {
        return Err(ApiError::bad_request("invalid_body", "`score` is not a number"));
    }
    let mut labels = cb.labels.clone();
    labels.extend(cb.label.clone());
    if labels.len() > 16 {
        return Err(ApiError::bad_request("invalid_body", "at most 16 labels"));
    }
    for l in &labels {
        validate::identifier("labels", l, 64)?;
    }
    Ok(NewCallback {
        provider: provider.to_string(),
        event_id: cb.event_id.clone(),
        request_key: cb.request_key.clone(),
        item_id: cb.item_id.clone(),
        payload: String::from_utf8_lossy(body).into_owned(),
        verdict,
        score: cb.score.clamp(0.0, 1.0),
        labels,
        reason: cb.reason.clone(),
        weighs: false,
        now: crate::clock::now_ms(),
    })
}
