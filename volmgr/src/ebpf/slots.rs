//! The kernel programs' in-flight slot table (`STARTS`), mapped read-only
//! into this process: listing the calls in flight reads memory, with no
//! syscall per slot.

use std::os::fd::{AsFd, AsRawFd};
use std::ptr::{addr_of, read_volatile, NonNull};
use std::sync::atomic::{fence, Ordering};

use aya::maps::{Map, MapData};

use super::wire::{InFlight, ALL_SLOTS};
use super::EbpfError;

/// `STARTS` (a `BPF_F_MMAPABLE` array of [`InFlight`]), mapped shared and
/// read-only; unmapped on drop.
pub(super) struct SlotTable {
    ptr: NonNull<InFlight>,
    /// Bytes mapped: every slot.
    len: usize,
    /// The map (its descriptor), kept as long as the mapping.
    _map: MapData,
}

// SAFETY: the mapping is read only (volatile reads of plain integers), from
// any thread; it stays valid until the table is dropped.
unsafe impl Send for SlotTable {}
// SAFETY: as above: `&SlotTable` only reads.
unsafe impl Sync for SlotTable {}

impl SlotTable {
    /// Maps `map`, which must be the object's `STARTS` array.
    pub(super) fn new(map: Map) -> Result<SlotTable, EbpfError> {
        let Map::Array(map) = map else {
            return Err(EbpfError::Io(std::io::Error::other(
                "eBPF map STARTS is not an array",
            )));
        };
        let len = ALL_SLOTS as usize * std::mem::size_of::<InFlight>();
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
                "mapping eBPF map STARTS: {}",
                std::io::Error::last_os_error()
            ))));
        }
        let ptr = NonNull::new(p.cast::<InFlight>())
            .ok_or_else(|| EbpfError::Io(std::io::Error::other("mmap returned null")))?;
        Ok(SlotTable {
            ptr,
            len,
            _map: map,
        })
    }

    /// The records of every held slot. A slot that changes while it is
    /// read (its call began or ended meanwhile) is left out: the same
    /// non-zero `owner` and `ts` must be seen before and after the copy
    /// (see [`InFlight`] for the writers' order).
    pub(super) fn held(&self) -> Vec<InFlight> {
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
                fence(Ordering::Acquire);
                let same = read_volatile(addr_of!((*p).owner)) == owner
                    && read_volatile(addr_of!((*p).ts)) == ts;
                if ts == 0 || !same || rec.owner != owner || rec.ts != ts {
                    continue;
                }
                rec
            };
            out.push(rec);
        }
        out
    }
}

impl Drop for SlotTable {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, with its length; unmapped once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}
