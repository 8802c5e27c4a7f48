//! `/openapi.json`: the API's OpenAPI 3.1 document and its handler, gathered from the handlers' and
//! types' descriptions (`utoipa`), so that it cannot drift from what is served. The
//! bearer scheme is declared for every endpoint but the probes and this document; the
//! server requires it off loopback, or whenever it was given a token.
//!
//! Bounds: made once, on first use, and kept.

use std::sync::OnceLock;

use axum::http::header;
use axum::response::{IntoResponse, Response};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::bodies::{CheckpointTaken, ErrorBody, NoBody, Paused, Stopping};
use crate::graph::{Edge, EdgeKind, Graph, Node, NodeKind, ThreadPressure, Unanswered};
use crate::routes;
use crate::status::{
    CheckpointSeen, MemberStatus, Readiness, SinkStatus, SourceStatus, State, StatusDocument, WorkerPlace,
};

#[derive(OpenApi)]
#[openapi(
    info(title = "Sluice admin API", description = "Watch and steer one running Sluice job."),
    paths(
        routes::healthz,
        routes::readyz,
        routes::status_document,
        routes::status_stream,
        routes::metrics_text,
        routes::graph_document,
        routes::stop,
        routes::checkpoint,
        routes::pause,
        routes::resume,
        crate::query::query,
        openapi_document,
        routes::page,
    ),
    components(schemas(
        StatusDocument, State, WorkerPlace, MemberStatus, SourceStatus, SinkStatus, CheckpointSeen, Readiness,
        Graph, Node, NodeKind, Edge, EdgeKind, ThreadPressure, Unanswered, ErrorBody, Stopping, CheckpointTaken, Paused, NoBody,
        crate::query::QueryRequest, crate::query::QueryFormatName,
    )),
    modifiers(&Bearer),
    security(("bearer" = [])),
)]
struct ApiDoc;

/// Declares the bearer token scheme.
struct Bearer;

impl Modify for Bearer {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme("bearer", SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)));
    }
}

/// The document as JSON text.
pub(crate) fn json() -> String {
    static DOCUMENT: OnceLock<String> = OnceLock::new();
    DOCUMENT
        .get_or_init(|| {
            let mut document = ApiDoc::openapi();
            document.info.version = env!("CARGO_PKG_VERSION").to_string();
            // Serialising a tree of strings and maps cannot fail.
            document.to_json().unwrap_or_default()
        })
        .clone()
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", tag = "meta", security(()),
    responses((status = 200, description = "The OpenAPI 3.1 document", body = Object)))]
pub(crate) async fn openapi_document() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], json()).into_response()
}
