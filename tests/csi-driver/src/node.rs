//! The Node service's work: a sparse image file per volume, a loop device,
//! ext4, mounts. Everything is found again from the system (image files,
//! `/sys/block/loop*/loop/backing_file`, `/proc/self/mountinfo`), so a
//! restarted driver picks up where it left off and every call is idempotent.

use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};
use tonic::Status;

use crate::driver::Driver;
use crate::loopdev::{self, LoopDevice};
use crate::mounts;
use crate::proto::csi;
use csi::volume_capability::access_mode::Mode;
use csi::volume_capability::AccessType;

/// Image size when the volume context has no "size".
pub const DEFAULT_SIZE: u64 = 64 << 20;

/// The smallest image mkfs.ext4 handles comfortably.
const MIN_SIZE: u64 = 4 << 20;

/// mkfs.xfs refuses file systems smaller than this.
const MIN_XFS_SIZE: u64 = 300 << 20;

fn internal(what: &str, e: impl std::fmt::Display) -> Status {
    Status::internal(format!("{what}: {e}"))
}

fn required<'a>(field: &str, value: &'a str) -> Result<&'a str, Status> {
    if value.is_empty() {
        return Err(Status::invalid_argument(format!("{field} is required")));
    }
    Ok(value)
}

fn required_path(field: &str, value: &str) -> Result<PathBuf, Status> {
    let p = PathBuf::from(required(field, value)?);
    if !p.is_absolute() {
        return Err(Status::invalid_argument(format!(
            "{field} must be absolute"
        )));
    }
    Ok(p)
}

/// A Kubernetes-style quantity ("64Mi", "1G", "1048576") in bytes.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().ok()?;
    let mult: u64 = match unit {
        "" => 1,
        "k" | "K" => 1000,
        "M" => 1000u64.pow(2),
        "G" => 1000u64.pow(3),
        "T" => 1000u64.pow(4),
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        _ => return None,
    };
    n.checked_mul(mult)
}

/// The image file name for a volume ID: the ID itself when it is a safe file
/// name, else "h-" + hex SHA-256 of it.
pub fn image_name(volume_id: &str) -> String {
    let safe = !volume_id.starts_with('.')
        && volume_id.len() <= 128
        && volume_id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if safe {
        format!("{volume_id}.img")
    } else {
        let digest = Sha256::digest(volume_id.as_bytes());
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        format!("h-{hex}.img")
    }
}

/// Access type requested by a capability.
enum Access {
    Block,
    Mount {
        fs_type: String,
        flags: Vec<String>,
        /// `volume_mount_group`: the group to give the file system's root.
        group: Option<u32>,
    },
}

/// `single_node_multi_writer`: whether this driver advertises the
/// capability; without it, the two access modes it introduces are refused,
/// as a driver built before them does. Likewise `volume_mount_group`, for
/// a capability's group.
fn access(
    cap: Option<&csi::VolumeCapability>,
    single_node_multi_writer: bool,
    volume_mount_group: bool,
) -> Result<(Access, bool), Status> {
    let cap = cap.ok_or_else(|| Status::invalid_argument("volume_capability is required"))?;
    let mode = cap.access_mode.as_ref().map(|m| m.mode());
    if let Some(m @ (Mode::SingleNodeSingleWriter | Mode::SingleNodeMultiWriter)) = mode {
        if !single_node_multi_writer {
            return Err(Status::invalid_argument(format!(
                "access mode {} needs the SINGLE_NODE_MULTI_WRITER node capability, which this driver does not advertise",
                m.as_str_name()
            )));
        }
    }
    let reader_only = matches!(
        cap.access_mode.as_ref().map(|m| m.mode()),
        Some(Mode::SingleNodeReaderOnly | Mode::MultiNodeReaderOnly)
    );
    let access = match &cap.access_type {
        Some(AccessType::Block(_)) => Access::Block,
        Some(AccessType::Mount(m)) => {
            let fs_type = if m.fs_type.is_empty() {
                "ext4".to_string()
            } else {
                m.fs_type.clone()
            };
            if !matches!(fs_type.as_str(), "ext2" | "ext3" | "ext4" | "xfs") {
                return Err(Status::invalid_argument(format!(
                    "unsupported fs_type {fs_type:?} (ext2, ext3, ext4, xfs)"
                )));
            }
            let group = match (m.volume_mount_group.as_str(), volume_mount_group) {
                ("", _) => None,
                (g, true) => Some(g.parse::<u32>().map_err(|_| {
                    Status::invalid_argument(format!("volume_mount_group {g:?} is not a GID"))
                })?),
                (_, false) => {
                    return Err(Status::invalid_argument(
                        "volume_mount_group needs the VOLUME_MOUNT_GROUP node capability, which this driver does not advertise",
                    ))
                }
            };
            Access::Mount {
                fs_type,
                flags: m.mount_flags.clone(),
                group,
            }
        }
        None => {
            return Err(Status::invalid_argument(
                "volume_capability.access_type (block or mount) is required",
            ))
        }
    };
    Ok((access, reader_only))
}

