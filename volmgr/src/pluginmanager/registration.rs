//! The plugin registration API as the kubelet speaks it, client side:
//! `GetInfo`, validation, the driver's `NodeGetInfo` (the kubelet's CSI
//! `RegisterPlugin`) and `NotifyRegistrationStatus`. The
//! [`plugin_watcher`](super::plugin_watcher) registers with it; observe
//! mode's triage asks `GetInfo` and tells nothing.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint};

use super::csi_proto::csi;
use super::csi_proto::pluginregistration::registration_client::RegistrationClient;
use super::csi_proto::pluginregistration::{InfoRequest, PluginInfo, RegistrationStatus};
use super::registry::{DriverRegistry, NodeInfo};

/// The plugin type this watcher handles (the kubelet's `CSIPlugin`).
pub const CSI_PLUGIN_TYPE: &str = "CSIPlugin";

/// The largest answer read from a registration socket (`GetInfo`,
/// `NotifyRegistrationStatus`) or a driver's Identity service: a name, an
/// endpoint, a few versions; tonic's default is 4 MiB.
pub const MAX_REGISTRATION_ANSWER: usize = 64 << 10;

/// The most bytes of a name (driver, plugin type, endpoint, version) a
/// plugin announced that go into a message: a DNS subdomain's length.
pub const MAX_NAME_IN_MESSAGE: usize = 253;

/// The most announced versions that go into a message.
const VERSIONS_IN_MESSAGE: usize = 16;

/// `s` cut to [`MAX_NAME_IN_MESSAGE`] bytes (at a character boundary).
pub fn cut_name(s: &str) -> String {
    s[..s.floor_char_boundary(MAX_NAME_IN_MESSAGE)].to_string()
}

/// Why registering one plugin socket failed. The text is what the status
/// shows and what a plugin that fails validation is told.
#[derive(Debug, thiserror::Error)]
pub enum RegistrationError {
    /// The socket could not be connected to (the text holds every cause).
    #[error("cannot connect: {}", error_chain(.0))]
    Connect(#[source] tonic::transport::Error),
    /// Connecting took longer than the call deadline.
    #[error("cannot connect: no answer within {0:?}")]
    ConnectTimeout(Duration),
    /// The plugin answered `GetInfo` with an error.
    #[error("GetInfo failed: {}: {}", .0.code(), .0.message())]
    GetInfo(#[source] tonic::Status),
    /// `GetInfo` took longer than the call deadline.
    #[error("GetInfo: no answer within {0:?}")]
    GetInfoTimeout(Duration),
    /// The plugin answered `NotifyRegistrationStatus` with an error.
    #[error("{}: {}", .0.code(), .0.message())]
    Notify(#[source] tonic::Status),
    /// `NotifyRegistrationStatus` took longer than the call deadline.
    #[error("no answer within {0:?}")]
    NotifyTimeout(Duration),
    /// The driver's `NodeGetInfo` failed or gave an unusable answer: the
    /// registration fails, as the kubelet's `RegisterPlugin` does.
    #[error("CSI driver {name:?}: RegisterPlugin failed at CSI.NodeGetInfo: {reason}")]
    NodeGetInfo {
        /// The driver.
        name: String,
        /// What went wrong (the gRPC status, a timeout, an empty node ID).
        reason: String,
    },
    /// The plugin is not a CSI plugin.
    #[error("no handler registered for plugin type {plugin_type:?} at socket {} (only {CSI_PLUGIN_TYPE:?} is handled)", .socket.display())]
    UnknownType {
        /// The type it announced.
        plugin_type: String,
        /// Its registration socket.
        socket: PathBuf,
    },
    /// The plugin announced no name.
    #[error("plugin at socket {} has an empty name", .socket.display())]
    EmptyName {
        /// Its registration socket.
        socket: PathBuf,
    },
    /// None of the announced versions is 1.x.
    #[error(
        "CSI driver {name:?}: none of the versions {versions:?} is supported (volmgr supports 1.x)"
    )]
    UnsupportedVersions {
        /// The driver.
        name: String,
        /// The versions it announced.
        versions: Vec<String>,
    },
    /// The announced endpoint is a relative path.
    #[error("CSI driver {name:?}: endpoint {endpoint:?} is not an absolute path")]
    RelativeEndpoint {
        /// The driver.
        name: String,
        /// The endpoint it announced.
        endpoint: String,
    },
    /// Another registration of the same driver supports a higher version.
    #[error("CSI driver {name:?}: another registration of it at {} supports a higher version {}.{}.{}", .existing.display(), .version.0, .version.1, .version.2)]
    HigherVersionElsewhere {
        /// The driver.
        name: String,
        /// The other registration's endpoint.
        existing: PathBuf,
        /// The other registration's highest supported version.
        version: (u64, u64, u64),
    },
}

/// The result of a registration step.
pub type Result<T, E = RegistrationError> = std::result::Result<T, E>;

/// A plugin that answered `GetInfo`, passed validation and answered
/// `NodeGetInfo`: registered by the watcher's loop (the only writer of its
/// registrations), then told.
pub struct Validated {
    /// The driver name.
    pub name: String,
    /// The driver's CSI socket.
    pub endpoint: PathBuf,
    /// The versions it announced.
    pub versions: Vec<String>,
    /// Its `NodeGetInfo` answer.
    pub node: NodeInfo,
    pub(super) client: RegistrationClient<Channel>,
}

/// Connects to the Unix socket `path` within `timeout` (a registration
/// socket or a driver's CSI endpoint).
pub(crate) async fn connect(path: &Path, timeout: Duration) -> Result<Channel> {
    let path = path.to_path_buf();
    let endpoint = Endpoint::from_static("http://[::1]:50051").connect_timeout(timeout);
    let connecting =
        endpoint.connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        }));
    match tokio::time::timeout(timeout, connecting).await {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(RegistrationError::Connect(e)),
        Err(_) => Err(RegistrationError::ConnectTimeout(timeout)),
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = c.source();
    }
    s
}

