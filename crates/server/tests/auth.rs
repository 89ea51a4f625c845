//! Access control over HTTP: every operation against every kind of bad credential, grants by
//! path and operation, hiding existence, forks, live reads ended by expiry, signed URLs, JWKS keys
//! and their reload.

mod common;

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use oncelog_server::auth::scope::{GrantClaim, ScopeClaim};
use oncelog_server::auth::signed_url;
use oncelog_server::auth::token::{issue, TokenAuth, TokenConfig};
use oncelog_server::{ManualClock, ServerConfig};
use reqwest::{Method, StatusCode};

const SECRET: &[u8] = b"test-secret-of-some-length";
const NOW_S: i64 = 1_800_000_000;

struct Setup {
    s: common::TestServer,
    http: reqwest::Client,
    clock: Arc<ManualClock>,
    auth: Arc<TokenAuth>,
    dir: tempfile::TempDir,
}

async fn setup(hide: bool, jwks: Option<&str>) -> Setup {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("secret"), [SECRET, b"\n"].concat()).expect("write secret");
    let jwks_file = jwks.map(|j| {
        let p = dir.path().join("jwks.json");
        std::fs::write(&p, j).expect("write jwks");
        p
    });
    let auth = TokenAuth::load(TokenConfig {
        secret_file: Some(dir.path().join("secret")),
        jwks_file,
        issuer: None,
        audience: None,
        hide_forbidden: hide,
    })
    .expect("keys");
    let clock = Arc::new(ManualClock::new(NOW_S * 1000));
    let config = ServerConfig { long_poll_timeout: Duration::from_secs(5), ..ServerConfig::default() };
    let s = common::TestServer::start_with_auth(config, Some(clock.clone()), Some(auth.clone())).await;
    Setup { s, http: reqwest::Client::new(), clock, auth, dir }
}

fn token(secret: &[u8], grants: &[(&str, bool, &str)], exp: i64) -> String {
    common::grants_token(secret, grants, exp)
}

fn admin() -> String {
    token(SECRET, &[("", false, "all")], NOW_S + 3600)
}

impl Setup {
    async fn send(
        &self,
        method: Method,
        path: &str,
        bearer: Option<&str>,
        headers: &[(&str, &str)],
        body: &str,
    ) -> reqwest::Response {
        let mut rb = self.http.request(method, self.s.url(path));
        if let Some(t) = bearer {
            rb = rb.bearer_auth(t);
        }
        for (k, v) in headers {
            rb = rb.header(*k, *v);
        }
        if !body.is_empty() {
            rb = rb.body(body.to_owned());
        }
        rb.send().await.expect("send")
    }

    async fn make(&self, path: &str) {
        let r = self.send(Method::PUT, path, Some(&admin()), &[("content-type", "text/plain")], "").await;
        assert!(r.status().is_success(), "setup create {path}: {}", r.status());
    }
}

/// One operation: method, headers and body, what the grant must name, and the success status.
struct Operation {
    name: &'static str,
    method: Method,
    headers: &'static [(&'static str, &'static str)],
    body: &'static str,
    op: &'static str,
    ok: StatusCode,
    /// Whether the stream must exist first.
    exists: bool,
}

fn operations() -> Vec<Operation> {
    let text: &'static [(&str, &str)] = &[("content-type", "text/plain")];
    vec![
        Operation {
            name: "read",
            method: Method::GET,
            headers: &[],
            body: "",
            op: "read",
            ok: StatusCode::OK,
            exists: true,
        },
        Operation {
            name: "head",
            method: Method::HEAD,
            headers: &[],
            body: "",
            op: "read",
            ok: StatusCode::OK,
            exists: true,
        },
        Operation {
            name: "append",
            method: Method::POST,
            headers: text,
            body: "x",
            op: "append",
            ok: StatusCode::NO_CONTENT,
            exists: true,
        },
        Operation {
            name: "create",
            method: Method::PUT,
            headers: text,
            body: "",
            op: "create",
            ok: StatusCode::CREATED,
            exists: false,
        },
        Operation {
            name: "close",
            method: Method::POST,
            headers: &[("stream-closed", "true")],
            body: "",
            op: "close",
            ok: StatusCode::NO_CONTENT,
            exists: true,
        },
        Operation {
            name: "delete",
            method: Method::DELETE,
            headers: &[],
            body: "",
            op: "delete",
            ok: StatusCode::NO_CONTENT,
            exists: true,
        },
    ]
}