fn mount_error(what: &str, e: nix::Error) -> Status {
    if e == nix::Error::EINVAL {
        Status::invalid_argument(format!("{what}: {e} (bad mount option?)"))
    } else {
        internal(what, e)
    }
}

/// The file system type on a device ("" when there is none).
fn fs_type_of(dev: &Path) -> Result<String, Status> {
    let out = tool("blkid")
        .args(["-p", "-o", "value", "-s", "TYPE"])
        .arg(dev)
        .output()
        .map_err(|e| internal("running blkid", e))?;
    match out.status.code() {
        Some(0) => Ok(String::from_utf8_lossy(&out.stdout).trim().to_string()),
        // 2: nothing found.
        Some(2) => Ok(String::new()),
        _ => Err(internal(
            "blkid",
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        )),
    }
}

/// A system tool: from PATH, else /usr/sbin or /sbin (root's tools are
/// there and a non-login PATH may miss them).
fn tool(name: &str) -> Command {
    let in_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
        .unwrap_or(false);
    if !in_path {
        for dir in ["/usr/sbin", "/sbin"] {
            let p = Path::new(dir).join(name);
            if p.is_file() {
                return Command::new(p);
            }
        }
    }
    Command::new(name)
}

/// The first lines of a tool's error output (not its whole usage text).
fn first_lines(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let lines: Vec<&str> = text.trim().lines().take(3).collect();
    lines.join(" / ")
}

fn run(cmd: &mut Command, what: &str) -> Result<(), Status> {
    let out = cmd.output().map_err(|e| internal(what, e))?;
    if !out.status.success() {
        return Err(internal(
            what,
            format!("{}: {}", out.status, first_lines(&out.stderr)),
        ));
    }
    Ok(())
}

fn same_device(entry: &mounts::MountEntry, dev: LoopDevice) -> Result<bool, Status> {
    let rdev = dev.rdev().map_err(|e| internal("stat loop device", e))?;
    Ok(entry.dev == mounts::split_dev(rdev))
}

/// The file at the staging path a block volume's device is bound onto when
/// publishing unchecked (ceph-csi's rbd puts it there at stage).
const STAGED_DEVICE_FILE: &str = "dev";

/// Block stage for unchecked publishing: binds the loop device node onto
/// `staging/dev` (a file made for it), unless it already is.
fn stage_device_file(staging: &Path, dev: LoopDevice) -> Result<(), Status> {
    std::fs::create_dir_all(staging).map_err(|e| internal("creating the staging path", e))?;
    let file = staging.join(STAGED_DEVICE_FILE);
    if let Some(m) = mounts::mount_at(&file).map_err(|e| internal("mountinfo", e))? {
        let rdev = dev.rdev().map_err(|e| internal("stat loop device", e))?;
        let meta = std::fs::metadata(&file).map_err(|e| internal("stat staged device", e))?;
        if meta.file_type().is_block_device() && meta.rdev() == rdev {
            return Ok(());
        }
        return Err(Status::already_exists(format!(
            "{} already has another mount ({})",
            file.display(),
            m.fs_type
        )));
    }
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&file)
        .map_err(|e| internal("creating the staged device file", e))?;
    mounts::bind(&dev.path(), &file, false, nix::mount::MsFlags::empty())
        .map_err(|e| mount_error("bind-mounting the device at the staging path", e))
}

