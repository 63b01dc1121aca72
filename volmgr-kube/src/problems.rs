//! Why the API source is not synced, in words a person can act on: each
//! failing list or watch's cause (`connection refused`, `TLS: certificate
//! signed by unknown authority (CA from kubeconfig /etc/kubeconfig)`, `no
//! answer in 30 s (pods list)`, `invalid JSON in the pods list at byte 7`)
//! shows in status under the source [`SOURCE`], and in the log once per
//! change, until the list or watch works again.

use std::collections::BTreeMap;
use std::error::Error as StdError;
use std::sync::{Arc, Mutex};

use kube::runtime::watcher;

use volmgr::populator::PodSink;

use super::transport::TransportError;

/// The source name of the API server's problems in status.
pub const SOURCE: &str = "api";

/// Problems shown in status at most (then `... and N more`).
const SHOWN: usize = 8;

/// The current problems of the API source's lists and watches.
pub struct ApiProblems {
    sink: Arc<dyn PodSink>,
    /// Where the client's CA comes from (for TLS errors).
    ca: String,
    /// What failed (`pods`, `ConfigMap ns/name`) → why.
    current: Mutex<BTreeMap<String, String>>,
}

impl ApiProblems {
    /// Problems reported to `sink`; `ca` says where the CA comes from.
    pub fn new(sink: Arc<dyn PodSink>, ca: &str) -> Arc<Self> {
        Arc::new(Self {
            sink,
            ca: ca.to_string(),
            current: Mutex::new(BTreeMap::new()),
        })
    }

    /// The list or watch of `what` (`pods`, `ConfigMap ns/name`) failed.
    pub fn failed(&self, what: &str, e: &watcher::Error) {
        let cause = describe(e, what, &self.ca);
        self.set(what, Some(cause));
    }

    /// A request for `what` (a `get` of `PersistentVolumeClaim ns/name`)
    /// failed.
    pub fn request_failed(&self, what: &str, e: &kube::Error) {
        let cause = describe_kube(e, &format!("{what} get"), &self.ca);
        self.set(what, Some(cause));
    }

    /// The list or watch of `what` works (again).
    pub fn works(&self, what: &str) {
        self.set(what, None);
    }

    fn set(&self, what: &str, cause: Option<String>) {
        let Ok(mut current) = self.current.lock() else {
            return;
        };
        let before = current.get(what).cloned();
        if before == cause {
            return;
        }
        let known = |c: &str, m: &BTreeMap<String, String>| m.values().any(|v| v == c);
        match &cause {
            Some(c) => {
                let new = !known(c, &current);
                current.insert(what.to_string(), c.clone());
                if new {
                    tracing::warn!(what, cause = %c, "API server: {c}");
                }
            }
            None => {
                current.remove(what);
                if before.as_deref().is_some_and(|b| !known(b, &current)) {
                    tracing::info!(what, "API server: works again");
                }
            }
        }
        let mut errors: Vec<String> = current
            .iter()
            .take(SHOWN)
            .map(|(w, c)| format!("{w}: {c}"))
            .collect();
        if current.len() > SHOWN {
            errors.push(format!("... and {} more", current.len() - SHOWN));
        }
        self.sink.set_source_problems(SOURCE, errors, vec![]);
    }
}

/// The cause of a watcher error on `what`.
pub fn describe(e: &watcher::Error, what: &str, ca: &str) -> String {
    match e {
        watcher::Error::InitialListFailed(k) => describe_kube(k, &format!("{what} list"), ca),
        watcher::Error::WatchStartFailed(k) | watcher::Error::WatchFailed(k) => {
            describe_kube(k, &format!("{what} watch"), ca)
        }
        watcher::Error::WatchError(s) => format!(
            "the API server ended the {what} watch: HTTP {} {}: {}",
            s.code, s.reason, s.message
        ),
        watcher::Error::NoResourceVersion => {
            format!("the API server's {what} list has no resourceVersion")
        }
    }
}

