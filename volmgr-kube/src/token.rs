//! Service account tokens from the API server, as the kubelet's token
//! manager gets them: a TokenRequest
//! (`POST /api/v1/namespaces/NS/serviceaccounts/SA/token`) with the
//! projection's audience and expiration, bound to the pod, cached as the
//! kubelet caches them (`pkg/kubelet/token/token_manager.go`): by
//! namespace, service account, audience, `expirationSeconds` and bound
//! pod; a cached token is handed out again until it is older than 80 % of
//! its lifetime or than 24 h (less a jitter of up to 10 s), so setting a
//! projected volume up again (a ConfigMap of it changed) asks for no new
//! token. When a refresh fails, the cached token is handed out until it
//! expires. Expired tokens, and tokens issued over 24 h ago, are dropped
//! from the cache (at most once a minute, the kubelet's `gcPeriod`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::authentication::v1::{
    BoundObjectReference, TokenRequest as ApiTokenRequest, TokenRequestSpec,
};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, PostParams};
use kube::Client;
use volmgr::plugins::token::{Token, TokenError, TokenRequest, TokenSource};
use volmgr::util::sync::MutexExt;

/// A token is refreshed once it is older than this, whatever its lifetime
/// (the kubelet's `maxTTL`).
pub const MAX_TTL: Duration = Duration::from_secs(24 * 3600);
/// Up to this much earlier, at random, so that tokens issued together are
/// not all refreshed together (the kubelet's `maxJitter`).
pub const MAX_JITTER: Duration = Duration::from_secs(10);
/// How often the cache drops expired tokens, at most (the kubelet's
/// `gcPeriod`).
const GC_PERIOD: Duration = Duration::from_secs(60);

/// A token in the cache.
#[derive(Clone)]
struct Cached {
    token: Token,
    /// When it was issued: its expiration less its lifetime.
    issued: SystemTime,
    /// Its lifetime (`spec.expirationSeconds` of the answer).
    lifetime: Duration,
}

impl Cached {
    /// `token`, issued `lifetime` before it expires.
    fn new(token: Token, lifetime: Duration) -> Self {
        let issued = token
            .expiration
            .checked_sub(lifetime)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        Self {
            token,
            issued,
            lifetime,
        }
    }

    /// The kubelet's `requiresRefresh`: older than [`MAX_TTL`], or within
    /// 20 % of its lifetime of its expiration, each less `jitter`.
    fn requires_refresh(&self, now: SystemTime, jitter: Duration) -> bool {
        let after = |t: SystemTime, early: Duration| {
            now > t.checked_sub(early).unwrap_or(SystemTime::UNIX_EPOCH)
        };
        after(self.issued + MAX_TTL, jitter)
            || after(self.token.expiration, self.lifetime / 5 + jitter)
    }

    fn expired(&self, now: SystemTime) -> bool {
        now > self.token.expiration
    }
}

/// One cache entry: held while its token is being requested, so that
/// concurrent set-ups of the same token make one TokenRequest.
type Slot = Arc<tokio::sync::Mutex<Option<Cached>>>;

/// The cache, by request (namespace, service account, audience,
/// `expirationSeconds`, bound pod: [`TokenRequest`] is exactly that key).
#[derive(Default)]
struct Cache {
    slots: HashMap<TokenRequest, Slot>,
    /// When expired entries were last dropped.
    cleaned: Option<SystemTime>,
}

impl Cache {
    /// The slot of `req`, after dropping the entries whose token expired or
    /// was issued over [`MAX_TTL`] ago (once per [`GC_PERIOD`]; an entry
    /// being requested stays).
    fn slot(&mut self, req: &TokenRequest, now: SystemTime) -> Slot {
        let due = self
            .cleaned
            .is_none_or(|t| now.duration_since(t).unwrap_or(GC_PERIOD) >= GC_PERIOD);
        if due {
            self.cleaned = Some(now);
            self.slots.retain(|_, slot| match slot.try_lock() {
                Ok(held) => held
                    .as_ref()
                    .is_some_and(|c| !c.expired(now) && now <= c.issued + MAX_TTL),
                Err(_) => true,
            });
        }
        Arc::clone(self.slots.entry(req.clone()).or_default())
    }
}

/// Tokens by TokenRequest through `client`, cached (see the module
/// documentation).
pub struct ApiTokenSource {
    client: Client,
    cache: Mutex<Cache>,
}

impl ApiTokenSource {
    /// A source asking the API server `client` talks to.
    pub fn new(client: Client) -> Self {
        Self {
            client,
            cache: Mutex::new(Cache::default()),
        }
    }