/// Unstage: the device file [`stage_device_file`] made, unmounted and
/// removed. Nothing there is fine; a file that is not an empty one (a
/// volume's own file, with its file system still mounted) is left alone.
fn unstage_device_file(staging: &Path) -> Result<(), Status> {
    let file = staging.join(STAGED_DEVICE_FILE);
    let mounted = mounts::mount_at(&file).map_err(|e| internal("mountinfo", e))?;
    let device = std::fs::metadata(&file).is_ok_and(|m| m.file_type().is_block_device());
    match (mounted, device) {
        (Some(_), true) => {
            mounts::unmount(&file).map_err(|e| internal("unmounting the staged device", e))?
        }
        (Some(_), false) => return Ok(()),
        (None, _) => {}
    }
    match std::fs::symlink_metadata(&file) {
        Ok(m) if m.file_type().is_file() && m.len() == 0 => {}
        _ => return Ok(()),
    }
    match std::fs::remove_file(&file) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(internal("removing the staged device file", e)),
    }
}

/// NodePublishVolume without a check that the volume is staged (EBS-style):
/// binds the staging path (block: the device file stage put there) onto
/// the target, whatever it holds. A target already mounted is done.
fn publish_unchecked(
    staging: &Path,
    target: &Path,
    access: &Access,
    read_only: bool,
) -> Result<(), Status> {
    let source = match access {
        Access::Mount { .. } => {
            match std::fs::create_dir(target) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(internal("creating the target path", e)),
            }
            staging.to_path_buf()
        }
        Access::Block => {
            OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .open(target)
                .map_err(|e| internal("creating the target file", e))?;
            staging.join(STAGED_DEVICE_FILE)
        }
    };
    if mounts::mount_at(target)
        .map_err(|e| internal("mountinfo", e))?
        .is_some()
    {
        return Ok(());
    }
    let flags = match access {
        Access::Mount { flags, .. } => mounts::parse_mount_flags(flags).0,
        Access::Block => nix::mount::MsFlags::empty(),
    };
    mounts::bind(&source, target, read_only, flags)
        .map_err(|e| mount_error("bind-mounting the staging path", e))
}

/// NodePublishVolume of an inline ephemeral volume: a tmpfs of the
/// volume attribute `size` (a quantity; default 16Mi)
/// mounted at `target` (made if missing), once.
fn publish_ephemeral(
    target: &Path,
    context: &std::collections::HashMap<String, String>,
) -> Result<(), Status> {
    let size = context.get("size").map_or("16Mi", String::as_str);
    let bytes = parse_size(size).ok_or_else(|| {
        Status::invalid_argument(format!("volume_context size {size:?} is not a quantity"))
    })?;
    match std::fs::create_dir(target) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(internal("creating the target path", e)),
    }
    if mounts::mount_at(target)
        .map_err(|e| internal("mountinfo", e))?
        .is_some()
    {
        return Ok(());
    }
    let data = format!("size={bytes}");
    nix::mount::mount(
        Some("tmpfs"),
        target,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some(data.as_str()),
    )
    .map_err(|e| mount_error("mounting the ephemeral tmpfs", e))
}

impl Driver {
    fn images_dir(&self) -> PathBuf {
        self.state_dir.join("images")
    }

    /// The image file of a volume.
    pub fn image_path(&self, volume_id: &str) -> PathBuf {
        self.images_dir().join(image_name(volume_id))
    }

    fn loop_of(&self, image: &Path) -> Result<Option<LoopDevice>, Status> {
        loopdev::find(image).map_err(|e| internal("reading loop devices", e))
    }