/// The first half of the kubelet's registration of one plugin socket:
/// `GetInfo`, validation and the driver's `NodeGetInfo` (the kubelet's CSI
/// `RegisterPlugin`); a plugin that fails any of them is told why
/// (`NotifyRegistrationStatus{plugin_registered: false}`).
pub async fn get_and_validate(
    socket: &Path,
    registry: &DriverRegistry,
    timeout: Duration,
) -> Result<Validated> {
    let (info, mut client) = get_info(socket, timeout).await?;
    let validated = match validate(&info, socket, registry) {
        Ok((name, endpoint, versions)) => {
            node_get_info(&name, &endpoint, timeout)
                .await
                .map(|node| Validated {
                    name,
                    endpoint,
                    versions,
                    node,
                    client: client.clone(),
                })
        }
        Err(e) => Err(e),
    };
    match validated {
        Ok(v) => Ok(v),
        Err(e) => {
            // Tell the plugin why (node-driver-registrar logs it and exits).
            let _ = notify(&mut client, false, &e.to_string(), timeout).await;
            Err(e)
        }
    }
}

/// The plugin's `GetInfo` answer at registration socket `socket`, each of
/// connecting and the call bounded by `timeout`: the first call of a
/// registration, and all the observer asks (it tells the plugin nothing).
pub async fn get_info(
    socket: &Path,
    timeout: Duration,
) -> Result<(PluginInfo, RegistrationClient<Channel>)> {
    let channel = connect(socket, timeout).await?;
    let mut client =
        RegistrationClient::new(channel).max_decoding_message_size(MAX_REGISTRATION_ANSWER);
    let mut req = tonic::Request::new(InfoRequest {});
    req.set_timeout(timeout);
    match tokio::time::timeout(timeout, client.get_info(req)).await {
        Ok(Ok(r)) => Ok((r.into_inner(), client)),
        Ok(Err(s)) => Err(RegistrationError::GetInfo(s)),
        Err(_) => Err(RegistrationError::GetInfoTimeout(timeout)),
    }
}

/// The driver `name`'s `NodeGetInfo` at its CSI socket `endpoint`, checked
/// as the CSI spec requires (a node ID, a limit that is not negative).
async fn node_get_info(name: &str, endpoint: &Path, timeout: Duration) -> Result<NodeInfo> {
    let failed = |reason: String| RegistrationError::NodeGetInfo {
        name: cut_name(name),
        reason,
    };
    let channel = connect(endpoint, timeout)
        .await
        .map_err(|e| failed(e.to_string()))?;
    let mut req = tonic::Request::new(csi::NodeGetInfoRequest {});
    req.set_timeout(timeout);
    let mut client = csi::node_client::NodeClient::new(channel);
    let r = match tokio::time::timeout(timeout, client.node_get_info(req)).await {
        Ok(Ok(r)) => r.into_inner(),
        Ok(Err(s)) => return Err(failed(format!("{}: {}", s.code(), s.message()))),
        Err(_) => return Err(failed(format!("no answer within {timeout:?}"))),
    };
    node_info_of(r).map_err(|e| failed(e.to_string()))
}

