//! The agent's connection to the API server: a kube-rs client from
//! `--kubeconfig FILE` (server, CA data, bearer token or client
//! certificate), or from the in-cluster service account when the agent
//! runs in a pod (`KUBERNETES_SERVICE_HOST` set), over the bounded
//! HTTP/2 stack of [`super::transport`].

use std::path::{Path, PathBuf};

use kube::config::{KubeConfigOptions, Kubeconfig};

/// Why no client could be made.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The kubeconfig file could not be read or used.
    #[error("kubeconfig {path}: {message}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// The in-cluster configuration could not be used.
    #[error("in-cluster configuration: {0}")]
    InCluster(String),
    /// The client could not be built (TLS set-up).
    #[error("API client: {0}")]
    Build(String),
}

/// Whether the agent should talk to the API server: a kubeconfig was given,
/// or it runs in a pod.
pub fn api_requested(kubeconfig: Option<&Path>) -> bool {
    kubeconfig.is_some() || std::env::var_os("KUBERNETES_SERVICE_HOST").is_some()
}

/// A client from `kubeconfig` (its current context), or the in-cluster
/// configuration without one.
pub async fn client(kubeconfig: Option<&Path>) -> Result<kube::Client, ClientError> {
    let config = match kubeconfig {
        Some(path) => {
            let err = |message: String| ClientError::Kubeconfig {
                path: path.to_path_buf(),
                message,
            };
            let file = Kubeconfig::read_from(path).map_err(|e| err(e.to_string()))?;
            kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .map_err(|e| err(e.to_string()))?
        }
        None => kube::Config::incluster().map_err(|e| ClientError::InCluster(e.to_string()))?,
    };
    super::transport::client(&config).map_err(|e| ClientError::Build(e.to_string()))
}

/// Where the client's CA comes from, for TLS errors in status.
pub fn ca_origin(kubeconfig: Option<&Path>) -> String {
    match kubeconfig {
        Some(path) => format!("kubeconfig {}", path.display()),
        None => "the in-cluster service account".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_bad_kubeconfig_is_a_clear_error() {
        let t = tempfile::tempdir().unwrap();
        let missing = t.path().join("nope");
        let Err(e) = client(Some(&missing)).await else {
            panic!("a missing kubeconfig gave a client")
        };
        let e = e.to_string();
        assert!(e.contains("kubeconfig") && e.contains("nope"), "{e}");
        let bad = t.path().join("bad");
        std::fs::write(
            &bad,
            "apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\n",
        )
        .unwrap();
        let Err(e) = client(Some(&bad)).await else {
            panic!("an empty kubeconfig gave a client")
        };
        let e = e.to_string();
        assert!(e.contains("kubeconfig"), "{e}");
    }

    /// A kubeconfig with a server, CA data and a bearer token gives a
    /// client (nothing is contacted yet).
    #[tokio::test]
    async fn a_token_kubeconfig_gives_a_client() {
        let t = tempfile::tempdir().unwrap();
        let file = t.path().join("kubeconfig");
        std::fs::write(
            &file,
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://127.0.0.1:6443', insecure-skip-tls-verify: true}\nusers:\n- name: u\n  user: {token: abc}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n",
        )
        .unwrap();
        assert!(client(Some(&file)).await.is_ok());
        assert!(api_requested(Some(&file)));
    }
}
