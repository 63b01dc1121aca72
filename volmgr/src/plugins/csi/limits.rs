//! The node's per-driver volume limit: `NodeGetInfo`'s
//! `max_volumes_per_node`, enforced when a CSI volume starts being used on
//! the node.
//!
//! The kubelet leaves this limit to the scheduler (it publishes it in
//! CSINode's `allocatable.count`). volmgr's pods often come without a
//! scheduler in front (the manifests directory, a kubelet fork through the
//! C ABI), so the node enforces it itself, here in the kubelet-side CSI
//! plugin, because the plugin is the one place that sees both ends of a
//! volume's use of the node and knows the driver registry:
//!
//! - a PersistentVolume's volume starts being used by its device phase
//!   (`mount_device`: NodeStageVolume for drivers that stage; for those
//!   that do not, the same device phase, which comes before the volume's
//!   first NodePublishVolume and makes no call) and stops with the end of
//!   it (`unmount_device`, after the last pod's tear-down);
//! - an inline volume (one per pod, never staged) starts with its
//!   NodePublishVolume and stops with its NodeUnpublishVolume;
//! - volumes found at start-up (reconstruction) are in use as found.
//!
//! A generic plugin method consulted by the reconciler would have to count
//! the same volumes from both worlds and the operations in flight, under
//! the reconciler's locks, for a rule only CSI has; here one mutex-guarded
//! set per driver is taken and given back by the calls that make and undo
//! the volume's use, so operations running concurrently on different
//! volumes never overshoot.
//!
//! A volume already in use (another pod sharing it, a republish, a remount
//! of a volume found at start-up, a stage again after `FAILED_PRECONDITION`)
//! is never refused. A refusal is an ordinary failure: the operation is
//! retried with the executor's backoff, and succeeds once another volume of
//! the driver has gone.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use crate::plugins::VolumeError;
use crate::util::sync::MutexExt;
use crate::volume::UniqueVolumeName;

/// A CSI volume refused because its driver's node limit is reached.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("node limit of {limit} volumes of driver {driver:?} reached ({in_use} in use)")]
pub struct VolumeLimitError {
    /// The driver.
    pub driver: String,
    /// Its `max_volumes_per_node`.
    pub limit: u64,
    /// How many of its volumes are in use on the node.
    pub in_use: usize,
}

/// The volumes of each driver in use on the node (staged, published, or
/// being set up), by unique volume name.
#[derive(Debug, Default)]
pub struct VolumeLimits {
    in_use: Mutex<BTreeMap<String, BTreeSet<UniqueVolumeName>>>,
}

impl VolumeLimits {
    /// No volume in use.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Takes a place for `volume` of `driver` before the call that starts
    /// its use of the node. A volume already in use keeps its place and is
    /// never refused; a new one is refused when `limit` (`None`: no limit)
    /// volumes of the driver are in use already.
    pub fn reserve(
        self: &Arc<Self>,
        driver: &str,
        volume: &UniqueVolumeName,
        limit: Option<u64>,
    ) -> Result<Slot, VolumeLimitError> {
        let mut all = self.in_use.locked();
        let set = all.entry(driver.to_string()).or_default();
        if set.contains(volume) {
            return Ok(Slot::held());
        }
        if let Some(limit) = limit {
            if set.len() as u64 >= limit {
                return Err(VolumeLimitError {
                    driver: driver.to_string(),
                    limit,
                    in_use: set.len(),
                });
            }
        }
        set.insert(volume.clone());
        Ok(Slot {
            taken: Some((Arc::clone(self), driver.to_string(), volume.clone())),
        })
    }

    /// Counts `volume` of `driver` as in use (found at start-up).
    pub fn adopt(&self, driver: &str, volume: &UniqueVolumeName) {
        self.in_use
            .locked()
            .entry(driver.to_string())
            .or_default()
            .insert(volume.clone());
    }

