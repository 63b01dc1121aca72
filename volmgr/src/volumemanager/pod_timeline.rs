//! A pod's volumes' syscall timelines and the calls on them stuck now, as
//! `volmgr doctor --pod` asks the agent for them.

use crate::tracer::timeline::PodTimeline;

use super::VolumeManager;

/// The pod asked for by `namespace/name` is not on the node.
#[derive(Debug, thiserror::Error)]
#[error("no pod {0} on this node")]
pub struct NoSuchPod(pub String);

impl VolumeManager {
    /// The timelines of `pod`, given as `namespace/name` or UID among the
    /// manager's pods (a UID it does not know is taken as given: a pod that
    /// left may still have timelines).
    pub fn pod_timeline(&self, pod: &str) -> Result<PodTimeline, NoSuchPod> {
        let status = self.status();
        let found = status
            .pods
            .iter()
            .find(|p| p.uid == pod || format!("{}/{}", p.namespace, p.name) == pod);
        let (name, uid) = match found {
            Some(p) => (format!("{}/{}", p.namespace, p.name), p.uid.clone()),
            None if pod.contains('/') => return Err(NoSuchPod(pod.to_string())),
            None => (String::new(), pod.to_string()),
        };
        let ctx = self.tracer_context();
        let note = (status.tracer != "ebpf").then(|| {
            format!(
                "timelines need the eBPF tracer; the active tracer is {} ({})",
                status.tracer, status.tracer_reason
            )
        });
        Ok(PodTimeline {
            pod: name,
            volumes: ctx.status.timelines().for_pod(&uid),
            stuck: ctx.status.stuck().for_pod(&uid),
            stuck_tools: ctx.status.stuck().tools_for_pod(&uid),
            uid,
            note,
        })
    }
}
