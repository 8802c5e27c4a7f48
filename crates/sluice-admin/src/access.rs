//! Who may call the admin API: anyone who can reach a loopback address; elsewhere, only
//! a caller presenting the bearer token (`Authorization: Bearer <token>`), except for the
//! health probes (`/healthz`, `/readyz`), which say only whether the job lives and runs
//! (a probe, e.g. Kubernetes' kubelet, cannot read a secret into its request), the
//! API's description (`/openapi.json`) and the page's static text (`/`), which are the
//! same for every job (the page asks for the token to read the rest).
//!
//! Bounds: the comparison takes time depending only on the lengths, never on where the
//! presented token first differs; a header is read once per request, nothing is kept.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sluice_types::SluiceError;

/// Checks the access settings before anything binds: a non-loopback address needs a
/// token, and a token given must not be empty. Returns the token to require, if any.
pub(crate) fn settle(bind: SocketAddr, token: Option<String>) -> Result<Option<String>, SluiceError> {
    if let Some(token) = &token
        && token.trim().is_empty()
    {
        return Err(SluiceError::user("admin.token", "the admin API token is empty")
            .with_fix("put a non-empty secret in the --admin-token-file file (or SLUICE_ADMIN_TOKEN)"));
    }
    if token.is_none() && !bind.ip().is_loopback() {
        return Err(SluiceError::user(
            "admin.token",
            format!("the admin API would listen on {bind}, a non-loopback address, without a token"),
        )
        .with_fix(
            "give a token with --admin-token-file PATH (or SLUICE_ADMIN_TOKEN), bind a loopback address \
             (--admin-bind 127.0.0.1:0), or turn the API off (--admin-bind off)",
        ));
    }
    Ok(token)
}

/// Equal in time independent of where the bytes differ: the lengths first, then every
/// byte XOR-accumulated.
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut difference = 0u8;
    for (x, y) in a.iter().zip(b) {
        difference |= x ^ y;
    }
    difference == 0
}

/// Whether `headers` carry `Authorization: Bearer <token>`.
fn presents(headers: &HeaderMap, token: &str) -> bool {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return false;
    };
    let Some(presented) = value.as_bytes().strip_prefix(b"Bearer ") else {
        return false;
    };
    constant_time_eq(presented, token.as_bytes())
}

/// The middleware: passes the request on when no token is required or the right one is
/// presented; else 401 with a JSON body saying how to authenticate.
pub(crate) async fn require_token(State(token): State<Option<Arc<str>>>, request: Request, next: Next) -> Response {
    let probe = matches!(request.uri().path(), "/healthz" | "/readyz" | "/openapi.json" | "/");
    match &token {
        Some(token) if !probe && !presents(request.headers(), token) => unauthorized(),
        _ => next.run(request).await,
    }
}

fn unauthorized() -> Response {
    let body = serde_json::json!({
        "error": "unauthorized",
        "fix": "send the admin API token as `Authorization: Bearer <token>`",
    });
    (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, "Bearer")], axum::Json(body)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_only_when_every_byte_and_the_length_match() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
        assert!(constant_time_eq(b"", b""));
    }

    #[test]
    fn a_non_loopback_address_needs_a_token_and_a_token_is_never_empty() {
        let anywhere: SocketAddr = "0.0.0.0:0".parse().expect("addr");
        let loopback: SocketAddr = "127.0.0.1:0".parse().expect("addr");
        let refused = settle(anywhere, None).expect_err("refused");
        assert_eq!(refused.code, "admin.token");
        assert!(refused.fix.as_deref().is_some_and(|fix| fix.contains("--admin-token-file")), "{refused:?}");
        assert_eq!(settle(anywhere, Some("t".into())).expect("ok"), Some("t".into()));
        assert_eq!(settle(loopback, None).expect("ok"), None);
        assert!(settle(loopback, Some(" ".into())).is_err());
    }
}
