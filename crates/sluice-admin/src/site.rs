//! Who may drive the API from a browser: only the API's own page. A web page the user
//! opens elsewhere runs in the same browser, on the same machine, and so reaches a
//! loopback address that needs no token; these checks keep it out.
//!
//! Three checks, on every request before any handler:
//! - **Host** must name this API: the bound address, a loopback name when bound to
//!   loopback (`localhost`, any loopback IP), any IP literal when bound to a wildcard
//!   address, or a name given with `--admin-host` (the `--advertise` host is one). A page
//!   whose name an attacker re-points at 127.0.0.1 (DNS rebinding) sends its own name,
//!   so it is refused. The port is not compared: a port forward changes it, a rebinding
//!   does not need to.
//! - **Origin**, when a browser sends one, must be this API's own (`http://` and the
//!   request's Host); `Sec-Fetch-Site`, when sent, must be `same-origin` or `none` (typed
//!   in the address bar). A cross-site page's request is refused whatever it asks.
//! - **Content-Type** of every `POST` to an endpoint that takes one must be
//!   `application/json` (checked after the token, so a caller without it is told 401
//!   first; a `POST` to an endpoint that takes none is the router's 405). A browser sends that
//!   type across sites only after a preflight (`OPTIONS`), which this API never grants,
//!   so a cross-site form or `fetch` without CORS cannot make one; clients that are not
//!   browsers (curl, `sluice query`, other workers) send it as they send the body.
//!
//! Refusals are 403 (host, origin) and 415 (content type), each with a JSON body that
//! names the value and the fix. Requests without `Origin` or `Sec-Fetch-Site` (curl,
//! probes, other workers) pass the browser checks; the Host check applies to all.
//!
//! Bounds: the allowed names are fixed at start; each request reads three headers once.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// The names a request's Host may give, fixed when the API binds.
#[derive(Debug, Clone)]
pub(crate) struct Hosts {
    bound: IpAddr,
    /// Configured names, lowercase, without a port.
    names: Vec<String>,
}

impl Hosts {
    /// The names allowed for an API bound to `bind`, and `names` (each a host, or
    /// `host:port` whose port is ignored).
    pub(crate) fn new(bind: SocketAddr, names: &[String]) -> Hosts {
        let names = names.iter().map(|name| host_name(name).to_ascii_lowercase()).collect();
        Hosts { bound: bind.ip(), names }
    }

    /// Whether a Host header `value` names this API.
    pub(crate) fn allows(&self, value: &str) -> bool {
        let name = host_name(value);
        if name.is_empty() {
            return false;
        }
        let literal = name.strip_prefix('[').and_then(|name| name.strip_suffix(']')).unwrap_or(name);
        if let Ok(ip) = literal.parse::<IpAddr>() {
            return ip == self.bound
                || self.bound.is_unspecified()
                || (self.bound.is_loopback() && ip.is_loopback())
                || self.names.iter().any(|allowed| allowed == literal);
        }
        let name = name.to_ascii_lowercase();
        ((self.bound.is_loopback() || self.bound.is_unspecified()) && name == "localhost") || self.names.contains(&name)
    }
}

/// The host part of `host[:port]` or `[v6][:port]`.
fn host_name(value: &str) -> &str {
    let value = value.trim();
    if value.starts_with('[') {
        return value.find(']').map_or(value, |end| &value[..=end]);
    }
    match value.rsplit_once(':') {
        // More than one colon without brackets: a bare IPv6 address.
        Some((host, _)) if !host.contains(':') => host,
        _ => value,
    }
}

/// Why a request is refused, or None.
fn refusal(hosts: &Hosts, headers: &HeaderMap) -> Option<(StatusCode, String, &'static str)> {
    let text = |name: header::HeaderName| headers.get(name).map(|value| value.to_str().unwrap_or("(not text)"));
    let host = text(header::HOST).unwrap_or("");
    if !hosts.allows(host) {
        return Some((
            StatusCode::FORBIDDEN,
            format!("the request's Host {host:?} does not name this API"),
            "address the API by the address it listens on (or localhost on loopback); to reach it by another \
             name, give that name with --admin-host NAME",
        ));
    }
    if let Some(origin) = text(header::ORIGIN)
        && !origin.strip_prefix("http://").is_some_and(|authority| authority.eq_ignore_ascii_case(host))
    {
        return Some((
            StatusCode::FORBIDDEN,
            format!("a request from the page {origin:?} is cross-site: only this API's own page may call it"),
            "call the API from its own page (/), or from a client that is not a browser (curl, sluice query)",
        ));
    }
    if let Some(site) = text(header::HeaderName::from_static("sec-fetch-site"))
        && !matches!(site, "same-origin" | "none")
    {
        return Some((
            StatusCode::FORBIDDEN,
            format!("a {site} request from a browser: only this API's own page may call it"),
            "call the API from its own page (/), or from a client that is not a browser (curl, sluice query)",
        ));
    }
    None
}

/// The endpoints that take a `POST`.
const POST_PATHS: [&str; 10] = [
    "/stop",
    "/pause",
    "/resume",
    "/checkpoint",
    "/query",
    "/internal/lease",
    "/internal/slice",
    "/internal/release",
    "/internal/status",
    "/internal/graph",
];

