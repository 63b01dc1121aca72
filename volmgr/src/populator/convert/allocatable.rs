//! What the node gives pods and what a pod may use of it, for the volumes
//! whose content or size depends on it: the node's allocatable (the
//! kubelet's `GetNodeAllocatable`), which downwardAPI `resourceFieldRef`
//! limits default to (`MergeContainerResourceLimits`), and the size of a
//! memory-backed emptyDir (`calculateEmptyDirMemorySize`, from the pod's
//! memory limit as `ResourceConfigForPod` sums it).
//!
//! The allocatable comes from this node's Node object when the source has
//! it (the API server, or one the C ABI's caller upserts), which records
//! the Node as read so a change converts the pod again; without one, from
//! the host, as the kubelet's own node before it is registered: online CPUs
//! and `MemTotal` (no ephemeral-storage figure).

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::populator::objects::ObjectStore;
use crate::quantity;

/// Resources whose unset (or zero) container limit is the node's
/// allocatable (`MergeContainerResourceLimits`; never hugepages, which are
/// never overcommitted).
pub(crate) const DEFAULTED_LIMITS: [&str; 3] = ["cpu", "memory", "ephemeral-storage"];

/// `resource` of the node's allocatable, in the unit `resourceFieldRef`
/// works in (CPU in thousandths, the rest in bytes): the Node object's
/// `status.allocatable` when `objects` has this node's (`None` for a
/// resource it does not list), else the host's CPUs and memory.
pub(crate) fn node_allocatable(objects: Option<&ObjectStore>, resource: &str) -> Option<u64> {
    if let Some(node) = objects.and_then(|o| o.node()) {
        let q = node
            .status
            .as_ref()
            .and_then(|s| s.allocatable.as_ref())
            .and_then(|a| a.get(resource))?;
        return match resource {
            "cpu" => quantity::parse_milli(&q.0).ok(),
            _ => quantity::parse_bytes(&q.0).ok(),
        };
    }
    match resource {
        "cpu" => Some(std::thread::available_parallelism().map_or(1, |n| n.get()) as u64 * 1000),
        "memory" => host_memory(),
        _ => None,
    }
}

/// `MemTotal` of `/proc/meminfo`, in bytes, read once per process (as the
/// kubelet reads the machine's memory capacity once, from cAdvisor's
/// machine info, at start-up): every memory-backed emptyDir asks for it,
/// and generating `/proc/meminfo` costs several microseconds a read.
fn host_memory() -> Option<u64> {
    static MEM_TOTAL: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *MEM_TOTAL.get_or_init(read_host_memory)
}

fn read_host_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib = text
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse::<u64>()
        .ok()?;
    kib.checked_mul(1024)
}

/// A container's memory limit in bytes (0 when unset or unreadable).
fn memory_limit(c: &Container) -> u64 {
    c.resources
        .as_ref()
        .and_then(|r| r.limits.as_ref())
        .and_then(|l| l.get("memory"))
        .and_then(|q| quantity::parse_bytes(&q.0).ok())
        .unwrap_or(0)
}

/// The pod's memory limit as the kubelet sets its cgroup
/// (`ResourceConfigForPod`), in bytes: the pod-level limit when set
/// (`spec.resources`), else the containers' sum (restartable init
/// containers, i.e. sidecars, included) or the largest init container's
/// (with the sidecars started before it) if larger; `None` unless every
/// container declares a non-zero memory limit (the kubelet then sets
/// none). `spec.overhead` is added.
pub(crate) fn pod_memory_limit(pod: &Pod) -> Option<u64> {
    let spec = pod.spec.as_ref()?;
    let mut declared = true;
    let mut sum = 0u64;
    for c in &spec.containers {
        let l = memory_limit(c);
        declared &= l > 0;
        sum = sum.saturating_add(l);
    }
    let (mut sidecars, mut init_max) = (0u64, 0u64);
    for c in spec.init_containers.iter().flatten() {
        let l = memory_limit(c);
        let candidate = if c.restart_policy.as_deref() == Some("Always") {
            sum = sum.saturating_add(l);
            sidecars = sidecars.saturating_add(l);
            sidecars
        } else {
            l.saturating_add(sidecars)
        };
        declared &= candidate > 0;
        init_max = init_max.max(candidate);
    }
    let mut limit = sum.max(init_max);
    let pod_level = spec
        .resources
        .as_ref()
        .and_then(|r| r.limits.as_ref())
        .and_then(|l| l.get("memory"))
        .and_then(|q| quantity::parse_bytes(&q.0).ok())
        .filter(|&l| l > 0);
    if let Some(l) = pod_level {
        declared = true;
        limit = l;
    }
    if !declared || limit == 0 {
        return None;
    }
    let overhead = spec
        .overhead
        .as_ref()
        .and_then(|o| o.get("memory"))
        .and_then(|q| quantity::parse_bytes(&q.0).ok())
        .unwrap_or(0);
    Some(limit.saturating_add(overhead))
}

