//! Wiring of CSI into a manager: the kubelet-side plugin on top of the
//! driver clients, their metrics, its volume stats, and retries when a
//! driver registers.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::{Error, VolumeManager};
use crate::pluginmanager::csi_client::CsiClients;
use crate::pluginmanager::plugin_watcher::{PluginWatcher, ProblemSink, WatcherConfig};
use crate::pluginmanager::registry::DriverRegistry;
use crate::plugins::csi::CsiPlugin;
use crate::sys::root_dir::RelPath;

/// The kubelet's plugin registration directory under ROOT
/// (`ROOT/plugins_registry`), where node-driver-registrar puts its socket.
pub const PLUGINS_REGISTRY_DIR: &str = "plugins_registry";

/// Registers the `kubernetes.io/csi` plugin on `vm`, calling the drivers of
/// `registry` with `timeout` per call: adds `csi_operations_seconds` to the
/// metrics and retries operations waiting for a driver whenever the registry
/// changes. Call from within the tokio runtime, before `start`.
pub fn install(
    vm: &Arc<VolumeManager>,
    registry: Arc<DriverRegistry>,
    timeout: Duration,
) -> Result<Arc<CsiClients>, Error> {
    let mut changes = registry.subscribe();
    let clients = CsiClients::new(Arc::clone(&registry), timeout);
    let plugin = Arc::new(
        CsiPlugin::new(
            Arc::clone(&vm.root),
            Arc::clone(&clients),
            vm.config.node_name.clone(),
            Arc::clone(&vm.mounter),
        )
        .with_tokens(
            Arc::clone(&vm.payload.tokens),
            vm.config.csi_republish_period,
        )
        .with_selinux(vm.config.selinux_settings().enabled),
    );
    vm.register_plugin(Arc::clone(&plugin) as Arc<dyn crate::plugins::VolumePlugin>)?;
    // Volume stats: NodeGetVolumeStats, each call within the CSI timeout
    // or 10 s, whichever is smaller.
    vm.stats_provider.set_csi(plugin);
    vm.stats.set_timeout(timeout);
    vm.set_csi_driver_registry(registry);
    let metrics = Arc::clone(clients.metrics());
    vm.add_metrics_source(Arc::new(move || metrics.render()));
    let weak = Arc::downgrade(vm);
    tokio::spawn(async move {
        while changes.changed().await.is_ok() {
            let Some(vm) = weak.upgrade() else { break };
            vm.retry_waiting();
        }
    });
    Ok(clients)
}