#[tokio::test]
async fn every_operation_against_every_kind_of_credential() {
    let t = setup(false, None).await;
    for (i, o) in operations().into_iter().enumerate() {
        let path = format!("room/{i}");
        if o.exists {
            t.make(&path).await;
        }
        let other_op = if o.op == "read" { "append" } else { "read" };
        let cases: Vec<(&str, Option<String>, StatusCode)> = vec![
            ("no token", None, StatusCode::UNAUTHORIZED),
            (
                "bad signature",
                Some(token(b"another-secret", &[("", false, "all")], NOW_S + 60)),
                StatusCode::UNAUTHORIZED,
            ),
            ("expired", Some(token(SECRET, &[("", false, "all")], NOW_S - 3600)), StatusCode::UNAUTHORIZED),
            ("garbage", Some("not.a.jwt".into()), StatusCode::UNAUTHORIZED),
            (
                "out-of-scope path",
                Some(token(SECRET, &[("elsewhere/", false, "all")], NOW_S + 60)),
                StatusCode::FORBIDDEN,
            ),
            (
                "missing operation",
                Some(token(SECRET, &[("room/", false, other_op)], NOW_S + 60)),
                StatusCode::FORBIDDEN,
            ),
            ("good", Some(token(SECRET, &[(path.as_str(), true, o.op)], NOW_S + 60)), o.ok),
        ];
        for (what, bearer, want) in cases {
            let r = t.send(o.method.clone(), &path, bearer.as_deref(), o.headers, o.body).await;
            assert_eq!(r.status(), want, "{} with {what}", o.name);
            if want == StatusCode::UNAUTHORIZED {
                let challenge = r.headers().get("www-authenticate").and_then(|v| v.to_str().ok()).unwrap_or("");
                assert!(challenge.starts_with("Bearer error="), "{} with {what}: {challenge:?}", o.name);
            }
        }
    }
    // CORS preflights and probes need no token.
    let r = t.http.request(Method::OPTIONS, t.s.url("room/0")).send().await.expect("options");
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let r = t.http.get(format!("{}/healthz", t.s.origin)).send().await.expect("healthz");
    assert_eq!(r.status(), StatusCode::OK);
}

#[tokio::test]
async fn hiding_answers_404_and_forks_need_read_on_their_source() {
    let t = setup(true, None).await;
    t.make("private/a").await;
    let outsider = token(SECRET, &[("public/", false, "all")], NOW_S + 60);
    let r = t.send(Method::GET, "private/a", Some(&outsider), &[], "").await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND, "existence is not revealed");
    // Fork: create on the target is not enough without read on the source.
    let fork = [("stream-forked-from", "/v1/stream/private/a")];
    let create_only = token(SECRET, &[("forks/", false, "create")], NOW_S + 60);
    assert_eq!(t.send(Method::PUT, "forks/f", Some(&create_only), &fork, "").await.status(), StatusCode::NOT_FOUND);
    let both = token(SECRET, &[("forks/", false, "create"), ("private/a", true, "read")], NOW_S + 60);
    assert_eq!(t.send(Method::PUT, "forks/f", Some(&both), &fork, "").await.status(), StatusCode::CREATED);
}