/// Why a `POST` is refused for its Content-Type, or None.
fn not_json(method: &Method, path: &str, headers: &HeaderMap) -> Option<(StatusCode, String, &'static str)> {
    let text = |name: header::HeaderName| headers.get(name).map(|value| value.to_str().unwrap_or("(not text)"));
    if *method == Method::POST && POST_PATHS.contains(&path) && !is_json(text(header::CONTENT_TYPE)) {
        let given = text(header::CONTENT_TYPE).map_or_else(|| "no Content-Type".to_string(), |t| format!("{t:?}"));
        return Some((
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("a POST with {given}: every POST must be application/json"),
            "send `Content-Type: application/json` (curl: -H 'Content-Type: application/json'), with an empty \
             body where the endpoint takes none",
        ));
    }
    None
}

/// Whether a Content-Type is `application/json` (parameters such as a charset allowed).
fn is_json(value: Option<&str>) -> bool {
    value.is_some_and(|value| {
        value.split(';').next().is_some_and(|media| media.trim().eq_ignore_ascii_case("application/json"))
    })
}

/// The outer middleware: refuses what [`refusal`] names (Host, Origin), else passes the
/// request on.
pub(crate) async fn guard(State(hosts): State<Arc<Hosts>>, request: Request, next: Next) -> Response {
    match refusal(&hosts, request.headers()) {
        Some(refused) => answer(refused),
        None => next.run(request).await,
    }
}

/// The inner middleware (after the token): refuses a `POST` that is not JSON.
pub(crate) async fn require_json(request: Request, next: Next) -> Response {
    match not_json(request.method(), request.uri().path(), request.headers()) {
        Some(refused) => answer(refused),
        None => next.run(request).await,
    }
}

fn answer((code, error, fix): (StatusCode, String, &'static str)) -> Response {
    (code, axum::Json(serde_json::json!({ "error": error, "fix": fix }))).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(bind: &str, names: &[&str]) -> Hosts {
        let names: Vec<String> = names.iter().map(|name| name.to_string()).collect();
        Hosts::new(bind.parse().expect("addr"), &names)
    }

    #[test]
    fn a_loopback_api_answers_to_loopback_names_and_configured_ones_only() {
        let loopback = hosts("127.0.0.1:9400", &["sluice.internal"]);
        for allowed in ["127.0.0.1:9400", "127.0.0.1", "LOCALHOST:80", "127.0.0.2:1", "[::1]:9400", "sluice.internal:9"]
        {
            assert!(loopback.allows(allowed), "{allowed}");
        }
        // A rebound name, another machine's address, nothing at all.
        for refused in ["evil.example:9400", "evil.example", "10.0.0.1:9400", "", ":9400", "localhost.evil.example"] {
            assert!(!loopback.allows(refused), "{refused}");
        }
    }

    #[test]
    fn a_wildcard_api_answers_to_any_address_and_configured_names() {
        let wildcard = hosts("0.0.0.0:9400", &["sluice-0.sluice:9400"]);
        for allowed in ["10.1.2.3:9400", "localhost", "sluice-0.sluice", "[fe80::1]:1"] {
            assert!(wildcard.allows(allowed), "{allowed}");
        }
        assert!(!wildcard.allows("evil.example:9400"));
        let bound = hosts("10.1.2.3:9400", &[]);
        assert!(bound.allows("10.1.2.3:80"));
        assert!(!bound.allows("10.1.2.4:9400"));
        assert!(!bound.allows("localhost:9400"));
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, value.parse().expect("header value"));
        }
        map
    }

    #[test]
    fn browser_requests_pass_only_from_the_apis_own_page() {
        let hosts = hosts("127.0.0.1:9400", &[]);
        let own = [("host", "127.0.0.1:9400"), ("origin", "http://127.0.0.1:9400"), ("sec-fetch-site", "same-origin")];
        let json = [("content-type", "application/json")];
        let check = |method: Method, pairs: &[(&'static str, &str)]| {
            let headers = headers(pairs);
            refusal(&hosts, &headers).or_else(|| not_json(&method, "/stop", &headers))
        };
        assert!(check(Method::POST, &[&own[..], &json[..]].concat()).is_none());
        assert!(check(Method::GET, &own).is_none());
        assert!(
            check(Method::POST, &[("host", "127.0.0.1:9400"), ("content-type", "application/json; charset=utf-8")])
                .is_none()
        );
        let cross = [("host", "127.0.0.1:9400"), ("origin", "http://evil.example"), ("content-type", "text/plain")];
        assert_eq!(check(Method::POST, &cross).map(|r| r.0), Some(StatusCode::FORBIDDEN));
        let null = [("host", "127.0.0.1:9400"), ("origin", "null"), ("content-type", "application/json")];
        assert_eq!(check(Method::POST, &null).map(|r| r.0), Some(StatusCode::FORBIDDEN));
        let navigated = [("host", "127.0.0.1:9400"), ("sec-fetch-site", "cross-site")];
        assert_eq!(check(Method::GET, &navigated).map(|r| r.0), Some(StatusCode::FORBIDDEN));
        let plain = [("host", "127.0.0.1:9400"), ("content-type", "text/plain")];
        assert_eq!(check(Method::POST, &plain).map(|r| r.0), Some(StatusCode::UNSUPPORTED_MEDIA_TYPE));
        assert_eq!(
            check(Method::POST, &[("host", "127.0.0.1:9400")]).map(|r| r.0),
            Some(StatusCode::UNSUPPORTED_MEDIA_TYPE)
        );
    }
}
