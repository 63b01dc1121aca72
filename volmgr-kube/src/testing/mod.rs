//! Test support (the `test-support` feature): the one fake API server,
//! [`FakeApiServer`], that the crate's unit tests drive in memory
//! ([`FakeApiServer::in_memory`], a `kube::Client` over a `tower` service)
//! and the end-to-end tests of `volmgr-cli` drive over HTTPS
//! ([`FakeApiServer::start`], the real agent through a kubeconfig); and
//! [`HostileServer`], API servers that misbehave on purpose (invalid JSON,
//! silence, a drip, endless bodies, a wrong CA), for the client's bounds.
//! Both serve TLS with a self-signed certificate for 127.0.0.1 (rcgen) and
//! write a kubeconfig that trusts it.

// Test-only code: failing loudly is the point.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod fake;
pub mod hostile;
pub mod kubelet;
pub mod real;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use fake::{FakeApiServer, Recorded};
pub use hostile::{HostileServer, Mode};
pub use kubelet::RealKubelet;
pub use real::RealApiServer;

/// A self-signed certificate for 127.0.0.1 and `localhost`: its PEM (the
/// CA a kubeconfig trusts) and a TLS server configuration serving it.
fn self_signed() -> (String, tokio_rustls::rustls::ServerConfig) {
    let key =
        rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string(), "localhost".to_string()])
            .unwrap();
    let private =
        tokio_rustls::rustls::pki_types::PrivateKeyDer::Pkcs8(key.key_pair.serialize_der().into());
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let tls = tokio_rustls::rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![key.cert.der().clone()], private)
        .unwrap();
    (key.cert.pem(), tls)
}

/// Writes `ca_pem` to `dir/<name>-ca.pem` and a kubeconfig (a bearer token,
/// that CA, `https://addr`) to `dir/kubeconfig`; returns its path.
fn write_kubeconfig(dir: &Path, name: &str, addr: SocketAddr, ca_pem: &str) -> PathBuf {
    let ca = dir.join(format!("{name}-ca.pem"));
    std::fs::write(&ca, ca_pem).unwrap();
    let file = dir.join("kubeconfig");
    std::fs::write(
        &file,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: {name}\n  cluster:\n    server: https://{addr}\n    certificate-authority: {}\nusers:\n- name: node\n  user:\n    token: node-token\ncontexts:\n- name: {name}\n  context:\n    cluster: {name}\n    user: node\ncurrent-context: {name}\n",
            ca.display()
        ),
    )
    .unwrap();
    file
}
