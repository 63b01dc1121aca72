//! The CSI client (the kubelet's `csi_client.go`): gRPC over each driver's
//! Unix socket with `tonic`, one cached channel per driver, re-dialled when
//! the driver registry names another socket for it, every call bounded by a
//! deadline (the kubelet's 2 minutes by default) and timed into
//! `csi_operations_seconds`. Requests are never logged: they carry secrets.

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint};

use super::csi_call_metrics::CsiMetrics;
use super::csi_proto::csi;
use super::registration::MAX_REGISTRATION_ANSWER;
use super::registry::DriverRegistry;
use crate::util::sync::MutexExt;

/// The kubelet's `csiTimeout` for node operations.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// Why a CSI call did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum CsiCallError {
    /// The driver is not (or no longer) registered on this node.
    #[error("waiting for CSI driver {0} to register")]
    NotRegistered(String),
    /// The call failed with a gRPC status (from the driver, the deadline, or
    /// the transport when the driver went away mid-call).
    #[error("CSI driver {driver}: {method}: {code:?}: {message}")]
    Rpc {
        /// The driver.
        driver: String,
        /// The RPC (`NodeStageVolume`).
        method: &'static str,
        /// The status code.
        code: tonic::Code,
        /// The status message.
        message: String,
        /// Whether the failure came from the transport (a crash mid-call, a
        /// refused connection) rather than an answer of the driver.
        transport: bool,
    },
}

impl CsiCallError {
    /// The gRPC code, if the call got that far.
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            Self::NotRegistered(_) => None,
            Self::Rpc { code, .. } => Some(*code),
        }
    }
}

/// The node service capabilities that change what the plugin calls.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeCapabilities {
    /// `STAGE_UNSTAGE_VOLUME`: NodeStage/NodeUnstage are called.
    pub stage_unstage: bool,
    /// `EXPAND_VOLUME`: NodeExpandVolume is called.
    pub expand: bool,
    /// `GET_VOLUME_STATS`: NodeGetVolumeStats is called.
    pub volume_stats: bool,
    /// `VOLUME_CONDITION`: NodeGetVolumeStats answers carry a volume condition.
    pub volume_condition: bool,
    /// `VOLUME_MOUNT_GROUP`: the driver applies the pod's fsGroup itself
    /// (`volume_mount_group` of stage and publish).
    pub volume_mount_group: bool,
    /// `SINGLE_NODE_MULTI_WRITER`: the driver takes the
    /// `SINGLE_NODE_SINGLE_WRITER` and `SINGLE_NODE_MULTI_WRITER` access
    /// modes (ReadWriteOncePod and ReadWriteOnce are then told apart).
    pub single_node_multi_writer: bool,
}

struct Dialled {
    endpoint: PathBuf,
    channel: Channel,
    caps: Option<NodeCapabilities>,
}

/// Clients of every registered driver.
pub struct CsiClients {
    registry: Arc<DriverRegistry>,
    metrics: Arc<CsiMetrics>,
    timeout: Duration,
    channels: Mutex<HashMap<String, Dialled>>,
}

impl CsiClients {
    /// Clients of the drivers in `registry`, each call bounded by `timeout`.
    pub fn new(registry: Arc<DriverRegistry>, timeout: Duration) -> Arc<Self> {
        Arc::new(Self {
            registry,
            metrics: Arc::new(CsiMetrics::default()),
            timeout,
            channels: Mutex::default(),
        })
    }

    /// The driver registry.
    pub fn registry(&self) -> &Arc<DriverRegistry> {
        &self.registry
    }

    /// The `csi_operations_seconds` histograms.
    pub fn metrics(&self) -> &Arc<CsiMetrics> {
        &self.metrics
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Dialled>> {
        self.channels.locked()
    }

    /// The channel to `driver`, dialled (lazily: connecting happens on the
    /// first call, and again after the connection breaks) when the driver's
    /// registered socket differs from the cached one.
    fn channel(&self, driver: &str) -> Result<Channel, CsiCallError> {
        let endpoint = self
            .registry
            .endpoint(driver)
            .ok_or_else(|| CsiCallError::NotRegistered(driver.to_string()))?;
        let mut channels = self.lock();
        if let Some(d) = channels.get(driver).filter(|d| d.endpoint == endpoint) {
            return Ok(d.channel.clone());
        }
        let channel = dial(endpoint.clone());
        tracing::debug!(driver, endpoint = %endpoint.display(), "dialling CSI driver");
        channels.insert(
            driver.to_string(),
            Dialled {
                endpoint,
                channel: channel.clone(),
                caps: None,
            },
        );
        Ok(channel)
    }

    /// Runs one RPC with the deadline, timing it into the metrics.
    async fn call<T, F, Fut>(
        &self,
        driver: &str,
        method: &'static str,
        f: F,
    ) -> Result<T, CsiCallError>
    where
        F: FnOnce(Channel, Duration) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.call_within(driver, method, self.timeout, f).await
    }

