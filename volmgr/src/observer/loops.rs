//! Loop devices and their backing files, from sysfs
//! (`/sys/block/loop*/loop/backing_file`, `/sys/block/loop*/dev`).

use std::path::Path;

/// Where the block devices are listed.
pub(super) const SYS_BLOCK: &str = "/sys/block";

/// What the kernel appends to the backing file's path once it is deleted.
const DELETED: &str = " (deleted)";

/// An attached loop device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoopDevice {
    /// `loopN`.
    pub name: String,
    /// The backing file as the kernel shows it.
    pub backing_file: String,
    /// Whether the backing file is deleted.
    pub deleted: bool,
    /// Device number, major.
    pub major: u32,
    /// Device number, minor.
    pub minor: u32,
}

/// The attached loop devices listed under `sys_block` (unattached ones have
/// no `loop/backing_file`).
pub fn loop_devices(sys_block: &Path) -> Vec<LoopDevice> {
    let Ok(rd) = std::fs::read_dir(sys_block) else {
        return Vec::new();
    };
    let mut out: Vec<LoopDevice> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_string();
            if !name.starts_with("loop") {
                return None;
            }
            let dir = e.path();
            let backing = std::fs::read_to_string(dir.join("loop/backing_file")).ok()?;
            let dev = std::fs::read_to_string(dir.join("dev")).ok()?;
            parse(&name, &backing, &dev)
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// A device from its sysfs `backing_file` and `dev` (`MAJOR:MINOR`).
fn parse(name: &str, backing: &str, dev: &str) -> Option<LoopDevice> {
    let backing = backing.trim_end_matches('\n');
    let (major, minor) = dev.trim().split_once(':')?;
    Some(LoopDevice {
        name: name.to_string(),
        backing_file: backing.to_string(),
        deleted: backing.ends_with(DELETED),
        major: major.parse().ok()?,
        minor: minor.parse().ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deleted_backing_file_is_seen() {
        let d = parse("loop3", "/tmp/img (deleted)\n", "7:3\n").unwrap();
        assert!(d.deleted);
        assert_eq!((d.major, d.minor), (7, 3));
        let d = parse("loop4", "/tmp/img\n", "7:4\n").unwrap();
        assert!(!d.deleted);
        assert!(parse("loop5", "/x", "bad").is_none());
    }
}
