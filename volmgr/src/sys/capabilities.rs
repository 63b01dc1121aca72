//! Keeping only some capabilities: the bounding set, the ambient set and
//! the permitted, effective and inheritable sets of the calling thread
//! (`capget(2)`/`capset(2)` with `_LINUX_CAPABILITY_VERSION_3`, the two
//! 32-bit words of capabilities 0-63). Used by observe mode's confinement
//! (`volmgr agent --observe`) and by the holder scan's helper
//! (`observer::holder_helper`).

/// `_LINUX_CAPABILITY_VERSION_3`.
const CAP_VERSION_3: u32 = 0x2008_0522;

/// `struct __user_cap_header_struct`.
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

/// `struct __user_cap_data_struct`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// The kernel's last capability (`/proc/sys/kernel/cap_last_cap`), or
/// `default` when it cannot be read.
pub fn last_cap(default: u32) -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .unwrap_or(default)
}

/// Drops every capability up to `last` but those of `keep` from the
/// bounding set (each drop fails harmlessly without `CAP_SETPCAP`: the
/// bounding set then stays, the sets [`keep_only`] reduces still shrink),
/// and clears the ambient set.
pub fn drop_bounding_except(last: u32, keep: &[u32]) {
    for cap in (0..=last).filter(|c| !keep.contains(c)) {
        // SAFETY: prctl with integer arguments only.
        unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
    }
    // SAFETY: prctl with integer arguments only.
    unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        )
    };
}

/// Reduces this thread's permitted set to those of `keep` it has (all
/// below 64), makes them effective, and empties the inheritable set.
pub fn keep_only(keep: &[u32]) -> std::io::Result<()> {
    let mut hdr = CapHeader {
        version: CAP_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: a valid header and room for the two data words.
    let got = unsafe {
        libc::syscall(
            libc::SYS_capget,
            &mut hdr as *mut CapHeader,
            data.as_mut_ptr(),
        )
    };
    if got != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut mask = [0u32; 2];
    for cap in keep.iter().filter(|c| **c < 64) {
        mask[(*cap / 32) as usize] |= 1 << (cap % 32);
    }
    for (d, k) in data.iter_mut().zip(mask) {
        d.permitted &= k;
        d.effective = d.permitted;
        d.inheritable = 0;
    }
    // SAFETY: a valid header and the two data words.
    if unsafe { libc::syscall(libc::SYS_capset, &mut hdr as *mut CapHeader, data.as_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::test_child::{run_in_child, Child};

    /// The effective set of this thread, from `/proc/thread-self/status`.
    fn effective() -> u64 {
        std::fs::read_to_string("/proc/thread-self/status")
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .unwrap()
    }

    /// In a re-executed child (the sets cannot grow back): after
    /// `keep_only(&[2, 19, 39])` the effective set is exactly those three
    /// (the child runs as root), capabilities above 31 included.
    #[test]
    fn keep_only_leaves_the_kept_ones() {
        run_in_child(
            crate::test_name!("keep_only_leaves_the_kept_ones"),
            Child::PrivateMounts,
            || {
                let kept: u64 = (1 << 2) | (1 << 19) | (1 << 39);
                let before = effective();
                assert_eq!(before & kept, kept, "root has them: {before:#x}");
                drop_bounding_except(last_cap(40), &[2, 19, 39]);
                keep_only(&[2, 19, 39]).unwrap();
                assert_eq!(effective(), kept);
            },
        );
    }
}
