//! The kernel programs' in-flight slot table (`STARTS`) and the path
//! arguments copied beside it (`PATHS`), mapped read-only into this
//! process: listing the calls in flight reads memory, with no syscall per
//! slot, and never the callers' memory.

use std::os::fd::{AsFd, AsRawFd};
use std::ptr::{addr_of, read_volatile, NonNull};
use std::sync::atomic::{fence, Ordering};

use aya::maps::{Map, MapData};

use super::wire::{InFlight, ALL_SLOTS, IN_FLIGHT_PATH_MAX};
use super::EbpfError;

/// A path argument as the kernel program copied it (NUL-terminated).
type PathBytes = [u8; IN_FLIGHT_PATH_MAX];

/// `STARTS` (a `BPF_F_MMAPABLE` array of [`InFlight`]) and `PATHS` (one
/// path argument per slot), mapped shared and read-only; unmapped on drop.
pub(super) struct SlotTable {
    ptr: NonNull<InFlight>,
    /// Bytes mapped: every slot.
    len: usize,
    paths: NonNull<PathBytes>,
    /// Bytes of `paths` mapped.
    paths_len: usize,
    /// The maps (their descriptors), kept as long as the mappings.
    _maps: [MapData; 2],
}

/// Maps `len` bytes of the mappable array `map` (named `name`) shared and
/// read-only.
fn map_array(map: Map, name: &str, len: usize) -> Result<(NonNull<u8>, MapData), EbpfError> {
    let Map::Array(map) = map else {
        return Err(EbpfError::Io(std::io::Error::other(format!(
            "eBPF map {name} is not an array"
        ))));
    };
    // SAFETY: a new shared read-only mapping of the array's values (the
    // kernel checks that the map is mappable and `len` fits in it);
    // nothing in this process writes through it.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            map.fd().as_fd().as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(EbpfError::Io(std::io::Error::other(format!(
            "mapping eBPF map {name}: {}",
            std::io::Error::last_os_error()
        ))));
    }
    let ptr = NonNull::new(p.cast::<u8>())
        .ok_or_else(|| EbpfError::Io(std::io::Error::other("mmap returned null")))?;
    Ok((ptr, map))
}

// SAFETY: the mapping is read only (volatile reads of plain integers), from
// any thread; it stays valid until the table is dropped.
unsafe impl Send for SlotTable {}
// SAFETY: as above: `&SlotTable` only reads.
unsafe impl Sync for SlotTable {}

impl SlotTable {
    /// Maps `starts` and `paths`, the object's `STARTS` and `PATHS` arrays.
    pub(super) fn new(starts: Map, paths: Map) -> Result<SlotTable, EbpfError> {
        let len = ALL_SLOTS as usize * std::mem::size_of::<InFlight>();
        let paths_len = ALL_SLOTS as usize * IN_FLIGHT_PATH_MAX;
        let (ptr, starts) = map_array(starts, "STARTS", len)?;
        let (p, paths) = match map_array(paths, "PATHS", paths_len) {
            Ok(m) => m,
            Err(e) => {
                // SAFETY: the mapping just made, with its length.
                unsafe { libc::munmap(ptr.as_ptr().cast(), len) };
                return Err(e);
            }
        };
        Ok(SlotTable {
            ptr: ptr.cast(),
            len,
            paths: p.cast(),
            paths_len,
            _maps: [starts, paths],
        })
    }

    /// The records of every held slot, with their path arguments (up to
    /// the NUL). A slot that changes while it is read (its call began or
    /// ended meanwhile) is left out: the same non-zero `owner` and `ts`
    /// must be seen before and after the copy (see [`InFlight`] for the
    /// writers' order).
    pub(super) fn held(&self) -> Vec<(InFlight, Vec<u8>)> {
        let mut out = Vec::new();
        for i in 0..ALL_SLOTS as usize {
            // SAFETY: `i` < ALL_SLOTS, so the slot lies within the
            // mapping; `InFlight` is plain integers (valid for any bytes),
            // read volatile because the kernel writes them meanwhile.
            let rec = unsafe {
                let p = self.ptr.as_ptr().add(i);
                let owner = read_volatile(addr_of!((*p).owner));
                if owner == 0 {
                    continue;
                }
                let ts = read_volatile(addr_of!((*p).ts));
                fence(Ordering::Acquire);
                let rec = read_volatile(p);
                let path = read_volatile(self.paths.as_ptr().add(i));
                fence(Ordering::Acquire);
                let same = read_volatile(addr_of!((*p).owner)) == owner
                    && read_volatile(addr_of!((*p).ts)) == ts;
                if ts == 0 || !same || rec.owner != owner || rec.ts != ts {
                    continue;
                }
                (rec, path)
            };
            let (rec, path) = rec;
            let end = path.iter().position(|&b| b == 0).unwrap_or(path.len());
            out.push((rec, path[..end].to_vec()));
        }
        out
    }
}

impl Drop for SlotTable {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, with its length; unmapped once.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
            libc::munmap(self.paths.as_ptr().cast(), self.paths_len);
        }
    }
}