/// The kubelet's `calculateEmptyDirMemorySize` (`SizeMemoryBackedVolumes`,
/// GA and always on since 1.32): the node's allocatable memory, lowered to
/// the pod's memory limit and then to the volume's `sizeLimit` when each is
/// positive and not above it. `None` (no `size=`: the kernel's default,
/// half the RAM) when that is zero.
pub(crate) fn empty_dir_memory_size(
    allocatable: Option<u64>,
    pod_limit: Option<u64>,
    size_limit: Option<u64>,
) -> Option<u64> {
    let mut size = allocatable.unwrap_or(0);
    for limit in [pod_limit, size_limit].into_iter().flatten() {
        if limit > 0 && limit <= size {
            size = limit;
        }
    }
    Some(size).filter(|&s| s > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}, "spec": spec}))
            .unwrap()
    }

    fn c(name: &str, memory: Option<&str>) -> serde_json::Value {
        match memory {
            Some(m) => serde_json::json!({"name": name, "resources": {"limits": {"memory": m}}}),
            None => serde_json::json!({"name": name}),
        }
    }

    #[test]
    fn pod_memory_limit_is_what_the_pod_cgroup_gets() {
        let limit = |spec| pod_memory_limit(&pod(spec));
        // Two containers: the sum.
        let both = serde_json::json!({"containers": [c("a", Some("64Mi")), c("b", Some("32Mi"))]});
        assert_eq!(limit(both), Some(96 << 20));
        // One without a limit: none.
        let one = serde_json::json!({"containers": [c("a", Some("64Mi")), c("b", None)]});
        assert_eq!(limit(one), None);
        // An init container larger than the containers' sum wins; a sidecar
        // (restartPolicy Always) adds to the sum and to later init ones.
        let init = serde_json::json!({
            "initContainers": [
                {"name": "side", "restartPolicy": "Always", "resources": {"limits": {"memory": "16Mi"}}},
                c("big", Some("200Mi")),
            ],
            "containers": [c("a", Some("64Mi"))],
        });
        assert_eq!(limit(init), Some(216 << 20));
        let small_init = serde_json::json!({
            "initContainers": [c("i", Some("8Mi"))],
            "containers": [c("a", Some("64Mi"))],
        });
        assert_eq!(limit(small_init), Some(64 << 20));
        // An init container without a limit: none.
        let bare_init = serde_json::json!({
            "initContainers": [c("i", None)],
            "containers": [c("a", Some("64Mi"))],
        });
        assert_eq!(limit(bare_init), None);
        // A pod-level limit is the limit; overhead is added.
        let pod_level = serde_json::json!({
            "resources": {"limits": {"memory": "1Gi"}},
            "overhead": {"memory": "1Mi"},
            "containers": [c("a", None)],
        });
        assert_eq!(limit(pod_level), Some((1 << 30) + (1 << 20)));
    }

    #[test]
    fn empty_dir_memory_size_is_the_smallest_positive_bound() {
        let gi = 1u64 << 30;
        assert_eq!(
            empty_dir_memory_size(Some(8 * gi), None, None),
            Some(8 * gi)
        );
        assert_eq!(
            empty_dir_memory_size(Some(8 * gi), Some(gi), None),
            Some(gi)
        );
        assert_eq!(
            empty_dir_memory_size(Some(8 * gi), Some(gi), Some(gi / 2)),
            Some(gi / 2)
        );
        // A sizeLimit above the pod's limit (or the node's) is not used.
        assert_eq!(
            empty_dir_memory_size(Some(8 * gi), Some(gi), Some(2 * gi)),
            Some(gi)
        );
        assert_eq!(
            empty_dir_memory_size(Some(8 * gi), None, Some(16 * gi)),
            Some(8 * gi)
        );
        // No allocatable known: no size (as the kubelet with a zero one).
        assert_eq!(empty_dir_memory_size(None, Some(gi), Some(gi)), None);
    }
}