    /// NodeStageVolume.
    pub fn stage(&self, req: csi::NodeStageVolumeRequest) -> Result<(), Status> {
        let id = required("volume_id", &req.volume_id)?;
        let staging = required_path("staging_target_path", &req.staging_target_path)?;
        let (access, _) = access(
            req.volume_capability.as_ref(),
            self.single_node_multi_writer,
            self.volume_mount_group,
        )?;
        let size = match req.volume_context.get("size") {
            Some(s) => parse_size(s).ok_or_else(|| {
                Status::invalid_argument(format!("volume_context size {s:?} is not a quantity"))
            })?,
            None => DEFAULT_SIZE,
        };
        if size < MIN_SIZE {
            return Err(Status::out_of_range(format!(
                "size {size} is below the minimum {MIN_SIZE}"
            )));
        }
        let image = self.image_path(id);
        if let Access::Mount { fs_type, .. } = &access {
            // The image's size once it exists.
            let size = std::fs::metadata(&image)
                .map(|m| m.len())
                .ok()
                .filter(|&l| l > 0)
                .unwrap_or(size);
            if fs_type == "xfs" && size < MIN_XFS_SIZE {
                return Err(Status::out_of_range(format!(
                    "xfs needs at least {MIN_XFS_SIZE} bytes, the volume has {size}"
                )));
            }
        }
        std::fs::create_dir_all(self.images_dir()).map_err(|e| internal("mkdir images", e))?;
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&image)
        {
            // Sparse: set_len allocates nothing.
            Ok(f) => f
                .set_len(size)
                .map_err(|e| internal("sizing the image", e))?,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                // A previous stage that died between creating and sizing it.
                let len = std::fs::metadata(&image)
                    .map_err(|e| internal("stat image", e))?
                    .len();
                if len == 0 {
                    std::fs::OpenOptions::new()
                        .write(true)
                        .open(&image)
                        .and_then(|f| f.set_len(size))
                        .map_err(|e| internal("sizing the image", e))?;
                }
            }
            Err(e) => return Err(internal("creating the image", e)),
        }
        let (dev, attached_now) = match self.loop_of(&image)? {
            Some(d) => (d, false),
            None => (
                loopdev::attach(&image).map_err(|e| internal("attaching a loop device", e))?,
                true,
            ),
        };
        let result = self.stage_on(id, &staging, dev, &access);
        if result.is_err() && attached_now {
            if let Err(e) = dev.detach() {
                tracing::warn!(volume_id = id, "detaching after a failed stage: {e}");
            }
        }
        result
    }

    fn stage_on(
        &self,
        id: &str,
        staging: &Path,
        dev: LoopDevice,
        access: &Access,
    ) -> Result<(), Status> {
        let Access::Mount {
            fs_type,
            flags,
            group,
        } = access
        else {
            // Block: staged means attached (and, publishing unchecked,
            // the device bound at the staging path).
            if self.publish_without_stage_check {
                return stage_device_file(staging, dev);
            }
            return Ok(());
        };
        std::fs::create_dir_all(staging).map_err(|e| internal("creating the staging path", e))?;
        if let Some(m) = mounts::mount_at(staging).map_err(|e| internal("mountinfo", e))? {
            if same_device(&m, dev)? {
                return Ok(());
            }
            return Err(Status::already_exists(format!(
                "{} already has another mount ({})",
                staging.display(),
                m.fs_type
            )));
        }
        let found = fs_type_of(&dev.path())?;
        if found.is_empty() {
            tracing::info!(volume_id = id, device = %dev.path().display(), "mkfs.{fs_type}");
            // Force (it is a whole device, not a partition); no discard (a
            // fresh sparse image has nothing to discard).
            let args: &[&str] = if fs_type == "xfs" {
                &["-q", "-f", "-K"]
            } else {
                &["-q", "-F", "-E", "nodiscard"]
            };
            run(
                tool(&format!("mkfs.{fs_type}")).args(args).arg(dev.path()),
                "mkfs",
            )?;
        } else if found != *fs_type {
            return Err(Status::invalid_argument(format!(
                "volume {id} has a {found} file system, the capability asks for {fs_type}"
            )));
        }
        let (ms, data) = mounts::parse_mount_flags(flags);
        mounts::mount_device(&dev.path(), staging, fs_type, ms, &data)
            .map_err(|e| mount_error("mounting the volume", e))?;
        if let Some(gid) = group {
            // What drivers with VOLUME_MOUNT_GROUP do for a block file
            // system: the root group-owned, group-writable, setgid.
            use std::os::unix::fs::PermissionsExt;
            std::os::unix::fs::chown(staging, None, Some(*gid))
                .map_err(|e| internal("giving the volume its group", e))?;
            std::fs::set_permissions(staging, std::fs::Permissions::from_mode(0o2775))
                .map_err(|e| internal("making the volume group-writable", e))?;
        }
        Ok(())
    }

    /// NodeUnstageVolume.
    pub fn unstage(&self, req: csi::NodeUnstageVolumeRequest) -> Result<(), Status> {
        let id = required("volume_id", &req.volume_id)?;
        let staging = required_path("staging_target_path", &req.staging_target_path)?;
        let dev = self.loop_of(&self.image_path(id))?;
        if let (Some(dev), Some(m)) = (
            dev,
            mounts::mount_at(&staging).map_err(|e| internal("mountinfo", e))?,
        ) {
            if same_device(&m, dev)? {
                mounts::unmount(&staging)
                    .map_err(|e| internal("unmounting the staging path", e))?;
            }
        }
        unstage_device_file(&staging)?;
        if let Some(dev) = dev {
            dev.detach()
                .map_err(|e| internal("detaching the loop device", e))?;
        }
        Ok(())
    }

    /// NodePublishVolume.
    pub fn publish(&self, req: csi::NodePublishVolumeRequest) -> Result<(), Status> {
        let id = required("volume_id", &req.volume_id)?;
        let target = required_path("target_path", &req.target_path)?;
        // The spec's answer when STAGE_UNSTAGE_VOLUME is advertised and the
        // staging path is missing: FAILED_PRECONDITION (stage first).
        if req.staging_target_path.is_empty() && self.ephemeral {
            return publish_ephemeral(&target, &req.volume_context);
        }
        if req.staging_target_path.is_empty() {
            return Err(Status::failed_precondition(
                "staging_target_path is required: this driver stages volumes (STAGE_UNSTAGE_VOLUME)",
            ));
        }
        let staging = required_path("staging_target_path", &req.staging_target_path)?;
        let (access, reader_only) = access(
            req.volume_capability.as_ref(),
            self.single_node_multi_writer,
            self.volume_mount_group,
        )?;
        let read_only = req.readonly || reader_only;
        if self.publish_without_stage_check {
            return publish_unchecked(&staging, &target, &access, read_only);
        }
        let not_staged = || {
            Status::failed_precondition(format!(
                "volume {id} is not staged at {}",
                staging.display()
            ))
        };
        let dev = self.loop_of(&self.image_path(id))?.ok_or_else(not_staged)?;
        match access {
            Access::Mount { flags, .. } => {
                let staged = mounts::mount_at(&staging).map_err(|e| internal("mountinfo", e))?;
                match staged {
                    Some(m) if same_device(&m, dev)? => {}
                    _ => return Err(not_staged()),
                }
                match std::fs::create_dir(&target) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(internal("creating the target path", e)),
                }
                if let Some(m) = mounts::mount_at(&target).map_err(|e| internal("mountinfo", e))? {
                    if same_device(&m, dev)? && m.read_only() == read_only {
                        return Ok(());
                    }
                    return Err(Status::already_exists(format!(
                        "{} is already mounted with something else or another read-only mode",
                        target.display()
                    )));
                }
                let (ms, _) = mounts::parse_mount_flags(&flags);
                mounts::bind(&staging, &target, read_only, ms)
                    .map_err(|e| mount_error("bind-mounting the volume", e))
            }
            Access::Block => {
                let rdev = dev.rdev().map_err(|e| internal("stat loop device", e))?;
                match OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&target)
                {
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                        let meta =
                            std::fs::metadata(&target).map_err(|e| internal("stat target", e))?;
                        if meta.file_type().is_block_device() {
                            if meta.rdev() == rdev {
                                return Ok(());
                            }
                            return Err(Status::already_exists(format!(
                                "{} is already another device",
                                target.display()
                            )));
                        }
                        if meta.is_dir() {
                            return Err(Status::invalid_argument(format!(
                                "{} is a directory; a block volume is published on a file",
                                target.display()
                            )));
                        }
                    }
                    Err(e) => return Err(internal("creating the target file", e)),
                }
                mounts::bind(
                    &dev.path(),
                    &target,
                    read_only,
                    nix::mount::MsFlags::empty(),
                )
                .map_err(|e| mount_error("bind-mounting the device", e))
            }
        }
    }

    /// NodeUnpublishVolume: unmounts and removes the target.
    pub fn unpublish(&self, req: csi::NodeUnpublishVolumeRequest) -> Result<(), Status> {
        required("volume_id", &req.volume_id)?;
        let target = required_path("target_path", &req.target_path)?;
        // Stacked mounts (a repeated publish by a confused caller) all go.
        for _ in 0..16 {
            if mounts::mount_at(&target)
                .map_err(|e| internal("mountinfo", e))?
                .is_none()
            {
                break;
            }
            mounts::unmount(&target).map_err(|e| internal("unmounting the target", e))?;
        }
        let meta = match std::fs::symlink_metadata(&target) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(internal("stat target", e)),
        };
        let res = if meta.is_dir() {
            std::fs::remove_dir(&target)
        } else {
            std::fs::remove_file(&target)
        };
        match res {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(internal("removing the target", e)),
        }
    }

    /// Finds the staged loop device of a volume whose `path` is a staging or
    /// publish path of it. NOT_FOUND otherwise.
    fn volume_at(&self, id: &str, path: &Path) -> Result<(LoopDevice, bool), Status> {
        let not_found =
            |why: &str| Status::not_found(format!("volume {id} at {}: {why}", path.display()));
        let meta = match std::fs::metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(not_found("no such path")),
            Err(e) => return Err(internal("stat volume path", e)),
        };
        let image = self.image_path(id);
        if !image.exists() {
            return Err(not_found("no such volume"));
        }
        let dev = self
            .loop_of(&image)?
            .ok_or_else(|| not_found("not staged"))?;
        let rdev = dev.rdev().map_err(|e| internal("stat loop device", e))?;
        if meta.file_type().is_block_device() {
            if meta.rdev() == rdev {
                return Ok((dev, true));
            }
            return Err(not_found("another device"));
        }
        match mounts::mount_at(path).map_err(|e| internal("mountinfo", e))? {
            Some(m) if m.dev == mounts::split_dev(rdev) => Ok((dev, false)),
            _ => Err(not_found("not mounted there")),
        }
    }

    /// Grows the mounted file system on `dev` (mounted at `mount_point`) to
    /// the device's size, online.
    fn grow_fs(&self, dev: LoopDevice, mount_point: &Path) -> Result<(), Status> {
        let fs = fs_type_of(&dev.path())?;
        if fs == "xfs" {
            return run(tool("xfs_growfs").arg("-d").arg(mount_point), "xfs_growfs");
        }
        let out = tool("resize2fs")
            .arg(dev.path())
            .output()
            .map_err(|e| internal("running resize2fs", e))?;
        if out.status.success() {
            return Ok(());
        }
        let stderr = first_lines(&out.stderr);
        if stderr.contains("Permission denied") {
            // EXT4_IOC_RESIZE_FS needs CAP_SYS_RESOURCE in the initial user
            // namespace; some containers drop it. The spec's "volume in use"
            // case: the file system cannot grow while published; the caller
            // must not retry.
            return Err(Status::failed_precondition(format!(
                "online {fs} resize refused by the kernel: it needs CAP_SYS_RESOURCE, \
                 which this process lacks ({stderr})"
            )));
        }
        Err(internal("resize2fs", format!("{}: {stderr}", out.status)))
    }

    /// NodeGetVolumeStats.
    pub fn stats(
        &self,
        req: csi::NodeGetVolumeStatsRequest,
    ) -> Result<csi::NodeGetVolumeStatsResponse, Status> {
        let id = required("volume_id", &req.volume_id)?;
        let path = required_path("volume_path", &req.volume_path)?;
        let (dev, block) = self.volume_at(id, &path)?;
        let condition = crate::conditions::condition_of(&self.state_dir, id)?;
        let unit = |u: csi::volume_usage::Unit| u as i32;
        if block {
            let total = dev.size_bytes().map_err(|e| internal("device size", e))?;
            return Ok(csi::NodeGetVolumeStatsResponse {
                usage: vec![csi::VolumeUsage {
                    total: total as i64,
                    unit: unit(csi::volume_usage::Unit::Bytes),
                    ..Default::default()
                }],
                volume_condition: Some(condition),
            });
        }
        let st = nix::sys::statvfs::statvfs(&path).map_err(|e| internal("statvfs", e))?;
        let frsize = st.fragment_size() as i64;
        let blocks = st.blocks() as i64;
        let files = st.files() as i64;
        Ok(csi::NodeGetVolumeStatsResponse {
            usage: vec![
                csi::VolumeUsage {
                    total: blocks * frsize,
                    available: st.blocks_available() as i64 * frsize,
                    used: (blocks - st.blocks_free() as i64) * frsize,
                    unit: unit(csi::volume_usage::Unit::Bytes),
                },
                csi::VolumeUsage {
                    total: files,
                    available: st.files_available() as i64,
                    used: files - st.files_free() as i64,
                    unit: unit(csi::volume_usage::Unit::Inodes),
                },
            ],
            volume_condition: Some(condition),
        })
    }

    /// NodeExpandVolume: grows the image, the loop device and (filesystem
    /// volumes) the file system, online.
    pub fn expand(
        &self,
        req: csi::NodeExpandVolumeRequest,
    ) -> Result<csi::NodeExpandVolumeResponse, Status> {
        let id = required("volume_id", &req.volume_id)?;
        let path = required_path("volume_path", &req.volume_path)?;
        let (dev, block_path) = self.volume_at(id, &path)?;
        let block = match req
            .volume_capability
            .as_ref()
            .and_then(|c| c.access_type.as_ref())
        {
            Some(AccessType::Block(_)) => true,
            Some(AccessType::Mount(_)) => false,
            None => block_path,
        };
        let range = req.capacity_range.unwrap_or_default();
        let image = self.image_path(id);
        let file = OpenOptions::new()
            .write(true)
            .open(&image)
            .map_err(|e| internal("opening the image", e))?;
        let current = file
            .metadata()
            .map_err(|e| internal("stat image", e))?
            .len();
        let required_bytes = u64::try_from(range.required_bytes).unwrap_or(0);
        // Whole MiB, as a real disk would round.
        let wanted = required_bytes.div_ceil(1 << 20) * (1 << 20);
        if range.limit_bytes > 0 && wanted > range.limit_bytes as u64 {
            return Err(Status::out_of_range(format!(
                "{wanted} bytes (required rounded up to MiB) exceeds limit_bytes {}",
                range.limit_bytes
            )));
        }
        if wanted > current {
            file.set_len(wanted)
                .map_err(|e| internal("growing the image", e))?;
        }
        if dev.size_bytes().map_err(|e| internal("device size", e))? < wanted.max(current) {
            dev.refresh_capacity()
                .map_err(|e| internal("LOOP_SET_CAPACITY", e))?;
        }
        if !block {
            self.grow_fs(dev, &path)?;
        }
        let capacity = dev.size_bytes().map_err(|e| internal("device size", e))?;
        Ok(csi::NodeExpandVolumeResponse {
            capacity_bytes: capacity as i64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_quantities() {
        assert_eq!(parse_size("64Mi"), Some(64 << 20));
        assert_eq!(parse_size("1Gi"), Some(1 << 30));
        assert_eq!(parse_size("100M"), Some(100_000_000));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("12k"), Some(12_000));
        for bad in ["", "Mi", "1.5Gi", "-1", "1Xi", "99999999999999999999Ti"] {
            assert_eq!(parse_size(bad), None, "{bad}");
        }
    }

    #[test]
    fn image_names_are_safe_file_names() {
        assert_eq!(image_name("vol-1_a.b"), "vol-1_a.b.img");
        for id in ["../x", "a/b", ".hidden", "x y", &"v".repeat(200)] {
            let n = image_name(id);
            assert!(n.starts_with("h-") && n.len() == 2 + 64 + 4, "{id}: {n}");
        }
        assert_ne!(image_name("a/b"), image_name("a_b"));
    }
}