    /// Runs one RPC with deadline `timeout`, timing it into the metrics.
    async fn call_within<T, F, Fut>(
        &self,
        driver: &str,
        method: &'static str,
        timeout: Duration,
        f: F,
    ) -> Result<T, CsiCallError>
    where
        F: FnOnce(Channel, Duration) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let channel = self.channel(driver)?;
        let started = Instant::now();
        let res = match tokio::time::timeout(timeout, f(channel, timeout)).await {
            Ok(r) => r.map(tonic::Response::into_inner),
            Err(_) => Err(tonic::Status::deadline_exceeded(format!(
                "no answer within {timeout:?}"
            ))),
        };
        let code = match &res {
            Ok(_) => tonic::Code::Ok,
            Err(s) => s.code(),
        };
        self.metrics
            .record(driver, method, code_name(code), started.elapsed());
        res.map_err(|s| {
            let transport = std::error::Error::source(&s).is_some();
            CsiCallError::Rpc {
                driver: driver.to_string(),
                method,
                code: s.code(),
                message: s.message().to_string(),
                transport,
            }
        })
    }

    /// `GetPluginInfo`: the driver's name and version.
    pub async fn get_plugin_info(
        &self,
        driver: &str,
    ) -> Result<csi::GetPluginInfoResponse, CsiCallError> {
        self.call(
            driver,
            "/csi.v1.Identity/GetPluginInfo",
            |ch, t| async move {
                csi::identity_client::IdentityClient::new(ch)
                    .max_decoding_message_size(MAX_REGISTRATION_ANSWER)
                    .get_plugin_info(request(csi::GetPluginInfoRequest {}, t))
                    .await
            },
        )
        .await
    }

    /// `GetPluginCapabilities`.
    pub async fn get_plugin_capabilities(
        &self,
        driver: &str,
    ) -> Result<csi::GetPluginCapabilitiesResponse, CsiCallError> {
        self.call(
            driver,
            "/csi.v1.Identity/GetPluginCapabilities",
            |ch, t| async move {
                csi::identity_client::IdentityClient::new(ch)
                    .max_decoding_message_size(MAX_REGISTRATION_ANSWER)
                    .get_plugin_capabilities(request(csi::GetPluginCapabilitiesRequest {}, t))
                    .await
            },
        )
        .await
    }

    /// `Probe`: whether the driver is ready (an unset `ready` means ready).
    pub async fn probe(&self, driver: &str) -> Result<bool, CsiCallError> {
        let r = self
            .call(driver, "/csi.v1.Identity/Probe", |ch, t| async move {
                csi::identity_client::IdentityClient::new(ch)
                    .max_decoding_message_size(MAX_REGISTRATION_ANSWER)
                    .probe(request(csi::ProbeRequest {}, t))
                    .await
            })
            .await?;
        Ok(r.ready.unwrap_or(true))
    }

    /// `NodeGetInfo`.
    pub async fn node_get_info(
        &self,
        driver: &str,
    ) -> Result<csi::NodeGetInfoResponse, CsiCallError> {
        self.call(driver, "/csi.v1.Node/NodeGetInfo", |ch, t| async move {
            csi::node_client::NodeClient::new(ch)
                .node_get_info(request(csi::NodeGetInfoRequest {}, t))
                .await
        })
        .await
    }

    /// `NodeGetCapabilities`, asked once per dialled channel.
    pub async fn node_capabilities(&self, driver: &str) -> Result<NodeCapabilities, CsiCallError> {
        let endpoint = self.registry.endpoint(driver);
        if let Some(caps) = self
            .lock()
            .get(driver)
            .filter(|d| Some(&d.endpoint) == endpoint.as_ref())
            .and_then(|d| d.caps)
        {
            return Ok(caps);
        }
        let r = self
            .call(
                driver,
                "/csi.v1.Node/NodeGetCapabilities",
                |ch, t| async move {
                    csi::node_client::NodeClient::new(ch)
                        .node_get_capabilities(request(csi::NodeGetCapabilitiesRequest {}, t))
                        .await
                },
            )
            .await?;
        use csi::node_service_capability::{rpc::Type, Type as Cap};
        let mut caps = NodeCapabilities::default();
        for c in r.capabilities {
            let Some(Cap::Rpc(rpc)) = c.r#type else {
                continue;
            };
            match Type::try_from(rpc.r#type) {
                Ok(Type::StageUnstageVolume) => caps.stage_unstage = true,
                Ok(Type::ExpandVolume) => caps.expand = true,
                Ok(Type::GetVolumeStats) => caps.volume_stats = true,
                Ok(Type::VolumeCondition) => caps.volume_condition = true,
                Ok(Type::VolumeMountGroup) => caps.volume_mount_group = true,
                Ok(Type::SingleNodeMultiWriter) => caps.single_node_multi_writer = true,
                _ => {}
            }
        }
        if let Some(d) = self
            .lock()
            .get_mut(driver)
            .filter(|d| Some(&d.endpoint) == endpoint.as_ref())
        {
            d.caps = Some(caps);
        }
        Ok(caps)
    }

    /// `NodeStageVolume`.
    pub async fn node_stage_volume(
        &self,
        driver: &str,
        req: csi::NodeStageVolumeRequest,
    ) -> Result<(), CsiCallError> {
        self.call(driver, "/csi.v1.Node/NodeStageVolume", |ch, t| async move {
            csi::node_client::NodeClient::new(ch)
                .node_stage_volume(request(req, t))
                .await
        })
        .await
        .map(drop)
    }

    /// `NodeUnstageVolume`.
    pub async fn node_unstage_volume(
        &self,
        driver: &str,
        req: csi::NodeUnstageVolumeRequest,
    ) -> Result<(), CsiCallError> {
        self.call(
            driver,
            "/csi.v1.Node/NodeUnstageVolume",
            |ch, t| async move {
                csi::node_client::NodeClient::new(ch)
                    .node_unstage_volume(request(req, t))
                    .await
            },
        )
        .await
        .map(drop)
    }

    /// `NodePublishVolume`.
    pub async fn node_publish_volume(
        &self,
        driver: &str,
        req: csi::NodePublishVolumeRequest,
    ) -> Result<(), CsiCallError> {
        self.call(
            driver,
            "/csi.v1.Node/NodePublishVolume",
            |ch, t| async move {
                csi::node_client::NodeClient::new(ch)
                    .node_publish_volume(request(req, t))
                    .await
            },
        )
        .await
        .map(drop)
    }

    /// `NodeUnpublishVolume`.
    pub async fn node_unpublish_volume(
        &self,
        driver: &str,
        req: csi::NodeUnpublishVolumeRequest,
    ) -> Result<(), CsiCallError> {
        self.call(
            driver,
            "/csi.v1.Node/NodeUnpublishVolume",
            |ch, t| async move {
                csi::node_client::NodeClient::new(ch)
                    .node_unpublish_volume(request(req, t))
                    .await
            },
        )
        .await
        .map(drop)
    }

    /// `NodeExpandVolume`; returns the capacity the driver reports (0: unknown).
    pub async fn node_expand_volume(
        &self,
        driver: &str,
        req: csi::NodeExpandVolumeRequest,
    ) -> Result<i64, CsiCallError> {
        self.call(
            driver,
            "/csi.v1.Node/NodeExpandVolume",
            |ch, t| async move {
                csi::node_client::NodeClient::new(ch)
                    .node_expand_volume(request(req, t))
                    .await
            },
        )
        .await
        .map(|r| r.capacity_bytes)
    }

    /// The deadline of every call (`--csi-timeout`).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// `NodeGetVolumeStats`.
    pub async fn node_get_volume_stats(
        &self,
        driver: &str,
        req: csi::NodeGetVolumeStatsRequest,
    ) -> Result<csi::NodeGetVolumeStatsResponse, CsiCallError> {
        self.node_get_volume_stats_within(driver, req, self.timeout)
            .await
    }

    /// `NodeGetVolumeStats` with deadline `timeout` (at most the clients' own).
    pub async fn node_get_volume_stats_within(
        &self,
        driver: &str,
        req: csi::NodeGetVolumeStatsRequest,
        timeout: Duration,
    ) -> Result<csi::NodeGetVolumeStatsResponse, CsiCallError> {
        self.call_within(
            driver,
            "/csi.v1.Node/NodeGetVolumeStats",
            timeout.min(self.timeout),
            |ch, t| async move {
                csi::node_client::NodeClient::new(ch)
                    .node_get_volume_stats(request(req, t))
                    .await
            },
        )
        .await
    }
}

