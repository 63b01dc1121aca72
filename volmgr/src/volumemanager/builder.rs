//! One way to put a manager together, used by `volmgr agent` and the C ABI
//! alike: the manager on the real mounter, the kubelet's CSI plugin with
//! its driver registry, then the tracer and the plugin registration
//! watcher. Both callers get the same defaults ([`Config::new`],
//! [`CsiSetup::default`], [`TracerMode::Auto`]); they differ only in what
//! they are told (the C ABI turns `make_root_shared` off unless asked: a
//! kubelet fork's kubelet makes ROOT rshared itself).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::{csi_wiring, Config, Error, VolumeManager};
use crate::pluginmanager::registry::DriverRegistry;
use crate::sys::linux::LinuxMounter;
use crate::sys::Mounter;
use crate::tracer::{self, ActiveTracer, TracerError, TracerMode};

/// The kubelet's `csiTimeout`: the deadline of each CSI call.
pub const DEFAULT_CSI_TIMEOUT: Duration = Duration::from_secs(120);

/// How the kubelet's CSI plugin is installed.
#[derive(Debug, Clone)]
pub struct CsiSetup {
    /// Deadline of each CSI call (positive).
    pub timeout: Duration,
    /// Drivers by name and CSI socket path (absolute), called without the
    /// plugin registration handshake.
    pub drivers: Vec<(String, PathBuf)>,
    /// Follow `ROOT/plugins_registry` for drivers that register through
    /// node-driver-registrar (the kubelet's plugin watcher always runs).
    pub watch_plugins_registry: bool,
}

impl Default for CsiSetup {
    /// The kubelet's: 2 minutes per call, no fixed driver, the registry
    /// watched.
    fn default() -> Self {
        Self {
            timeout: DEFAULT_CSI_TIMEOUT,
            drivers: Vec::new(),
            watch_plugins_registry: true,
        }
    }
}

/// Why a manager could not be put together.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The manager itself (root directory, configuration, plugins).
    #[error(transparent)]
    Manager(#[from] Error),
    /// The tracer asked for could not start.
    #[error("tracer {mode}: {source}")]
    Tracer {
        /// The mode asked for.
        mode: TracerMode,
        /// Why.
        #[source]
        source: TracerError,
    },
}

/// Puts a [`VolumeManager`] together: [`build`](Self::build), then
/// [`Built::start_watchers`] before [`VolumeManager::start`].
pub struct VolumeManagerBuilder {
    config: Config,
    mounter: Arc<dyn Mounter>,
    tracer: TracerMode,
    host_thread: Option<String>,
    csi: Option<CsiSetup>,
}

/// A built manager, its CSI driver registry (empty and unused without
/// CSI), and what is left to start.
pub struct Built {
    /// The manager (not started).
    pub vm: Arc<VolumeManager>,
    /// The drivers the CSI plugin calls.
    pub csi_registry: Arc<DriverRegistry>,
    tracer: TracerMode,
    host_thread: Option<String>,
    watch_plugins_registry: bool,
}

/// The tasks [`Built::start_watchers`] started; they end on `stop`.
pub struct Watchers {
    /// The tracer.
    pub tracer: ActiveTracer,
    /// The plugin registration watcher, if CSI follows the registry.
    pub plugin_watcher: Option<tokio::task::JoinHandle<()>>,
}

impl Watchers {
    /// Waits for the tasks after `stop` was signalled.
    pub async fn join(self) {
        self.tracer.join().await;
        if let Some(t) = self.plugin_watcher {
            let _ = t.await;
        }
    }
}

impl VolumeManagerBuilder {
    /// A builder for `config` on the real mounter, with the `auto` tracer
    /// and no CSI plugin.
    pub fn new(config: Config) -> Self {
        Self {
            config,
            mounter: Arc::new(LinuxMounter),
            tracer: TracerMode::default(),
            host_thread: None,
            csi: None,
        }
    }

    /// Uses `mounter` instead of the real one.
    pub fn mounter(mut self, mounter: Arc<dyn Mounter>) -> Self {
        self.mounter = mounter;
        self
    }

    /// Which tracer finds changes made behind the manager's back.
    pub fn tracer(mut self, mode: TracerMode) -> Self {
        self.tracer = mode;
        self
    }

    /// The manager is linked into a host process (the C ABI) and runs on
    /// threads named `thread_name`: the tracer counts the host's other
    /// threads' mount calls as another process's.
    pub fn in_host(mut self, thread_name: &str) -> Self {
        self.host_thread = Some(thread_name.to_string());
        self
    }

    /// Installs the kubelet's CSI plugin.
    pub fn csi(mut self, csi: CsiSetup) -> Self {
        self.csi = Some(csi);
        self
    }

