//! The gRPC services: CSI Identity and Node, and the kubelet's plugin
//! Registration. Each method validates nothing itself: it hands the request
//! to the driver (driver.rs for faults/journal, node.rs for the work).

use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::driver::Driver;
use crate::proto::csi;
use crate::proto::registration as reg;

/// The CSI Identity and Node services.
#[derive(Debug, Clone)]
pub struct Csi(pub Arc<Driver>);

fn vol(id: &str) -> Option<String> {
    Some(id.to_string())
}

#[tonic::async_trait]
impl csi::identity_server::Identity for Csi {
    async fn get_plugin_info(
        &self,
        _: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        self.0
            .call("GetPluginInfo", None, false, |d| {
                Ok(csi::GetPluginInfoResponse {
                    name: d.name.clone(),
                    vendor_version: env!("CARGO_PKG_VERSION").to_string(),
                    manifest: Default::default(),
                })
            })
            .await
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        use csi::plugin_capability::{volume_expansion, Type, VolumeExpansion};
        self.0
            .call("GetPluginCapabilities", None, false, |_| {
                // Node-only plugin: no CONTROLLER_SERVICE. Expansion happens on
                // the node while the volume is in use.
                Ok(csi::GetPluginCapabilitiesResponse {
                    capabilities: vec![csi::PluginCapability {
                        r#type: Some(Type::VolumeExpansion(VolumeExpansion {
                            r#type: volume_expansion::Type::Online as i32,
                        })),
                    }],
                })
            })
            .await
    }

    async fn probe(
        &self,
        _: Request<csi::ProbeRequest>,
    ) -> Result<Response<csi::ProbeResponse>, Status> {
        self.0
            .call("Probe", None, false, |_| {
                Ok(csi::ProbeResponse { ready: Some(true) })
            })
            .await
    }
}

#[tonic::async_trait]
impl csi::node_server::Node for Csi {
    async fn node_stage_volume(
        &self,
        request: Request<csi::NodeStageVolumeRequest>,
    ) -> Result<Response<csi::NodeStageVolumeResponse>, Status> {
        let req = request.into_inner();
        self.0.record_contexts(
            "NodeStageVolume",
            &req.volume_id,
            &req.volume_context,
            &req.publish_context,
            req.volume_capability.as_ref(),
        );
        self.0
            .call("NodeStageVolume", vol(&req.volume_id), true, move |d| {
                d.stage(req).map(|()| csi::NodeStageVolumeResponse {})
            })
            .await
    }

    async fn node_unstage_volume(
        &self,
        request: Request<csi::NodeUnstageVolumeRequest>,
    ) -> Result<Response<csi::NodeUnstageVolumeResponse>, Status> {
        let req = request.into_inner();
        self.0
            .call("NodeUnstageVolume", vol(&req.volume_id), true, move |d| {
                d.unstage(req).map(|()| csi::NodeUnstageVolumeResponse {})
            })
            .await
    }

    async fn node_publish_volume(
        &self,
        request: Request<csi::NodePublishVolumeRequest>,
    ) -> Result<Response<csi::NodePublishVolumeResponse>, Status> {
        let req = request.into_inner();
        self.0.record_contexts(
            "NodePublishVolume",
            &req.volume_id,
            &req.volume_context,
            &req.publish_context,
            req.volume_capability.as_ref(),
        );
        self.0
            .call("NodePublishVolume", vol(&req.volume_id), true, move |d| {
                d.publish(req).map(|()| csi::NodePublishVolumeResponse {})
            })
            .await
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<csi::NodeUnpublishVolumeResponse>, Status> {
        let req = request.into_inner();
        self.0
            .call("NodeUnpublishVolume", vol(&req.volume_id), true, move |d| {
                d.unpublish(req)
                    .map(|()| csi::NodeUnpublishVolumeResponse {})
            })
            .await
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<csi::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<csi::NodeGetVolumeStatsResponse>, Status> {
        let req = request.into_inner();
        // Stats do not take the volume's operation lock: the kubelet polls
        // them while other operations run.
        self.0
            .call("NodeGetVolumeStats", vol(&req.volume_id), false, move |d| {
                d.stats(req)
            })
            .await
    }

    async fn node_expand_volume(
        &self,
        request: Request<csi::NodeExpandVolumeRequest>,
    ) -> Result<Response<csi::NodeExpandVolumeResponse>, Status> {
        let req = request.into_inner();
        self.0
            .call("NodeExpandVolume", vol(&req.volume_id), true, move |d| {
                d.expand(req)
            })
            .await
    }

    async fn node_get_capabilities(
        &self,
        _: Request<csi::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<csi::NodeGetCapabilitiesResponse>, Status> {
        use csi::node_service_capability::{rpc::Type, Rpc, Type as Cap};
        self.0
            .call("NodeGetCapabilities", None, false, |d| {
                let cap = |t: Type| csi::NodeServiceCapability {
                    r#type: Some(Cap::Rpc(Rpc { r#type: t as i32 })),
                };
                let mut capabilities = vec![
                    cap(Type::StageUnstageVolume),
                    cap(Type::ExpandVolume),
                    cap(Type::GetVolumeStats),
                    cap(Type::VolumeCondition),
                ];
                if d.single_node_multi_writer {
                    capabilities.push(cap(Type::SingleNodeMultiWriter));
                }
                if d.volume_mount_group {
                    capabilities.push(cap(Type::VolumeMountGroup));
                }
                Ok(csi::NodeGetCapabilitiesResponse { capabilities })
            })
            .await
    }

    async fn node_get_info(
        &self,
        _: Request<csi::NodeGetInfoRequest>,
    ) -> Result<Response<csi::NodeGetInfoResponse>, Status> {
        self.0
            .call("NodeGetInfo", None, false, |d| {
                Ok(csi::NodeGetInfoResponse {
                    node_id: d.node_id.clone(),
                    max_volumes_per_node: d.max_volumes_per_node,
                    accessible_topology: (!d.topology.is_empty()).then(|| csi::Topology {
                        segments: d.topology.clone(),
                    }),
                })
            })
            .await
    }
}

/// The kubelet plugin Registration service, as node-driver-registrar serves
/// it for a CSI driver.
#[derive(Debug, Clone)]
pub struct Registration(pub Arc<Driver>);

#[tonic::async_trait]
impl reg::registration_server::Registration for Registration {
    async fn get_info(
        &self,
        _: Request<reg::InfoRequest>,
    ) -> Result<Response<reg::PluginInfo>, Status> {
        self.0
            .call("GetInfo", None, false, |d| {
                Ok(reg::PluginInfo {
                    r#type: "CSIPlugin".to_string(),
                    name: d.name.clone(),
                    endpoint: d.endpoint.to_string_lossy().into_owned(),
                    supported_versions: vec!["1.0.0".to_string()],
                })
            })
            .await
    }

    async fn notify_registration_status(
        &self,
        request: Request<reg::RegistrationStatus>,
    ) -> Result<Response<reg::RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        self.0
            .call("NotifyRegistrationStatus", None, false, move |d| {
                d.record_registration(status.plugin_registered, &status.error)
                    .map(|()| reg::RegistrationStatusResponse {})
            })
            .await
    }
}