/// A request carrying the deadline in `grpc-timeout`, so the driver sees it too.
fn request<T>(msg: T, timeout: Duration) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.set_timeout(timeout);
    r
}

/// A lazily connecting channel to the Unix socket `path` (the URI is a
/// placeholder tonic requires; the connector ignores it).
fn dial(path: PathBuf) -> Channel {
    let endpoint = Endpoint::from_static("http://[::1]:50051");
    endpoint.connect_with_connector_lazy(tower::service_fn(move |_: tonic::transport::Uri| {
        let path = path.clone();
        async move {
            let stream = tokio::net::UnixStream::connect(path).await?;
            Ok::<_, std::io::Error>(TokioIo::new(stream))
        }
    }))
}

/// The kubelet's `grpc_status_code` label value (`OK`, `DeadlineExceeded`, ...).
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "Canceled",
        Unknown => "Unknown",
        InvalidArgument => "InvalidArgument",
        DeadlineExceeded => "DeadlineExceeded",
        NotFound => "NotFound",
        AlreadyExists => "AlreadyExists",
        PermissionDenied => "PermissionDenied",
        ResourceExhausted => "ResourceExhausted",
        FailedPrecondition => "FailedPrecondition",
        Aborted => "Aborted",
        OutOfRange => "OutOfRange",
        Unimplemented => "Unimplemented",
        Internal => "Internal",
        Unavailable => "Unavailable",
        DataLoss => "DataLoss",
        Unauthenticated => "Unauthenticated",
    }
}
