//! Loop devices through the kernel's ioctls (linux/loop.h): find a free one
//! with `LOOP_CTL_GET_FREE`, attach an image with `LOOP_CONFIGURE`, grow it
//! with `LOOP_SET_CAPACITY`, detach with `LOOP_CLR_FD`.
//!
//! Which device belongs to which image is read back from
//! `/sys/block/loopN/loop/backing_file`, so a restarted driver finds the
//! devices it attached before.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

const LOOP_CLR_FD: libc::c_ulong = 0x4C01;
const LOOP_SET_CAPACITY: libc::c_ulong = 0x4C07;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LO_NAME_SIZE: usize = 64;
const LO_KEY_SIZE: usize = 32;

/// `struct loop_info64` from linux/loop.h.
#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; LO_NAME_SIZE],
    lo_crypt_name: [u8; LO_NAME_SIZE],
    lo_encrypt_key: [u8; LO_KEY_SIZE],
    lo_init: [u64; 2],
}

/// `struct loop_config` from linux/loop.h (Linux 5.8+).
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

/// A loop device, `/dev/loop<number>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoopDevice {
    /// N in loopN.
    pub number: u32,
}

impl LoopDevice {
    /// The device node.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/dev/loop{}", self.number))
    }

    /// Device number (major 7).
    pub fn rdev(&self) -> io::Result<u64> {
        use std::os::unix::fs::MetadataExt;
        Ok(std::fs::metadata(self.path())?.rdev())
    }

    /// Size in bytes as the kernel currently sees it.
    pub fn size_bytes(&self) -> io::Result<u64> {
        let s = std::fs::read_to_string(format!("/sys/block/loop{}/size", self.number))?;
        let sectors: u64 = s
            .trim()
            .parse()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        Ok(sectors * 512)
    }

    fn open(&self) -> io::Result<File> {
        OpenOptions::new().read(true).write(true).open(self.path())
    }

    /// Re-reads the backing file's size (after the image grew).
    pub fn refresh_capacity(&self) -> io::Result<()> {
        let dev = self.open()?;
        // SAFETY: LOOP_SET_CAPACITY takes no argument; the fd is open.
        let rc = unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_SET_CAPACITY as _, 0) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Detaches the backing file. A device that is no longer attached is fine.
    /// While the device is still in use (mounted) the kernel detaches it when
    /// the last user goes away.
    pub fn detach(&self) -> io::Result<()> {
        let dev = match self.open() {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        // SAFETY: LOOP_CLR_FD takes no argument; the fd is open.
        let rc = unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_CLR_FD as _, 0) };
        if rc < 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::ENXIO) {
                return Ok(());
            }
            return Err(err);
        }
        Ok(())
    }
}

/// The path a loop device is attached to, or None when it is free.
pub fn backing_file(number: u32) -> io::Result<Option<PathBuf>> {
    match std::fs::read(format!("/sys/block/loop{number}/loop/backing_file")) {
        Ok(mut b) => {
            while b.last() == Some(&b'\n') {
                b.pop();
            }
            Ok(Some(PathBuf::from(std::ffi::OsStr::from_bytes(&b))))
        }
        // Not attached, or a device being created or removed right now.
        Err(e)
            if e.kind() == io::ErrorKind::NotFound
                || matches!(e.raw_os_error(), Some(libc::ENODEV | libc::ENXIO)) =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Every attached loop device and its backing file.
pub fn attached() -> io::Result<Vec<(LoopDevice, PathBuf)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/sys/block")? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(num) = name
            .to_str()
            .and_then(|n| n.strip_prefix("loop"))
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if let Some(file) = backing_file(num)? {
            out.push((LoopDevice { number: num }, file));
        }
    }
    out.sort_by_key(|(d, _)| d.number);
    Ok(out)
}

/// The loop device attached to `image`, if any.
pub fn find(image: &Path) -> io::Result<Option<LoopDevice>> {
    Ok(attached()?
        .into_iter()
        .find(|(_, f)| f == image)
        .map(|(d, _)| d))
}

/// Attaches `image` (read-write) to a free loop device.
pub fn attach(image: &Path) -> io::Result<LoopDevice> {
    let file = OpenOptions::new().read(true).write(true).open(image)?;
    let ctl = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/loop-control")?;
    // GET_FREE returns the same device to concurrent callers: attach one at a
    // time in this process. Another process may still take the device between
    // GET_FREE and CONFIGURE (EBUSY): ask again.
    static ATTACH: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = ATTACH.lock().unwrap_or_else(|p| p.into_inner());
    let mut last = io::Error::other("no free loop device");
    for attempt in 0..200u64 {
        if attempt > 0 {
            std::thread::sleep(std::time::Duration::from_millis(attempt.min(20)));
        }
        // SAFETY: LOOP_CTL_GET_FREE takes no argument; the fd is open.
        let n = unsafe { libc::ioctl(ctl.as_raw_fd(), LOOP_CTL_GET_FREE as _, 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let dev = LoopDevice { number: n as u32 };
        let devfile = match dev.open() {
            Ok(f) => f,
            // devtmpfs creates the node asynchronously on some kernels.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                last = e;
                continue;
            }
            Err(e) => return Err(e),
        };
        let mut name = [0u8; LO_NAME_SIZE];
        let bytes = image.as_os_str().as_bytes();
        let len = bytes.len().min(LO_NAME_SIZE - 1);
        name[..len].copy_from_slice(&bytes[..len]);
        let cfg = LoopConfig {
            fd: file.as_raw_fd() as u32,
            block_size: 0,
            info: LoopInfo64 {
                lo_device: 0,
                lo_inode: 0,
                lo_rdevice: 0,
                lo_offset: 0,
                lo_sizelimit: 0,
                lo_number: 0,
                lo_encrypt_type: 0,
                lo_encrypt_key_size: 0,
                lo_flags: 0,
                lo_file_name: name,
                lo_crypt_name: [0; LO_NAME_SIZE],
                lo_encrypt_key: [0; LO_KEY_SIZE],
                lo_init: [0; 2],
            },
            reserved: [0; 8],
        };
        // SAFETY: cfg is a valid, fully initialized struct loop_config that
        // outlives the call; both fds are open.
        let rc = unsafe {
            libc::ioctl(
                devfile.as_raw_fd(),
                LOOP_CONFIGURE as _,
                &cfg as *const LoopConfig,
            )
        };
        if rc == 0 {
            return Ok(dev);
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EBUSY) {
            return Err(err);
        }
        last = err;
    }
    Err(last)
}
