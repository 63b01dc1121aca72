//! Service account tokens from the API server, as the kubelet's token
//! manager gets them: a TokenRequest
//! (`POST /api/v1/namespaces/NS/serviceaccounts/SA/token`) with the
//! projection's audience and expiration, bound to the pod.

use std::time::{Duration, SystemTime};

use k8s_openapi::api::authentication::v1::{
    BoundObjectReference, TokenRequest as ApiTokenRequest, TokenRequestSpec,
};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, PostParams};
use kube::Client;
use volmgr::plugins::token::{Token, TokenError, TokenRequest, TokenSource};

/// Tokens by TokenRequest through `client`.
pub struct ApiTokenSource {
    client: Client,
}

impl ApiTokenSource {
    /// A source asking the API server `client` talks to.
    pub fn new(client: Client) -> Self {
        Self { client }
    }
}

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

#[async_trait::async_trait]
impl TokenSource for ApiTokenSource {
    async fn request(&self, req: &TokenRequest) -> Result<Token, TokenError> {
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
        Ok(Token { token, expiration })
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
}