/// Creates `ROOT/plugins_registry` (mode 0750) and follows it for CSI
/// drivers that register through the kubelet's plugin registration API,
/// until `stop`. Registration problems show in status (`errors`, by
/// socket); if the watcher itself stops, that shows under the directory,
/// and drivers registered otherwise (`register_fixed`) keep working. Call
/// from within the tokio runtime.
pub fn watch_plugins_registry(
    vm: &Arc<VolumeManager>,
    registry: &Arc<DriverRegistry>,
    stop: watch::Receiver<bool>,
) -> Result<tokio::task::JoinHandle<()>, Error> {
    let rel = RelPath::new([PLUGINS_REGISTRY_DIR])?;
    let dir = vm.root().mkdir_all(&rel, 0o750)?.path().to_path_buf();
    let weak = Arc::downgrade(vm);
    let sink: ProblemSink = Arc::new(move |socket, problem| {
        if let Some(vm) = weak.upgrade() {
            vm.set_source_problems(
                &socket.display().to_string(),
                problem.into_iter().collect(),
                vec![],
            );
        }
    });
    let watcher = PluginWatcher::new(dir.clone(), Arc::clone(registry), WatcherConfig::default())
        .with_problem_sink(sink);
    let weak = Arc::downgrade(vm);
    Ok(tokio::spawn(async move {
        if let Err(e) = watcher.run(stop).await {
            tracing::error!(error = %e, "plugin watcher stopped");
            if let Some(vm) = weak.upgrade() {
                vm.set_source_problems(&dir.display().to_string(), vec![e.to_string()], vec![]);
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugins::csi::{handle_hash, STAGED_FILE, VOL_DATA_FILE};
    use std::path::Path;

    /// 3 GiB, sparse.
    const HUGE: u64 = 3 << 30;

    const VOL_DATA: &str = r#"{"driverName":"drv","volumeHandle":"HANDLE","specVolID":"pv"}"#;

    /// A FIFO or a sparse file of [`HUGE`] bytes at `path` (its directory created).
    fn plant(path: &Path, fifo: bool) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        if fifo {
            nix::unistd::mkfifo(path, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        } else {
            std::fs::File::create(path).unwrap().set_len(HUGE).unwrap();
        }
    }

    /// Keeps opening every FIFO for writing for a while (releasing a
    /// reader stuck in `open`, which then reads end of file), so that a
    /// regression fails instead of hanging.
    fn release_fifos(fifos: &[std::path::PathBuf]) {
        use std::os::unix::fs::OpenOptionsExt;
        for _ in 0..1000 {
            for f in fifos {
                let _ = std::fs::OpenOptions::new()
                    .write(true)
                    .custom_flags(libc::O_NONBLOCK)
                    .open(f);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn fifos_and_huge_state_files_do_not_stall_reconstruction() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        let csi = r.join("plugins/kubernetes.io/csi/drv");
        let pod_vol = |uid: &str| r.join(format!("pods/{uid}/volumes/kubernetes.io~csi/pv"));
        let stage = |h: &str| csi.join(handle_hash(h));
        let mut fifos = Vec::new();
        // vol_data.json of a pod volume: a FIFO, then a sparse 3 GiB file.
        plant(&pod_vol("uid-fifo").join(VOL_DATA_FILE), true);
        fifos.push(pod_vol("uid-fifo").join(VOL_DATA_FILE));
        plant(&pod_vol("uid-huge").join(VOL_DATA_FILE), false);
        // A stage's vol_data.json, and a stage's staged record.
        plant(&stage("h1").join(VOL_DATA_FILE), true);
        fifos.push(stage("h1").join(VOL_DATA_FILE));
        for (h, fifo) in [("h2", true), ("h3", false)] {
            std::fs::create_dir_all(stage(h)).unwrap();
            std::fs::write(stage(h).join(VOL_DATA_FILE), VOL_DATA.replace("HANDLE", h)).unwrap();
            plant(&stage(h).join(STAGED_FILE), fifo);
            if fifo {
                fifos.push(stage(h).join(STAGED_FILE));
            }
        }
        let vm = VolumeManager::new(
            crate::volumemanager::Config::new(r),
            Arc::new(crate::sys::fake::FakeMounter::default()),
        )
        .unwrap();
        install(&vm, DriverRegistry::new(), Duration::from_secs(1)).unwrap();
        let report = match tokio::time::timeout(Duration::from_secs(30), vm.start()).await {
            Ok(r) => r.unwrap(),
            Err(_) => {
                release_fifos(&fifos);
                panic!("reconstruction blocked on a state file");
            }
        };
        let errors = report.errors.join("\n");
        for (what, needle) in [
            ("pod FIFO", "uid-fifo volume pv"),
            ("pod huge", "uid-huge volume pv"),
            ("stage FIFO", &format!("{} ignored", stage("h1").display())),
            ("staged FIFO", "drv^h2 is uncertain"),
            ("staged huge", "drv^h3 is uncertain"),
        ] {
            let line = report
                .errors
                .iter()
                .find(|e| e.contains(needle))
                .unwrap_or_else(|| panic!("{what}: no error naming {needle:?} in\n{errors}"));
            assert!(
                line.contains("not a regular file") || line.contains("larger than 1048576 bytes"),
                "{what}: {line}"
            );
        }
        // Both stages with a good vol_data.json are found, uncertain.
        assert_eq!(report.devices, 2, "{errors}");
        let status = vm.status();
        let shown: Vec<&str> = status
            .errors
            .iter()
            .filter(|e| e.source == crate::volumemanager::RECONSTRUCTION_SOURCE)
            .map(|e| e.error.as_str())
            .collect();
        assert_eq!(shown.len(), report.errors.len(), "{shown:?}");
        assert!(shown.iter().any(|e| e.contains("uid-fifo")), "{shown:?}");
        vm.stop().await.unwrap();
    }
}