    /// Builds the manager (making ROOT rshared per
    /// [`Config::make_root_shared`]) and installs CSI with its fixed
    /// drivers. Call within the tokio runtime the manager will run on.
    pub fn build(self) -> Result<Built, BuildError> {
        if let Some(csi) = &self.csi {
            check_csi(csi)?;
        }
        let vm = VolumeManager::new(self.config, Arc::clone(&self.mounter))?;
        if self.host_thread.is_none() {
            // In a host process (the C ABI) NFS volumes are the host
            // plugins' to claim.
            vm.register_plugin(Arc::new(crate::plugins::nfs::NfsPlugin::new(
                Arc::clone(vm.root()),
                Arc::clone(&self.mounter),
                Arc::clone(vm.pool()),
            )))?;
        }
        let csi_registry = DriverRegistry::new();
        if let Some(setup) = &self.csi {
            csi_wiring::install(&vm, Arc::clone(&csi_registry), setup.timeout)?;
            for (name, socket) in &setup.drivers {
                csi_registry.register_fixed(name, socket.clone());
            }
        }
        Ok(Built {
            vm,
            csi_registry,
            tracer: self.tracer,
            host_thread: self.host_thread,
            watch_plugins_registry: self.csi.is_some_and(|c| c.watch_plugins_registry),
        })
    }
}

/// A CSI setting out of range is the configuration's fault.
fn check_csi(csi: &CsiSetup) -> Result<(), Error> {
    if csi.timeout.is_zero() {
        return Err(Error::InvalidConfig(
            "csi: the timeout must be positive".into(),
        ));
    }
    for (name, socket) in &csi.drivers {
        if name.is_empty() || !socket.is_absolute() {
            return Err(Error::InvalidConfig(format!(
                "csi: driver {name:?} needs a name and an absolute socket path"
            )));
        }
    }
    Ok(())
}

impl Built {
    /// Starts the tracer (before the manager starts, so nothing between
    /// reconstruction and the first event is missed) and, with CSI
    /// following the registry, the plugin registration watcher. Both run
    /// until `stop` turns true. Call within the manager's runtime.
    pub fn start_watchers(&self, stop: watch::Receiver<bool>) -> Result<Watchers, BuildError> {
        let ctx = self.vm.tracer_context();
        let tracer = match &self.host_thread {
            Some(name) => tracer::start_in_host(self.tracer, ctx, stop.clone(), name),
            None => tracer::start(self.tracer, ctx, stop.clone()),
        }
        .map_err(|source| BuildError::Tracer {
            mode: self.tracer,
            source,
        })?;
        let plugin_watcher = if self.watch_plugins_registry {
            Some(csi_wiring::watch_plugins_registry(
                &self.vm,
                &self.csi_registry,
                stop,
            )?)
        } else {
            None
        };
        Ok(Watchers {
            tracer,
            plugin_watcher,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::sys::fake::FakeMounter;

    fn builder(root: &std::path::Path) -> VolumeManagerBuilder {
        VolumeManagerBuilder::new(Config::new(root))
            .mounter(Arc::new(FakeMounter::default()))
            .tracer(TracerMode::Off)
    }

    /// The agent and the C ABI get the kubelet's defaults from the same
    /// place: ROOT made rshared (`setupDataDirs`), 2 minutes per CSI call,
    /// the plugin registry followed.
    #[tokio::test]
    async fn defaults_are_the_kubelets() {
        assert!(Config::new("/r").make_root_shared);
        let csi = CsiSetup::default();
        assert_eq!(csi.timeout, Duration::from_secs(120));
        assert!(csi.watch_plugins_registry);
        let root = tempfile::tempdir().unwrap();
        let built = builder(root.path()).build().unwrap();
        assert_eq!(built.vm.status().root_propagation, "rshared");
    }

    #[tokio::test]
    async fn csi_is_installed_with_its_fixed_drivers_and_the_registry_watched() {
        let root = tempfile::tempdir().unwrap();
        let built = builder(root.path())
            .csi(CsiSetup {
                drivers: vec![("d.example.com".into(), "/run/d.sock".into())],
                ..CsiSetup::default()
            })
            .build()
            .unwrap();
        assert_eq!(
            built.csi_registry.endpoint("d.example.com"),
            Some(PathBuf::from("/run/d.sock"))
        );
        let (stop_tx, stop) = watch::channel(false);
        let watchers = built.start_watchers(stop).unwrap();
        assert!(watchers.plugin_watcher.is_some());
        assert!(root.path().join("plugins_registry").is_dir());
        let _ = stop_tx.send(true);
        watchers.join().await;
    }

    #[tokio::test]
    async fn csi_settings_out_of_range_are_invalid_config() {
        let root = tempfile::tempdir().unwrap();
        for csi in [
            CsiSetup {
                timeout: Duration::ZERO,
                ..CsiSetup::default()
            },
            CsiSetup {
                drivers: vec![("d".into(), "relative.sock".into())],
                ..CsiSetup::default()
            },
        ] {
            let r = builder(root.path()).csi(csi).build();
            assert!(
                matches!(r, Err(BuildError::Manager(Error::InvalidConfig(_)))),
                "{:?}",
                r.err()
            );
        }
    }
}