/// The cause of a client error on the request `what` (`pods list`).
fn describe_kube(e: &kube::Error, what: &str, ca: &str) -> String {
    match e {
        kube::Error::Api(s) => format!(
            "the API server refused the {what}: HTTP {} {}: {}",
            s.code, s.reason, s.message
        ),
        kube::Error::SerdeError(j) => invalid_json(j, what),
        other => in_chain(other, what, ca).unwrap_or_else(|| {
            let inner = chain(other).last().map(|e| e.to_string());
            match inner {
                Some(i) if i != other.to_string() => format!("{what}: {other}: {i}"),
                _ => format!("{what}: {other}"),
            }
        }),
    }
}

fn invalid_json(j: &serde_json::Error, what: &str) -> String {
    if j.line() <= 1 {
        format!("invalid JSON in the {what} at byte {}: {j}", j.column())
    } else {
        format!(
            "invalid JSON in the {what} at line {} column {}: {j}",
            j.line(),
            j.column()
        )
    }
}

/// The first cause in `e`'s chain this module knows how to say.
fn in_chain(e: &(dyn StdError + 'static), what: &str, ca: &str) -> Option<String> {
    for e in chain(e) {
        if let Some(t) = e.downcast_ref::<TransportError>() {
            return Some(t.to_string());
        }
        if let Some(r) = e.downcast_ref::<rustls::Error>() {
            return Some(tls(r, ca));
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            match io.kind() {
                std::io::ErrorKind::ConnectionRefused => return Some("connection refused".into()),
                std::io::ErrorKind::ConnectionReset => {
                    return Some(format!("connection reset during the {what}"))
                }
                _ => {}
            }
        }
        if let Some(h) = e.downcast_ref::<hyper::Error>() {
            if h.is_parse() {
                return Some(format!("the answer to the {what} is not HTTP: {h}"));
            }
            if h.is_incomplete_message() {
                return Some(format!(
                    "the server closed the connection during the {what}"
                ));
            }
        }
        if let Some(j) = e.downcast_ref::<serde_json::Error>() {
            return Some(invalid_json(j, what));
        }
    }
    None
}

fn tls(e: &rustls::Error, ca: &str) -> String {
    use rustls::CertificateError as C;
    match e {
        // As Go's x509 says it, also when a CA of the same name did not
        // sign the certificate.
        rustls::Error::InvalidCertificate(C::UnknownIssuer | C::BadSignature) => {
            format!("TLS: certificate signed by unknown authority (CA from {ca})")
        }
        rustls::Error::InvalidCertificate(c) => {
            format!("TLS: the server's certificate is not valid: {c:?} (CA from {ca})")
        }
        rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateHandshakeMessage { .. } => {
            format!("TLS: {e} (is the server speaking HTTPS?)")
        }
        other => format!("TLS: {other}"),
    }
}

/// `e` and its causes, outermost first, looking inside `io::Error`s (whose
/// `source` skips the error they wrap).
fn chain<'a>(e: &'a (dyn StdError + 'static)) -> Vec<&'a (dyn StdError + 'static)> {
    let mut out: Vec<&'a (dyn StdError + 'static)> = Vec::new();
    let mut next = Some(e);
    while let Some(e) = next {
        if out.len() > 32 {
            break;
        }
        out.push(e);
        next = match e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &'a (dyn StdError + 'static)),
            None => e.source(),
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_in_words() {
        let ca = "kubeconfig /k";
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let e = kube::Error::Service(Box::new(refused));
        let w = watcher::Error::InitialListFailed(e);
        assert_eq!(describe(&w, "pods", ca), "connection refused");
        let unknown = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, unknown);
        let e = kube::Error::Service(Box::new(io));
        let w = watcher::Error::InitialListFailed(e);
        assert_eq!(
            describe(&w, "pods", ca),
            "TLS: certificate signed by unknown authority (CA from kubeconfig /k)"
        );
        let j = serde_json::from_str::<serde_json::Value>("{\"a\": nope}").unwrap_err();
        let w = watcher::Error::InitialListFailed(kube::Error::SerdeError(j));
        let d = describe(&w, "pods", ca);
        assert!(
            d.starts_with("invalid JSON in the pods list at byte 8"),
            "{d}"
        );
        let t = TransportError::NoAnswer {
            what: "pods list".into(),
        };
        let w = watcher::Error::InitialListFailed(kube::Error::Service(Box::new(t)));
        assert_eq!(describe(&w, "pods", ca), "no answer in 30 s (pods list)");
    }
}