    /// `volume` of `driver` is no longer used on the node.
    pub fn release(&self, driver: &str, volume: &UniqueVolumeName) {
        let mut all = self.in_use.locked();
        if let Some(set) = all.get_mut(driver) {
            set.remove(volume);
            if set.is_empty() {
                all.remove(driver);
            }
        }
    }

    /// How many volumes of `driver` are in use.
    pub fn in_use(&self, driver: &str) -> usize {
        self.in_use.locked().get(driver).map_or(0, BTreeSet::len)
    }
}

/// A volume's place among its driver's volumes in use, from
/// [`VolumeLimits::reserve`]. Dropped without [`keep`](Self::keep), a place
/// this reservation took is given back (the call failed, or never
/// happened); a volume that was in use before keeps its place either way.
#[must_use = "dropping a slot gives its place back"]
#[derive(Debug)]
pub struct Slot {
    taken: Option<(Arc<VolumeLimits>, String, UniqueVolumeName)>,
}

impl Slot {
    /// The place of a volume that was already in use.
    fn held() -> Self {
        Self { taken: None }
    }

    /// The volume is in use: keeps the place until it is released.
    pub fn keep(mut self) {
        self.taken = None;
    }

    /// Keeps the place unless `res` is a certain failure: after success
    /// the volume is in use, after an uncertain failure it may be (it is
    /// then set up again or torn down, which releases it).
    pub fn settle<T>(self, res: &Result<T, VolumeError>) {
        match res {
            Err(e) if !e.is_uncertain() => drop(self),
            _ => self.keep(),
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some((limits, driver, volume)) = self.taken.take() {
            limits.release(&driver, &volume);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vol(n: &str) -> UniqueVolumeName {
        UniqueVolumeName::new(format!("kubernetes.io/csi/d^{n}"))
    }

    #[test]
    fn refused_at_the_limit_with_a_clear_error() {
        let l = VolumeLimits::new();
        l.reserve("d", &vol("a"), Some(2)).unwrap().keep();
        l.reserve("d", &vol("b"), Some(2)).unwrap().keep();
        let e = l.reserve("d", &vol("c"), Some(2)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "node limit of 2 volumes of driver \"d\" reached (2 in use)"
        );
        assert_eq!(
            VolumeError::from(e.clone()).to_string(),
            e.to_string(),
            "the operation's error is the limit's"
        );
        // Other drivers, and drivers without a limit, are not affected.
        l.reserve("other", &vol("c"), Some(1)).unwrap().keep();
        for i in 0..10 {
            l.reserve("d2", &vol(&i.to_string()), None).unwrap().keep();
        }
        assert_eq!(l.in_use("d2"), 10);
        // A volume released frees its place.
        l.release("d", &vol("a"));
        l.reserve("d", &vol("c"), Some(2)).unwrap().keep();
        assert_eq!(l.in_use("d"), 2);
    }

    #[test]
    fn a_volume_in_use_is_never_refused() {
        let l = VolumeLimits::new();
        l.reserve("d", &vol("a"), Some(1)).unwrap().keep();
        // A second pod, a republish, a stage again: same volume.
        let again = l.reserve("d", &vol("a"), Some(1)).unwrap();
        // Even when more are in use than the limit (it went down).
        l.adopt("d", &vol("z"));
        l.reserve("d", &vol("a"), Some(1)).unwrap().keep();
        l.release("d", &vol("z"));
        // Its failure does not give back a place it did not take.
        again.settle::<()>(&Err(VolumeError::Plugin {
            plugin: "kubernetes.io/csi".into(),
            message: "no".into(),
        }));
        assert_eq!(l.in_use("d"), 1);
        assert!(l.reserve("d", &vol("b"), Some(1)).is_err());
    }

    #[test]
    fn a_failed_call_gives_its_place_back_an_uncertain_one_keeps_it() {
        let l = VolumeLimits::new();
        let s = l.reserve("d", &vol("a"), Some(1)).unwrap();
        assert_eq!(l.in_use("d"), 1, "taken before the call");
        s.settle::<()>(&Err(VolumeError::Plugin {
            plugin: "kubernetes.io/csi".into(),
            message: "stage failed".into(),
        }));
        assert_eq!(l.in_use("d"), 0);
        // Dropped (the call never happened, the operation was cancelled).
        drop(l.reserve("d", &vol("a"), Some(1)).unwrap());
        assert_eq!(l.in_use("d"), 0);
        // Uncertain: the driver may have staged it.
        let s = l.reserve("d", &vol("a"), Some(1)).unwrap();
        s.settle::<()>(&Err(VolumeError::Uncertain("timeout".into())));
        assert_eq!(l.in_use("d"), 1);
        assert!(l.reserve("d", &vol("b"), Some(1)).is_err());
        l.release("d", &vol("a"));
        let s = l.reserve("d", &vol("b"), Some(1)).unwrap();
        s.settle(&Ok(()));
        assert_eq!(l.in_use("d"), 1);
    }

    #[test]
    fn adopted_volumes_count() {
        let l = VolumeLimits::new();
        l.adopt("d", &vol("a"));
        l.adopt("d", &vol("a"));
        l.adopt("d", &vol("b"));
        assert_eq!(l.in_use("d"), 2);
        assert!(l.reserve("d", &vol("c"), Some(2)).is_err());
        // Set up again (uncertain at start-up): not refused.
        l.reserve("d", &vol("b"), Some(2)).unwrap().keep();
        l.release("d", &vol("b"));
        l.reserve("d", &vol("c"), Some(2)).unwrap().keep();
    }

    #[test]
    fn concurrent_reservations_never_overshoot() {
        let l = VolumeLimits::new();
        let barrier = Arc::new(std::sync::Barrier::new(16));
        let handles: Vec<_> = (0..16)
            .map(|i| {
                let (l, barrier) = (Arc::clone(&l), Arc::clone(&barrier));
                std::thread::spawn(move || {
                    barrier.wait();
                    let r = l.reserve("d", &vol(&i.to_string()), Some(5));
                    // Held across the "call", as an operation does.
                    std::thread::sleep(std::time::Duration::from_millis(5));
                    match r {
                        Ok(s) => {
                            s.keep();
                            true
                        }
                        Err(_) => false,
                    }
                })
            })
            .collect();
        let won = handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .filter(|ok| *ok)
            .count();
        assert_eq!(won, 5);
        assert_eq!(l.in_use("d"), 5);
        // Failures in flight give their places back to the waiting ones.
        let l = VolumeLimits::new();
        let pending: Vec<_> = (0..3)
            .map(|i| l.reserve("d", &vol(&i.to_string()), Some(3)).unwrap())
            .collect();
        assert!(l.reserve("d", &vol("x"), Some(3)).is_err());
        drop(pending);
        assert_eq!(l.in_use("d"), 0);
        l.reserve("d", &vol("x"), Some(3)).unwrap().keep();
    }

    /// Through the plugin: the limit comes from the driver's NodeGetInfo
    /// answer in the registry; drivers without one (`--csi-driver`), or
    /// with 0, have none.
    mod plugin {
        use super::super::super::CsiPlugin;
        use super::vol;
        use crate::pluginmanager::registry::{DriverInfo, DriverRegistry, NodeInfo};
        use crate::plugins::{VolumeError, VolumePlugin};
        use crate::sys::mount_table::MountTable;
        use crate::sys::root_dir::RootDir;
        use crate::volume::PodUid;
        use std::sync::Arc;

        fn plugin(root: &std::path::Path, registry: Arc<DriverRegistry>) -> CsiPlugin {
            CsiPlugin::new(
                Arc::new(RootDir::open(root).unwrap()),
                crate::pluginmanager::csi_client::CsiClients::new(
                    registry,
                    std::time::Duration::from_secs(1),
                ),
                "node".into(),
                Arc::new(crate::sys::fake::FakeMounter::default()),
            )
        }

        fn register(r: &DriverRegistry, name: &str, max: i64) {
            r.register_driver(DriverInfo {
                name: name.into(),
                endpoint: format!("/nowhere/{name}.sock").into(),
                versions: vec!["1.0.0".into()],
                node: Some(NodeInfo {
                    node_id: "n".into(),
                    max_volumes_per_node: max,
                    ..NodeInfo::default()
                }),
            });
        }

        #[test]
        fn the_limit_is_the_registered_drivers() {
            let dir = tempfile::tempdir().unwrap();
            let r = DriverRegistry::new();
            register(&r, "d", 2);
            register(&r, "zero", 0);
            r.register_fixed("fixed", "/nowhere/fixed.sock".into());
            let p = plugin(dir.path(), Arc::clone(&r));
            p.reserve_slot("d", &vol("a")).unwrap().keep();
            p.reserve_slot("d", &vol("b")).unwrap().keep();
            let e = p.reserve_slot("d", &vol("c")).unwrap_err();
            assert!(matches!(e, VolumeError::VolumeLimit(_)), "{e:?}");
            assert!(!e.is_expansion_infeasible() && !e.is_waiting() && !e.is_uncertain());
            assert_eq!(
                e.to_string(),
                "node limit of 2 volumes of driver \"d\" reached (2 in use)"
            );
            // Shared (already in use): never refused.
            p.reserve_slot("d", &vol("a")).unwrap().keep();
            for i in 0..5 {
                p.reserve_slot("zero", &vol(&i.to_string())).unwrap().keep();
                p.reserve_slot("fixed", &vol(&i.to_string()))
                    .unwrap()
                    .keep();
            }
            // The driver registers again with a higher limit.
            register(&r, "d", 3);
            p.reserve_slot("d", &vol("c")).unwrap().keep();
            assert_eq!(p.volumes_in_use("d"), 3);
        }

        /// Volumes found at start-up count: stages (complete or not) and
        /// inline volumes found in the pods' directories.
        #[test]
        fn reconstructed_volumes_count() {
            let dir = tempfile::tempdir().unwrap();
            let root = dir.path().canonicalize().unwrap();
            let stage = root.join("plugins/kubernetes.io/csi/d/h1");
            std::fs::create_dir_all(&stage).unwrap();
            std::fs::write(
                stage.join("vol_data.json"),
                r#"{"driverName":"d","volumeHandle":"vol-1","specVolID":"pv-1"}"#,
            )
            .unwrap();
            let inline = root.join("pods/u1/volumes/kubernetes.io~csi/scratch");
            std::fs::create_dir_all(&inline).unwrap();
            std::fs::write(
                inline.join("vol_data.json"),
                r#"{"driverName":"d","volumeHandle":"csi-x","specVolID":"scratch","volumeLifecycleMode":"Ephemeral"}"#,
            )
            .unwrap();
            let r = DriverRegistry::new();
            register(&r, "d", 2);
            let p = plugin(&root, r);
            let table = MountTable::new(vec![]);
            let mut problems = Vec::new();
            let devices = crate::plugins::DeviceMountableVolumePlugin::reconstruct_devices(
                &p,
                &table,
                &mut problems,
            )
            .unwrap();
            assert_eq!(devices.len(), 1, "{problems:?}");
            let pod = PodUid::new("u1").unwrap();
            let found = p.reconstruct(&pod, "scratch", &table).unwrap().unwrap();
            assert_eq!(p.volumes_in_use("d"), 2);
            let e = p.reserve_slot("d", &vol("new")).unwrap_err();
            assert!(e.to_string().contains("(2 in use)"), "{e}");
            // The adopted volumes themselves are set up again freely.
            p.reserve_slot("d", &devices[0].volume_name).unwrap().keep();
            let inline_name = p.unique_volume_name(&pod, &found.spec);
            p.reserve_slot("d", &inline_name).unwrap().keep();
            assert_eq!(p.volumes_in_use("d"), 2);
        }
    }
}