#[tokio::test]
async fn live_reads_end_when_their_token_expires() {
    let t = setup(false, None).await;
    t.make("live").await;
    // Valid for one more second (30 s of leeway after `exp`).
    let short = token(SECRET, &[("live", true, "read")], NOW_S - 29);
    let started = std::time::Instant::now();
    let r = t.send(Method::GET, "live?offset=-1&live=sse", Some(&short), &[], "").await;
    assert_eq!(r.status(), StatusCode::OK);
    let text = tokio::time::timeout(Duration::from_secs(10), r.text()).await.expect("SSE ends").expect("body");
    assert!(text.contains("\"endReason\":\"tokenExpired\""), "{text}");
    assert!(started.elapsed() < Duration::from_secs(5));
    // A long-poll ends too, without waiting for its full timeout.
    let started = std::time::Instant::now();
    let r = t.send(Method::GET, "live?offset=now&live=long-poll", Some(&short), &[], "").await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert!(started.elapsed() < Duration::from_secs(4), "{:?}", started.elapsed());
    // Once expired, reconnecting is refused.
    t.clock.advance_ms(2_000);
    assert_eq!(t.send(Method::GET, "live", Some(&short), &[], "").await.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn signed_urls_grant_reads_of_one_stream_until_they_expire() {
    let t = setup(false, None).await;
    t.make("chat").await;
    t.send(Method::POST, "chat", Some(&admin()), &[("content-type", "text/plain")], "hi").await;
    let exp = (NOW_S + 60) as u64;
    let sig = signed_url::sign(SECRET, "/v1/stream/chat", exp);
    let get = |path: &str, q: String| t.http.get(format!("{}/{path}?{q}", t.s.base)).send();
    let code = |r: reqwest::Response| async move {
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        let v: serde_json::Value = serde_json::from_str(&r.text().await.expect("text")).expect("json error body");
        v["error"]["code"].as_str().unwrap_or_default().to_owned()
    };
    let r = get("chat", format!("offset=-1&expires={exp}&sig={sig}")).await.expect("get");
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.text().await.expect("text"), "hi");
    // Tampered path, tampered expiry, used for a write, then expired.
    t.make("other").await;
    assert_eq!(code(get("other", format!("expires={exp}&sig={sig}")).await.expect("get")).await, "SIGNATURE_INVALID");
    assert_eq!(
        code(get("chat", format!("expires={}&sig={sig}", exp + 1)).await.expect("get")).await,
        "SIGNATURE_INVALID"
    );
    let write = t
        .http
        .post(format!("{}/chat?expires={exp}&sig={sig}", t.s.base))
        .header("content-type", "text/plain")
        .body("x")
        .send();
    assert_eq!(code(write.await.expect("post")).await, "SIGNATURE_INVALID");
    t.clock.advance_ms(61_000);
    assert_eq!(code(get("chat", format!("expires={exp}&sig={sig}")).await.expect("get")).await, "SIGNATURE_EXPIRED");
}

/// An Ed25519 key pair from a fixed seed: the JWK of its public half and a signing key.
fn ed25519(seed: u8, kid: &str) -> (serde_json::Value, jsonwebtoken::EncodingKey) {
    let sk = ed25519_dalek::SigningKey::from_bytes(&[seed; 32]);
    let x = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(sk.verifying_key().to_bytes());
    let jwk = serde_json::json!({ "kty": "OKP", "crv": "Ed25519", "x": x, "kid": kid, "alg": "EdDSA", "use": "sig" });
    // PKCS#8 v1 for Ed25519: a fixed prefix, then the 32-byte seed.
    let mut der = vec![0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20];
    der.extend_from_slice(&[seed; 32]);
    (jwk, jsonwebtoken::EncodingKey::from_ed_der(&der))
}

fn idp_token(key: &jsonwebtoken::EncodingKey, kid: &str) -> String {
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::EdDSA);
    header.kid = Some(kid.into());
    let claims = serde_json::json!({ "sub": "alice", "exp": NOW_S + 600, "oncelog": { "grants": [ { "prefix": "", "ops": ["read"] } ] } });
    jsonwebtoken::encode(&header, &claims, key).expect("sign")
}

