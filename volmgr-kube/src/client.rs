//! The agent's connection to the API server: a kube-rs client from
//! `--kubeconfig FILE` (server, CA data, bearer token or client
//! certificate), or from the in-cluster service account when the agent
//! runs in a pod (`KUBERNETES_SERVICE_HOST` set), over the bounded
//! HTTP/2 stack of [`super::transport`]. Every request says who sends it
//! ([`user_agent`]), as client-go's do.

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

/// The `User-Agent` of every request of the agent on `node`:
/// `volmgr/<version> (<os>/<arch>) <node>`, as client-go's
/// `kubelet/v1.37.2 (linux/amd64) kubernetes/<commit>` (Go's names of the
/// architectures). Characters a header may not hold are left out of the
/// node name.
pub fn user_agent(node: &str) -> String {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" if cfg!(target_endian = "little") => "ppc64le",
        "loongarch64" => "loong64",
        other => other,
    };
    let node: String = node.chars().filter(|c| c.is_ascii_graphic()).collect();
    let ua = format!(
        "volmgr/{} ({}/{arch})",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::OS
    );
    if node.is_empty() {
        ua
    } else {
        format!("{ua} {node}")
    }
}

/// A client from `kubeconfig` (its current context), or the in-cluster
/// configuration without one, for the agent on `node` (its
/// [`user_agent`]).
pub async fn client(kubeconfig: Option<&Path>, node: &str) -> Result<kube::Client, ClientError> {
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
    let mut config = config;
    let agent = http::HeaderValue::from_str(&user_agent(node))
        .map_err(|e| ClientError::Build(format!("User-Agent: {e}")))?;
    config.headers.push((http::header::USER_AGENT, agent));
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
        let Err(e) = client(Some(&missing), "n1").await else {
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
        let Err(e) = client(Some(&bad), "n1").await else {
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
        assert!(client(Some(&file), "n1").await.is_ok());
        assert!(api_requested(Some(&file)));
    }

    /// client-go's form: `name/version (os/arch) rest`, Go's arch names.
    #[test]
    fn user_agent_names_volmgr_its_platform_and_the_node() {
        let ua = user_agent("node-a");
        let version = env!("CARGO_PKG_VERSION");
        assert!(ua.starts_with(&format!("volmgr/{version} (linux/")), "{ua}");
        assert!(ua.ends_with(") node-a"), "{ua}");
        #[cfg(target_arch = "x86_64")]
        assert!(ua.contains("(linux/amd64)"), "{ua}");
        assert!(http::HeaderValue::from_str(&user_agent("a\nb c\u{e9}")).is_ok());
        assert!(user_agent("a\nb").ends_with(" ab"));
        assert!(user_agent("").ends_with(')'));
    }

    /// Every request carries it.
    #[tokio::test]
    async fn every_request_sends_the_user_agent() {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = [0u8; 4096];
            let n = s.read(&mut buf).unwrap();
            let _ = s.write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n");
            String::from_utf8_lossy(&buf[..n]).into_owned()
        });
        let t = tempfile::tempdir().unwrap();
        let file = t.path().join("kubeconfig");
        std::fs::write(
            &file,
            format!("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: 'http://{addr}'}}\nusers:\n- name: u\n  user: {{token: abc}}\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n"),
        )
        .unwrap();
        let c = client(Some(&file), "n1").await.unwrap();
        let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(c);
        let _ = nodes.get_opt("n1").await;
        let request = seen.join().unwrap().to_ascii_lowercase();
        let line = request
            .lines()
            .find(|l| l.starts_with("user-agent:"))
            .unwrap_or_else(|| panic!("no user-agent in {request}"));
        assert_eq!(
            line.trim_end(),
            format!("user-agent: {}", user_agent("n1")).to_ascii_lowercase()
        );
    }
}