    /// A token for `req` at `now`: the cached one unless it requires a
    /// refresh (or the refresh failed and it has not expired yet), else a
    /// new one.
    async fn token_at(&self, req: &TokenRequest, now: SystemTime) -> Result<Token, TokenError> {
        let slot = self.cache.locked().slot(req, now);
        let mut held = slot.lock().await;
        let jitter = MAX_JITTER.mul_f64(volmgr::util::backoff::random_fraction());
        if let Some(c) = held.as_ref().filter(|c| !c.requires_refresh(now, jitter)) {
            return Ok(c.token.clone());
        }
        match self.token_request(req).await {
            Ok((token, lifetime)) => {
                *held = Some(Cached::new(token.clone(), lifetime));
                Ok(token)
            }
            Err(e) => match held.as_ref().filter(|c| !c.expired(now)) {
                Some(c) => {
                    tracing::warn!(
                        namespace = %req.namespace,
                        service_account = %req.service_account,
                        error = %e,
                        "refreshing a service account token failed; the cached one is used until it expires"
                    );
                    Ok(c.token.clone())
                }
                None => Err(e),
            },
        }
    }

    /// A new token for `req` from the API server, and its lifetime.
    async fn token_request(&self, req: &TokenRequest) -> Result<(Token, Duration), TokenError> {
        /// The TokenRequest body for `req`.
        fn body(req: &TokenRequest) -> ApiTokenRequest {
            ApiTokenRequest {
                spec: Some(TokenRequestSpec {
                    audiences: (!req.audience.is_empty()).then(|| vec![req.audience.clone()]),
                    expiration_seconds: Some(req.expiration_seconds),
                    bound_object_ref: Some(BoundObjectReference {
                        api_version: Some("v1".into()),
                        kind: Some("Pod".into()),
                        name: Some(req.pod_name.clone()),
                        uid: Some(req.pod_uid.clone()),
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }
        }

        let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), &req.namespace);
        let answer = api
            .create_token_request(&req.service_account, &PostParams::default(), &body(req))
            .await
            .map_err(|e| match &e {
                kube::Error::Api(s) if s.code == 404 => TokenError::NotFound {
                    namespace: req.namespace.clone(),
                    service_account: req.service_account.clone(),
                    why: s.message.clone(),
                },
                _ => TokenError::Failed(format!(
                    "TokenRequest for {}/{}: {e}",
                    req.namespace, req.service_account
                )),
            })?;
        let no_token = || {
            TokenError::Failed(format!(
                "TokenRequest for {}/{}: the answer has no token or no expiration",
                req.namespace, req.service_account
            ))
        };
        let asked = answer
            .spec
            .as_ref()
            .and_then(|s| s.expiration_seconds)
            .unwrap_or(req.expiration_seconds);
        let lifetime = Duration::from_secs(u64::try_from(asked).unwrap_or(0));
        let status = answer.status.ok_or_else(no_token)?;
        let token = status
            .token
            .filter(|t| !t.is_empty())
            .ok_or_else(no_token)?;
        let at = status.expiration_timestamp.ok_or_else(no_token)?;
        let expiration = u64::try_from(at.0.as_second())
            .ok()
            .map(|s| SystemTime::UNIX_EPOCH + Duration::from_secs(s))
            .ok_or_else(no_token)?;
        Ok((Token { token, expiration }, lifetime))
    }
}

#[async_trait::async_trait]
impl TokenSource for ApiTokenSource {
    async fn request(&self, req: &TokenRequest) -> Result<Token, TokenError> {
        self.token_at(req, SystemTime::now()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::FakeApiServer;

    /// The request is the kubelet's: audience, expiration and the pod it
    /// is bound to, POSTed to the service account's token subresource; an
    /// answer without a token is an error, never an empty token.
    #[tokio::test]
    async fn asks_the_token_subresource_bound_to_the_pod() {
        let fake = FakeApiServer::in_memory();
        let source = ApiTokenSource::new(fake.client());
        let req = TokenRequest {
            namespace: "ns".into(),
            service_account: "builder".into(),
            audience: "vault".into(),
            expiration_seconds: 3607,
            pod_name: "p".into(),
            pod_uid: "uid-1".into(),
            service_account_uid: String::new(),
        };
        let err = source.request(&req).await.unwrap_err().to_string();
        assert!(
            err.contains("no token") || err.contains("TokenRequest"),
            "{err}"
        );
        let r = fake.take_requests();
        let post = r.iter().find(|r| r.method == "POST").unwrap();
        assert_eq!(
            post.path,
            "/api/v1/namespaces/ns/serviceaccounts/builder/token"
        );
        assert_eq!(post.body["spec"]["audiences"], serde_json::json!(["vault"]));
        assert_eq!(post.body["spec"]["expirationSeconds"], 3607);
        assert_eq!(
            post.body["spec"]["boundObjectRef"],
            serde_json::json!({"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "uid-1"})
        );
    }

    fn request(audience: &str, expiration_seconds: i64, pod_uid: &str) -> TokenRequest {
        TokenRequest {
            namespace: "ns".into(),
            service_account: "builder".into(),
            audience: audience.into(),
            expiration_seconds,
            pod_name: "p".into(),
            pod_uid: pod_uid.into(),
            service_account_uid: String::new(),
        }
    }

    fn fake_with_account() -> FakeApiServer {
        let fake = FakeApiServer::in_memory();
        fake.apply(
            serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "builder", "namespace": "ns", "uid": "sa-uid"}}),
        );
        fake
    }

    /// Setting a volume up again (a ConfigMap of it changed) gets the
    /// cached token: one TokenRequest per namespace, service account,
    /// audience, expiration and pod; concurrent set-ups make one.
    #[tokio::test]
    async fn tokens_are_cached_by_the_kubelets_key() {
        let fake = fake_with_account();
        let source = ApiTokenSource::new(fake.client());
        let a = request("vault", 3607, "uid-1");
        let first = source.request(&a).await.unwrap();
        for _ in 0..5 {
            let again = source.request(&a).await.unwrap();
            assert_eq!(again.token, first.token);
            assert_eq!(again.expiration, first.expiration);
        }
        assert_eq!(fake.tokens_issued(), 1);
        // Each part of the key is its own token.
        for other in [
            request("other", 3607, "uid-1"),
            request("vault", 7200, "uid-1"),
            request("vault", 3607, "uid-2"),
        ] {
            let t = source.request(&other).await.unwrap();
            assert_ne!(t.token, first.token);
        }
        assert_eq!(fake.tokens_issued(), 4);
        // Two set-ups at once of a token not cached yet: one request.
        let b = request("", 3600, "uid-3");
        let (x, y) = tokio::join!(source.request(&b), source.request(&b));
        assert_eq!(x.unwrap().token, y.unwrap().token);
        assert_eq!(fake.tokens_issued(), 5);
    }

    /// A token is renewed once older than 80 % of its lifetime (less the
    /// jitter); a failed renewal hands out the cached token until it
    /// expires, then the error.
    #[tokio::test]
    async fn tokens_are_renewed_at_eighty_percent_of_their_lifetime() {
        let fake = fake_with_account();
        let source = ApiTokenSource::new(fake.client());
        let a = request("vault", 3600, "uid-1");
        let now = SystemTime::now();
        let first = source.token_at(&a, now).await.unwrap();
        let later = |secs: u64| now + Duration::from_secs(secs);
        // Half its life, and just before 80 % less the largest jitter.
        for at in [1800, 2880 - 15] {
            let t = source.token_at(&a, later(at)).await.unwrap();
            assert_eq!(t.token, first.token, "at {at} s");
        }
        assert_eq!(fake.tokens_issued(), 1);
        // Past 80 %: a new token.
        let second = source.token_at(&a, later(2885)).await.unwrap();
        assert_ne!(second.token, first.token);
        assert_eq!(fake.tokens_issued(), 2);
        // The renewal fails: the cached token until it expires.
        let renew_at = |t: &Token| t.expiration - Duration::from_secs(60);
        fake.fail_next(hyper::Method::POST, 500);
        let kept = source.token_at(&a, renew_at(&second)).await.unwrap();
        assert_eq!(kept.token, second.token);
        fake.fail_next(hyper::Method::POST, 500);
        let expired = second.expiration + Duration::from_secs(1);
        let err = source.token_at(&a, expired).await.unwrap_err().to_string();
        assert!(err.contains("TokenRequest"), "{err}");
    }

    /// The kubelet's rule: 80 % of the lifetime, or 24 h, less the jitter.
    #[test]
    fn refresh_rule() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let token = |life: u64| {
            Cached::new(
                Token {
                    token: "t".into(),
                    expiration: t0 + Duration::from_secs(life),
                },
                Duration::from_secs(life),
            )
        };
        let at = |s: u64| t0 + Duration::from_secs(s);
        let hour = token(3600);
        assert!(!hour.requires_refresh(at(2880), Duration::ZERO));
        assert!(hour.requires_refresh(at(2881), Duration::ZERO));
        assert!(hour.requires_refresh(at(2871), MAX_JITTER));
        let week = token(7 * 24 * 3600);
        assert!(!week.requires_refresh(at(24 * 3600), Duration::ZERO));
        assert!(week.requires_refresh(at(24 * 3600 + 1), Duration::ZERO));
        assert!(!week.requires_refresh(at(24 * 3600 - 11), MAX_JITTER));
    }
}