#[tokio::test]
async fn identity_provider_tokens_verify_against_a_reloadable_jwks() {
    let (jwk1, key1) = ed25519(1, "k1");
    let (jwk2, key2) = ed25519(2, "k2");
    let t = setup(false, Some(&serde_json::json!({ "keys": [jwk1] }).to_string())).await;
    t.make("s").await;
    assert_eq!(t.send(Method::GET, "s", Some(&idp_token(&key1, "k1")), &[], "").await.status(), StatusCode::OK);
    assert_eq!(
        t.send(Method::GET, "s", Some(&idp_token(&key2, "k2")), &[], "").await.status(),
        StatusCode::UNAUTHORIZED
    );
    // A token signed by key 2 but naming key 1 fails too.
    assert_eq!(
        t.send(Method::GET, "s", Some(&idp_token(&key2, "k1")), &[], "").await.status(),
        StatusCode::UNAUTHORIZED
    );
    // Rotate: the file now holds key 2 only.
    tokio::time::sleep(Duration::from_millis(20)).await;
    std::fs::write(t.dir.path().join("jwks.json"), serde_json::json!({ "keys": [jwk2] }).to_string()).expect("rotate");
    assert!(t.auth.reload().expect("reload"), "the change is noticed");
    assert_eq!(t.send(Method::GET, "s", Some(&idp_token(&key2, "k2")), &[], "").await.status(), StatusCode::OK);
    assert_eq!(
        t.send(Method::GET, "s", Some(&idp_token(&key1, "k1")), &[], "").await.status(),
        StatusCode::UNAUTHORIZED
    );
    // A broken file keeps the keys in force.
    std::fs::write(t.dir.path().join("jwks.json"), "{ not json").expect("break");
    assert!(t.auth.reload().is_err());
    assert_eq!(t.send(Method::GET, "s", Some(&idp_token(&key2, "k2")), &[], "").await.status(), StatusCode::OK);
}

#[tokio::test]
async fn append_rate_limits_are_per_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("secret"), SECRET).expect("secret");
    let auth = TokenAuth::load(TokenConfig { secret_file: Some(dir.path().join("secret")), ..TokenConfig::default() })
        .expect("keys");
    let clock = Arc::new(ManualClock::new(NOW_S * 1000));
    let config = ServerConfig { append_rate_limit: 5, ..ServerConfig::default() };
    let s = common::TestServer::start_with_auth(config, Some(clock), Some(auth)).await;
    let http = reqwest::Client::new();
    let named = |sub: &str| {
        let claim = ScopeClaim {
            grants: vec![GrantClaim { stream: None, prefix: Some(String::new()), ops: vec!["all".into()] }],
        };
        issue(SECRET, claim, NOW_S + 600, None, None, Some(sub.into())).expect("sign")
    };
    let (alice, bob) = (named("alice"), named("bob"));
    http.put(s.url("r")).bearer_auth(&alice).header("content-type", "text/plain").send().await.expect("put");
    let post =
        |token: &str| http.post(s.url("r")).bearer_auth(token).header("content-type", "text/plain").body("x").send();
    let mut alice_limited = false;
    for _ in 0..20 {
        let r = post(&alice).await.expect("post");
        if r.status() == StatusCode::TOO_MANY_REQUESTS {
            assert!(r.headers().contains_key("retry-after"));
            alice_limited = true;
            break;
        }
    }
    assert!(alice_limited, "alice's bucket of 5 per second runs dry");
    // Bob writes from the same address with his own bucket.
    assert_eq!(post(&bob).await.expect("post").status(), StatusCode::NO_CONTENT);
}