/// Why a `NodeGetInfo` answer is unusable.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
enum NodeInfoRefused {
    /// No node ID.
    #[error("the driver returned an empty node ID")]
    EmptyNodeId,
    /// A node ID over the CSI spec's 256 bytes.
    #[error("the driver returned a node ID of {0} bytes (at most 256)")]
    NodeIdTooLong(usize),
    /// A negative volume limit.
    #[error("the driver returned a negative max_volumes_per_node ({0})")]
    NegativeLimit(i64),
}

/// The node info in a `NodeGetInfo` answer, or why it is unusable.
fn node_info_of(r: csi::NodeGetInfoResponse) -> std::result::Result<NodeInfo, NodeInfoRefused> {
    if r.node_id.is_empty() {
        return Err(NodeInfoRefused::EmptyNodeId);
    }
    // The CSI spec's bound; the ID ends up in a Node annotation.
    if r.node_id.len() > 256 {
        return Err(NodeInfoRefused::NodeIdTooLong(r.node_id.len()));
    }
    if r.max_volumes_per_node < 0 {
        return Err(NodeInfoRefused::NegativeLimit(r.max_volumes_per_node));
    }
    Ok(NodeInfo {
        node_id: r.node_id,
        max_volumes_per_node: r.max_volumes_per_node,
        accessible_topology: r
            .accessible_topology
            .map(|t| t.segments.into_iter().collect())
            .unwrap_or_default(),
    })
}

pub(super) async fn notify(
    client: &mut RegistrationClient<Channel>,
    registered: bool,
    error: &str,
    timeout: Duration,
) -> Result<()> {
    let mut req = tonic::Request::new(RegistrationStatus {
        plugin_registered: registered,
        error: error.to_string(),
    });
    req.set_timeout(timeout);
    match tokio::time::timeout(timeout, client.notify_registration_status(req)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(s)) => Err(RegistrationError::Notify(s)),
        Err(_) => Err(RegistrationError::NotifyTimeout(timeout)),
    }
}

/// The kubelet's CSI `RegistrationHandler.ValidatePlugin`: type `CSIPlugin`,
/// a driver name, a supported version (1.x), an absolute endpoint (the
/// registration socket itself when empty), and no other registration of the
/// same driver announcing a higher version. Returns name, endpoint and the
/// announced versions.
pub fn validate(
    info: &PluginInfo,
    socket: &Path,
    registry: &DriverRegistry,
) -> Result<(String, PathBuf, Vec<String>)> {
    if info.r#type != CSI_PLUGIN_TYPE {
        return Err(RegistrationError::UnknownType {
            plugin_type: cut_name(&info.r#type),
            socket: socket.to_path_buf(),
        });
    }
    if info.name.is_empty() {
        return Err(RegistrationError::EmptyName {
            socket: socket.to_path_buf(),
        });
    }
    let highest = highest_supported_version(&info.supported_versions).ok_or_else(|| {
        RegistrationError::UnsupportedVersions {
            name: cut_name(&info.name),
            versions: (info.supported_versions.iter())
                .take(VERSIONS_IN_MESSAGE)
                .map(|v| cut_name(v))
                .collect(),
        }
    })?;
    let endpoint = if info.endpoint.is_empty() {
        socket.to_path_buf()
    } else {
        PathBuf::from(&info.endpoint)
    };
    if !endpoint.is_absolute() {
        return Err(RegistrationError::RelativeEndpoint {
            name: cut_name(&info.name),
            endpoint: cut_name(&info.endpoint),
        });
    }
    if let Some(existing) = registry
        .driver_infos()
        .into_iter()
        .find(|d| d.name == info.name && d.endpoint != endpoint)
    {
        if let Some(old) = highest_supported_version(&existing.versions) {
            if old > highest {
                return Err(RegistrationError::HigherVersionElsewhere {
                    name: cut_name(&info.name),
                    existing: existing.endpoint,
                    version: old,
                });
            }
        }
    }
    Ok((info.name.clone(), endpoint, info.supported_versions.clone()))
}

