//! `/openapi.json` describes every route the server answers, each answer's schema, and
//! the bearer scheme; it is served without a token.

use sluice_engine::JobState;

use super::{Served, http};

#[test]
fn the_document_describes_every_route_and_needs_no_token() {
    let served = Served::start(Some("secret"));
    served.wait_for(JobState::Running);
    let reply = http::get(served.addr(), "/openapi.json");
    assert_eq!(reply.code, 200, "{}", reply.body);
    let document = reply.json();
    assert!(document["openapi"].as_str().is_some_and(|v| v.starts_with("3.")), "{document}");
    let paths = document["paths"].as_object().expect("paths");
    for (path, method) in [
        ("/healthz", "get"),
        ("/readyz", "get"),
        ("/status", "get"),
        ("/status/stream", "get"),
        ("/metrics", "get"),
        ("/graph", "get"),
        ("/stop", "post"),
        ("/checkpoint", "post"),
        ("/pause", "post"),
        ("/resume", "post"),
        ("/query", "post"),
        ("/openapi.json", "get"),
        ("/", "get"),
    ] {
        let operation = &paths.get(path).unwrap_or_else(|| panic!("{path} missing: {document}"))[method];
        assert!(operation["responses"].is_object(), "{path} {method}: {operation}");
        // Every route of the document is answered (with the token: not 404 nor 405).
        if method == "get" && path != "/status/stream" {
            let answer = http::request(served.addr(), "GET", path, &[("Authorization", "Bearer secret")]);
            assert!([200, 503].contains(&answer.code), "{path}: {answer:?}");
        }
    }
    assert_eq!(paths.len(), 13, "no route undocumented or extra: {:?}", paths.keys());
    let scheme = &document["components"]["securitySchemes"]["bearer"];
    assert_eq!((scheme["type"].as_str(), scheme["scheme"].as_str()), (Some("http"), Some("bearer")), "{document}");
    for schema in
        ["StatusDocument", "Graph", "Node", "Edge", "Readiness", "ErrorBody", "CheckpointTaken", "QueryRequest"]
    {
        assert!(document["components"]["schemas"][schema].is_object(), "{schema} missing: {document}");
    }
}