#[tokio::test]
async fn subscriptions_follow_only_what_their_creator_may_read_and_tokens_bypass_jwt_checks() {
    let st = setup(false, None).await;
    for p in ["jobs/a", "secret/x"] {
        st.make(p).await;
    }
    let r = st.send(Method::PUT, "wake", Some(&admin()), &[("content-type", "application/json")], "").await;
    assert!(r.status().is_success());
    // Managing subscriptions: create/read on __ds/subscriptions/...; following: read on what
    // is followed; wake events: append on the wake stream.
    let manager = token(
        SECRET,
        &[
            ("__ds/subscriptions/", false, "create,read,delete,append"),
            ("jobs/", false, "read"),
            ("wake", true, "append"),
        ],
        NOW_S + 3600,
    );
    let put = |pattern: &str, wake: &str| {
        format!(r#"{{"type":"pull-wake","pattern":"{pattern}","wake_stream":"{wake}","lease_ttl_ms":5000}}"#)
    };
    let json = [("content-type", "application/json")];
    for (path, body, want) in [
        ("__ds/subscriptions/ok", put("jobs/*", "wake"), StatusCode::CREATED),
        ("__ds/subscriptions/peek", put("secret/*", "wake"), StatusCode::FORBIDDEN),
        ("__ds/subscriptions/all", put("**", "wake"), StatusCode::FORBIDDEN),
        ("__ds/subscriptions/spray", put("jobs/*", "jobs/a"), StatusCode::FORBIDDEN),
        (
            "__ds/subscriptions/named",
            r#"{"type":"pull-wake","streams":["secret/x"],"wake_stream":"wake"}"#.to_owned(),
            StatusCode::FORBIDDEN,
        ),
    ] {
        let r = st.send(Method::PUT, path, Some(&manager), &json, &body).await;
        assert_eq!(r.status(), want, "{path}");
    }
    // Without credentials nothing of the API answers but the key set.
    assert_eq!(st.send(Method::GET, "__ds/subscriptions/ok", None, &[], "").await.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(st.send(Method::GET, "__ds/jwks.json", None, &[], "").await.status(), StatusCode::OK);
    // An id that only decodes to a token-checked call is a management call of that id, and needs
    // credentials like one: the gate and the router parse the same raw path (issue 31, item 6).
    for call in ["ack", "commit", "release", "callback"] {
        for method in [Method::PUT, Method::GET, Method::DELETE] {
            let r = st.send(method.clone(), &format!("__ds/subscriptions/x%2F{call}"), None, &json, "{}").await;
            assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{method} x%2F{call}");
        }
    }
    let r = st
        .send(Method::POST, "__ds/subscriptions/ok/streams", Some(&manager), &json, r#"{"streams":["secret/x"]}"#)
        .await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    // The claim token (not a JWT) is what ack and release check; the JWT gate lets them through.
    st.send(Method::POST, "jobs/a", Some(&admin()), &[("content-type", "text/plain")], "work").await;
    let r = st.send(Method::POST, "__ds/subscriptions/ok/claim", Some(&manager), &json, r#"{"worker":"w"}"#).await;
    assert_eq!(r.status(), StatusCode::OK);
    let claim: serde_json::Value = serde_json::from_slice(&r.bytes().await.expect("body")).expect("json");
    let body = serde_json::json!({ "wake_id": claim["wake_id"], "generation": claim["generation"] }).to_string();
    let r = st.send(Method::POST, "__ds/subscriptions/ok/release", claim["token"].as_str(), &json, &body).await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    // Commits write only under the subscription's `outputs`, which its creator must be allowed
    // to append under: not granted → 403 at creation; outside them → 403 OUTPUT_NOT_ALLOWED.
    let with_outputs = |outputs: &str| {
        format!(
            r#"{{"type":"pull-wake","pattern":"jobs/*","wake_stream":"wake","lease_ttl_ms":5000,"outputs":[{outputs}]}}"#
        )
    };
    let r =
        st.send(Method::PUT, "__ds/subscriptions/greedy", Some(&manager), &json, &with_outputs(r#""secret/""#)).await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let writer = token(
        SECRET,
        &[
            ("__ds/subscriptions/", false, "create,read,append"),
            ("jobs/", false, "read"),
            ("wake", true, "append"),
            ("out/", false, "append"),
        ],
        NOW_S + 3600,
    );
    let r = st.send(Method::PUT, "__ds/subscriptions/tx", Some(&writer), &json, &with_outputs(r#""out/""#)).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    for p in ["out/a", "secret/y"] {
        let r = st.send(Method::PUT, p, Some(&admin()), &json, "").await;
        assert!(r.status().is_success());
    }
    st.send(Method::POST, "jobs/a", Some(&admin()), &[("content-type", "text/plain")], "more").await;
    let r = st.send(Method::POST, "__ds/subscriptions/tx/claim", Some(&writer), &json, r#"{"worker":"w"}"#).await;
    assert_eq!(r.status(), StatusCode::OK);
    let claim: serde_json::Value = serde_json::from_slice(&r.bytes().await.expect("body")).expect("json");
    let commit = |stream: &str| {
        serde_json::json!({ "wake_id": claim["wake_id"], "generation": claim["generation"], "done": false,
            "appends": [{ "stream": stream, "producer": { "id": "sub:tx", "epoch": 1, "seq": 0 }, "data": { "n": 1 } }] }).to_string()
    };
    let r = st
        .send(Method::POST, "__ds/subscriptions/tx/commit", claim["token"].as_str(), &json, &commit("secret/y"))
        .await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let r =
        st.send(Method::POST, "__ds/subscriptions/tx/commit", claim["token"].as_str(), &json, &commit("out/a")).await;
    assert_eq!(r.status(), StatusCode::OK);
}

/// A token signed with the test secret from hand-written claims and header.
fn raw_token(header: jsonwebtoken::Header, claims: serde_json::Value) -> String {
    jsonwebtoken::encode(&header, &claims, &jsonwebtoken::EncodingKey::from_secret(SECRET)).expect("sign")
}

#[tokio::test]
async fn tokens_follow_rfc_7519_for_audiences_and_times_and_refuse_unknown_critical_headers() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("secret"), SECRET).expect("secret");
    let config = TokenConfig {
        secret_file: Some(dir.path().join("secret")),
        audience: Some("oncelog".into()),
        ..TokenConfig::default()
    };
    let auth = TokenAuth::load(config).expect("keys");
    let clock = Arc::new(ManualClock::new(NOW_S * 1000));
    let s = common::TestServer::start_with_auth(ServerConfig::default(), Some(clock.clone()), Some(auth)).await;
    let http = reqwest::Client::new();
    let grants = serde_json::json!({ "grants": [ { "prefix": "", "ops": ["all"] } ] });
    let hs256 = || jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
    let get = |token: String| http.get(s.url("t")).bearer_auth(token).send();
    let put = http
        .put(s.url("t"))
        .bearer_auth(raw_token(hs256(), serde_json::json!({ "aud": "oncelog", "exp": NOW_S + 60, "oncelog": grants })));
    assert_eq!(put.header("content-type", "text/plain").send().await.expect("put").status(), StatusCode::CREATED);
    for (what, aud, exp, want) in [
        (
            "aud as an array holding ours",
            serde_json::json!(["other", "oncelog"]),
            serde_json::json!(NOW_S + 60),
            StatusCode::OK,
        ),
        (
            "aud as an array without ours",
            serde_json::json!(["other"]),
            serde_json::json!(NOW_S + 60),
            StatusCode::UNAUTHORIZED,
        ),
        ("fractional exp", serde_json::json!("oncelog"), serde_json::json!(NOW_S as f64 + 60.25), StatusCode::OK),
        (
            "fractional exp, past with its leeway",
            serde_json::json!("oncelog"),
            serde_json::json!((NOW_S - 31) as f64 + 0.5),
            StatusCode::UNAUTHORIZED,
        ),
    ] {
        let token = raw_token(
            hs256(),
            serde_json::json!({ "aud": aud, "exp": exp, "nbf": NOW_S as f64 - 0.5, "oncelog": grants }),
        );
        assert_eq!(get(token).await.expect("get").status(), want, "{what}");
    }
    // A critical header extension this server does not implement: refused, as RFC 7515 says.
    let mut crit = hs256();
    crit.crit = Some(vec!["exp-ext".into()]);
    let token = raw_token(crit, serde_json::json!({ "aud": "oncelog", "exp": NOW_S + 60, "oncelog": grants }));
    assert_eq!(get(token).await.expect("get").status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn a_live_read_ends_when_its_token_expires_not_after_the_leeway() {
    let t = setup(false, None).await;
    t.make("live").await;
    // Two seconds left on the server's clock (which stands still here): the response ends then,
    // not 30 s of leeway later.
    let short = token(SECRET, &[("live", true, "read")], NOW_S + 2);
    let r = t.send(Method::GET, "live?offset=-1&live=sse", Some(&short), &[], "").await;
    assert_eq!(r.status(), StatusCode::OK);
    let text = tokio::time::timeout(Duration::from_secs(15), r.text()).await.expect("SSE ends at exp").expect("body");
    assert!(text.contains("\"endReason\":\"tokenExpired\""), "{text}");
}

#[tokio::test]
async fn with_hiding_on_subscription_calls_and_commits_do_not_reveal_what_exists() {
    let st = setup(true, None).await;
    for p in ["jobs/a", "secret/x"] {
        st.make(p).await;
    }
    let json = [("content-type", "application/json")];
    assert!(st.send(Method::PUT, "wake", Some(&admin()), &json, "").await.status().is_success());
    assert!(st.send(Method::PUT, "out/a", Some(&admin()), &json, "").await.status().is_success());
    let cfg = r#"{"type":"pull-wake","pattern":"jobs/*","wake_stream":"wake","lease_ttl_ms":5000,"outputs":["out/"]}"#;
    assert_eq!(
        st.send(Method::PUT, "__ds/subscriptions/real", Some(&admin()), &json, cfg).await.status(),
        StatusCode::CREATED
    );
    // A bogus token against an existing and a missing subscription: the same answer.
    let body = r#"{"wake_id":"w","generation":1}"#;
    for op in ["ack", "commit", "release", "callback"] {
        let mut answers = Vec::new();
        for id in ["real", "missing"] {
            let r = st
                .send(Method::POST, &format!("__ds/subscriptions/{id}/{op}"), Some("bogus.token.here"), &json, body)
                .await;
            answers.push((r.status(), r.text().await.expect("text")));
        }
        assert_eq!(answers[0], answers[1], "{op}");
        assert_eq!(answers[0].0, StatusCode::NOT_FOUND, "{op}");
    }
    // A commit outside the subscription's outputs: the same answer for a stream that exists
    // and one that does not.
    st.send(Method::POST, "jobs/a", Some(&admin()), &[("content-type", "text/plain")], "work").await;
    let r = st.send(Method::POST, "__ds/subscriptions/real/claim", Some(&admin()), &json, r#"{"worker":"w"}"#).await;
    assert_eq!(r.status(), StatusCode::OK);
    let claim: serde_json::Value = serde_json::from_slice(&r.bytes().await.expect("body")).expect("json");
    let commit = |stream: &str| {
        serde_json::json!({ "wake_id": claim["wake_id"], "generation": claim["generation"], "done": false,
            "appends": [{ "stream": stream, "producer": { "id": "sub:real", "epoch": 1, "seq": 0 }, "data": { "n": 1 } }] }).to_string()
    };
    let mut answers = Vec::new();
    for stream in ["secret/x", "secret/none"] {
        let r = st
            .send(Method::POST, "__ds/subscriptions/real/commit", claim["token"].as_str(), &json, &commit(stream))
            .await;
        let (status, text) = (r.status(), r.text().await.expect("text"));
        answers.push((status, text.replace(stream, "STREAM")));
    }
    assert_eq!(answers[0], answers[1]);
    assert_eq!(answers[0].0, StatusCode::NOT_FOUND);
    let r =
        st.send(Method::POST, "__ds/subscriptions/real/commit", claim["token"].as_str(), &json, &commit("out/a")).await;
    assert_eq!(r.status(), StatusCode::OK);
}

/// Every refusal says why, in its body and in `WWW-Authenticate`'s `error_description`: an
/// expired token (when), one not valid yet (from when), a wrong audience, a bad signature, an
/// `Authorization` that is not `Bearer`, no credentials, and — for a `403` — which operation on
/// which stream no grant covers.
#[tokio::test]
async fn refusals_carry_their_reason_in_the_body_and_the_challenge() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("secret"), SECRET).expect("secret");
    let config = TokenConfig {
        secret_file: Some(dir.path().join("secret")),
        audience: Some("oncelog".into()),
        ..TokenConfig::default()
    };
    let auth = TokenAuth::load(config).expect("keys");
    let clock = Arc::new(ManualClock::new(NOW_S * 1000));
    let s = common::TestServer::start_with_auth(ServerConfig::default(), Some(clock), Some(auth)).await;
    let http = reqwest::Client::new();
    let claims = |aud: &str, exp: i64, nbf: i64, ops: &str| serde_json::json!({ "aud": aud, "exp": exp, "nbf": nbf, "oncelog": { "grants": [ { "prefix": "r/", "ops": [ops] } ] } });
    let hs256 = || jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
    let admin = raw_token(hs256(), claims("oncelog", NOW_S + 60, NOW_S - 1, "all"));
    let put =
        http.put(s.url("r/t")).bearer_auth(&admin).header("content-type", "text/plain").send().await.expect("put");
    assert_eq!(put.status(), StatusCode::CREATED);
    let bad_signature = jsonwebtoken::encode(
        &hs256(),
        &claims("oncelog", NOW_S + 60, NOW_S - 1, "all"),
        &jsonwebtoken::EncodingKey::from_secret(b"another"),
    )
    .expect("sign");
    let cases: Vec<(&str, Option<String>, StatusCode, &str, &str)> = vec![
        (
            "expired",
            Some(raw_token(hs256(), claims("oncelog", NOW_S - 3600, NOW_S - 7200, "all"))),
            StatusCode::UNAUTHORIZED,
            "invalid_token",
            "the token expired at Fri, 15 Jan 2027 07:00:00 GMT",
        ),
        (
            "not yet valid",
            Some(raw_token(hs256(), claims("oncelog", NOW_S + 7200, NOW_S + 3600, "all"))),
            StatusCode::UNAUTHORIZED,
            "invalid_token",
            "not valid before Fri, 15 Jan 2027 09:00:00 GMT",
        ),
        (
            "wrong audience",
            Some(raw_token(hs256(), claims("elsewhere", NOW_S + 60, NOW_S - 1, "all"))),
            StatusCode::UNAUTHORIZED,
            "invalid_token",
            "audience",
        ),
        ("bad signature", Some(bad_signature), StatusCode::UNAUTHORIZED, "invalid_token", "signature does not verify"),
        (
            "no grant",
            Some(raw_token(hs256(), claims("oncelog", NOW_S + 60, NOW_S - 1, "read"))),
            StatusCode::FORBIDDEN,
            "insufficient_scope",
            "the token does not grant append on r/t",
        ),
    ];
    for (what, token, status, code, reason) in cases {
        let mut rb = http.post(s.url("r/t")).header("content-type", "text/plain").body("x");
        if let Some(t) = token {
            rb = rb.bearer_auth(t);
        }
        let r = rb.send().await.expect("post");
        assert_eq!(r.status(), status, "{what}");
        let challenge = r.headers().get("www-authenticate").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
        assert!(
            challenge.starts_with(&format!("Bearer error=\"{code}\", error_description=\"")),
            "{what}: {challenge}"
        );
        assert!(challenge.contains(reason), "{what}: {challenge}");
        let body = r.text().await.expect("body");
        assert!(body.contains(reason), "{what}: {body}");
    }
    for (what, authorization, reason) in
        [("not bearer", Some("Token abc"), "not `Bearer <token>`"), ("no credentials", None, "no credentials")]
    {
        let mut rb = http.get(s.url("r/t"));
        if let Some(a) = authorization {
            rb = rb.header("authorization", a);
        }
        let r = rb.send().await.expect("get");
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{what}");
        let challenge = r.headers().get("www-authenticate").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
        assert!(
            challenge.starts_with("Bearer error=\"invalid_request\", error_description=\"")
                && challenge.contains(reason),
            "{what}: {challenge}"
        );
    }
    // A stream path that no header may carry as it is (a quote, non-ASCII) is percent-encoded
    // in the challenge and shown as it is in the body.
    let reader = raw_token(hs256(), claims("oncelog", NOW_S + 60, NOW_S - 1, "read"));
    let r = http
        .post(s.url("r/%22caf%C3%A9"))
        .bearer_auth(reader)
        .header("content-type", "text/plain")
        .body("x")
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let challenge = r.headers().get("www-authenticate").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    assert!(challenge.ends_with("append on r/%22caf%C3%A9\""), "{challenge}");
    assert!(r.text().await.expect("body").contains("append on r/\"café"));
}