/// The highest version of `versions` this node supports (major 1), as
/// (major, minor, patch). Accepts `1`, `1.2`, `1.2.3`, with or without `v`.
pub fn highest_supported_version(versions: &[String]) -> Option<(u64, u64, u64)> {
    versions
        .iter()
        .filter_map(|v| parse_version(v))
        .filter(|v| v.0 == 1)
        .max()
}

fn parse_version(v: &str) -> Option<(u64, u64, u64)> {
    let v = v.trim().trim_start_matches('v');
    // Drop pre-release / build suffixes (`1.2.3-rc1+abc`).
    let core = v.split(['-', '+']).next()?;
    let mut parts = core.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next().map_or(Some(0), |p| p.parse().ok())?;
    let patch = parts.next().map_or(Some(0), |p| p.parse().ok())?;
    if parts.next().is_some() {
        return None;
    }
    Some((major, minor, patch))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(t: &str, name: &str, endpoint: &str, versions: &[&str]) -> PluginInfo {
        PluginInfo {
            r#type: t.into(),
            name: name.into(),
            endpoint: endpoint.into(),
            supported_versions: versions.iter().map(|v| v.to_string()).collect(),
        }
    }

    #[test]
    fn versions() {
        let v = |s: &[&str]| {
            highest_supported_version(&s.iter().map(|x| x.to_string()).collect::<Vec<_>>())
        };
        assert_eq!(v(&["1.0.0"]), Some((1, 0, 0)));
        assert_eq!(
            v(&["0.3.0", "v1.2", "1.10.1-rc1", "2.0.0"]),
            Some((1, 10, 1))
        );
        assert_eq!(v(&["1"]), Some((1, 0, 0)));
        assert_eq!(v(&["0.3.0", "2.0.0", "x", "1.2.3.4", ""]), None);
        assert_eq!(v(&[]), None);
    }

    #[test]
    fn validation_like_the_kubelet() {
        let r = DriverRegistry::new();
        let sock = Path::new("/r/plugins_registry/d-reg.sock");
        let ok = validate(&info("CSIPlugin", "d", "/p/csi.sock", &["1.0.0"]), sock, &r).unwrap();
        assert_eq!(
            ok,
            (
                "d".into(),
                PathBuf::from("/p/csi.sock"),
                vec!["1.0.0".into()]
            )
        );
        // An empty endpoint means the registration socket itself.
        let ok = validate(&info("CSIPlugin", "d", "", &["1.0.0"]), sock, &r).unwrap();
        assert_eq!(ok.1, sock);
        for (i, want) in [
            (
                info("DevicePlugin", "d", "/p", &["1.0.0"]),
                "no handler registered for plugin type \"DevicePlugin\"",
            ),
            (info("CSIPlugin", "", "/p", &["1.0.0"]), "empty name"),
            (
                info("CSIPlugin", "d", "/p", &["0.3.0", "2.0.0"]),
                "none of the versions",
            ),
            (
                info("CSIPlugin", "d", "rel/csi.sock", &["1.0.0"]),
                "not an absolute path",
            ),
        ] {
            let e = validate(&i, sock, &r).unwrap_err().to_string();
            assert!(e.contains(want), "{e:?} should contain {want:?}");
        }
        // Another registration of the driver with a higher version wins.
        r.register("d", "/other/csi.sock".into(), vec!["1.5.0".into()]);
        let e = validate(&info("CSIPlugin", "d", "/p/csi.sock", &["1.0.0"]), sock, &r)
            .unwrap_err()
            .to_string();
        assert!(e.contains("higher version 1.5.0"), "{e}");
        assert!(validate(&info("CSIPlugin", "d", "/p/csi.sock", &["1.6.0"]), sock, &r).is_ok());
        // The same endpoint re-registering is fine.
        assert!(validate(
            &info("CSIPlugin", "d", "/other/csi.sock", &["1.0.0"]),
            sock,
            &r
        )
        .is_ok());
    }

    /// A registration socket answering `GetInfo` with a name of `.0`
    /// bytes.
    #[derive(Clone)]
    struct BigInfo(usize);

    impl tonic::server::NamedService for BigInfo {
        const NAME: &'static str = "pluginregistration.Registration";
    }

    impl tonic::server::UnaryService<InfoRequest> for BigInfo {
        type Response = PluginInfo;
        type Future =
            std::future::Ready<std::result::Result<tonic::Response<PluginInfo>, tonic::Status>>;
        fn call(&mut self, _: tonic::Request<InfoRequest>) -> Self::Future {
            std::future::ready(Ok(tonic::Response::new(info(
                CSI_PLUGIN_TYPE,
                &"d".repeat(self.0),
                "/p/csi.sock",
                &["1.0.0"],
            ))))
        }
    }

    type Answer = tonic::codegen::http::Response<tonic::body::Body>;

    impl tower::Service<tonic::codegen::http::Request<tonic::body::Body>> for BigInfo {
        type Response = Answer;
        type Error = std::convert::Infallible;
        type Future = std::pin::Pin<
            Box<dyn std::future::Future<Output = std::result::Result<Answer, Self::Error>> + Send>,
        >;
        fn poll_ready(
            &mut self,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::result::Result<(), Self::Error>> {
            std::task::Poll::Ready(Ok(()))
        }
        fn call(&mut self, req: tonic::codegen::http::Request<tonic::body::Body>) -> Self::Future {
            let me = self.clone();
            Box::pin(async move {
                let codec = tonic_prost::ProstCodec::<PluginInfo, InfoRequest>::default();
                Ok(tonic::server::Grpc::new(codec).unary(me, req).await)
            })
        }
    }

    /// `GetInfo` of a socket answering a name of `len` bytes.
    fn get_info_of(len: usize) -> Result<PluginInfo> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("reg.sock");
        rt.block_on(async {
            let l = tokio::net::UnixListener::bind(&sock).unwrap();
            let incoming = tonic::codegen::tokio_stream::wrappers::UnixListenerStream::new(l);
            let server = tonic::transport::Server::builder()
                .add_service(BigInfo(len))
                .serve_with_incoming(incoming);
            tokio::spawn(server);
            get_info(&sock, Duration::from_secs(30)).await.map(|r| r.0)
        })
    }

    /// Before, `GetInfo` read answers up to tonic's default 4 MiB: a
    /// plugin's 100 KiB name was taken (and went into every message).
    #[test]
    fn get_info_answers_are_bounded() {
        assert_eq!(get_info_of(1000).unwrap().name.len(), 1000);
        let got = get_info_of(100 << 10).map(|i| i.name.len());
        assert!(matches!(got, Err(RegistrationError::GetInfo(_))), "{got:?}");
    }

    /// Names a plugin announced go into messages cut to 253 bytes.
    #[test]
    fn names_in_messages_are_cut() {
        let r = DriverRegistry::new();
        let sock = Path::new("/r/plugins_registry/d-reg.sock");
        let long = "é".repeat(1000);
        let e = validate(&info("CSIPlugin", &long, "rel", &["1.0.0"]), sock, &r).unwrap_err();
        let RegistrationError::RelativeEndpoint { name, .. } = &e else {
            panic!("{e:?}");
        };
        assert_eq!(name.len(), 252);
        assert!(e.to_string().len() < 400, "{e}");
        let e = validate(&info(&long, "d", "/p", &["1.0.0"]), sock, &r).unwrap_err();
        assert!(e.to_string().len() < 400, "{e}");
        assert_eq!(cut_name("abc"), "abc");
    }

    #[test]
    fn node_get_info_answers_are_checked() {
        let answer = |id: &str, max: i64, topo: &[(&str, &str)]| csi::NodeGetInfoResponse {
            node_id: id.into(),
            max_volumes_per_node: max,
            accessible_topology: (!topo.is_empty()).then(|| csi::Topology {
                segments: topo
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            }),
        };
        let ok = node_info_of(answer("n1", 7, &[("topology.x/zone", "a")])).unwrap();
        assert_eq!(ok.node_id, "n1");
        assert_eq!(ok.max_volumes_per_node, 7);
        assert_eq!(ok.accessible_topology["topology.x/zone"], "a");
        assert!(node_info_of(answer("n1", 0, &[]))
            .unwrap()
            .accessible_topology
            .is_empty());
        assert_eq!(
            node_info_of(answer("", 0, &[])).unwrap_err(),
            NodeInfoRefused::EmptyNodeId
        );
        let long = node_info_of(answer(&"n".repeat(257), 0, &[])).unwrap_err();
        assert!(long.to_string().contains("257 bytes"), "{long}");
        assert_eq!(
            node_info_of(answer("n1", -1, &[])).unwrap_err(),
            NodeInfoRefused::NegativeLimit(-1)
        );
    }
}
