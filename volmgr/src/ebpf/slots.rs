//! The kernel programs' maps that this process maps into its memory
//! (`BPF_F_MMAPABLE` arrays): the in-flight slot table (`STARTS`), read
//! without a syscall per slot, and the reader's sleep flag
//! (`READER_ASLEEP`).

use std::os::fd::{AsFd, AsRawFd};
use std::ptr::{addr_of, read_volatile, NonNull};
use std::sync::atomic::{fence, AtomicU64, Ordering};

use aya::maps::{Map, MapData};

use super::wire::{InFlight, IN_FLIGHT_SLOTS};
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
        let len = IN_FLIGHT_SLOTS as usize * std::mem::size_of::<InFlight>();
        let (map, ptr) = map_array(map, "STARTS", len, libc::PROT_READ)?;
        Ok(SlotTable {
            ptr: ptr.cast(),
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
        for i in 0..IN_FLIGHT_SLOTS as usize {
            // SAFETY: `i` < IN_FLIGHT_SLOTS, so the slot lies within the
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

/// `READER_ASLEEP` (a `BPF_F_MMAPABLE` array of one u64), mapped shared
/// and writable: 1 while the ring's reader sleeps until a wake-up, set by
/// the reader, cleared by the program that wakes it (see
/// `wire::WAKE_INTERVAL_NS`).
pub(super) struct ReaderFlag {
    ptr: NonNull<u64>,
    /// The map (its descriptor), kept as long as the mapping.
    _map: MapData,
}

// SAFETY: the mapping is only accessed atomically, from any thread; it
// stays valid until the flag is dropped.
unsafe impl Send for ReaderFlag {}
// SAFETY: as above.
unsafe impl Sync for ReaderFlag {}

impl ReaderFlag {
    /// Maps `map`, which must be the object's `READER_ASLEEP` array.
    pub(super) fn new(map: Map) -> Result<ReaderFlag, EbpfError> {
        let (map, ptr) = map_array(
            map,
            "READER_ASLEEP",
            std::mem::size_of::<u64>(),
            libc::PROT_READ | libc::PROT_WRITE,
        )?;
        Ok(ReaderFlag {
            ptr: ptr.cast(),
            _map: map,
        })
    }

    /// Says the reader sleeps until a wake-up. Then look at the ring once
    /// more before sleeping: an event whose program read the flag before
    /// this store is in the ring by then.
    pub(super) fn sleep(&self) {
        // SAFETY: the u64 value of the mapped array (page aligned), which
        // the kernel programs access atomically too.
        let flag = unsafe { AtomicU64::from_ptr(self.ptr.as_ptr()) };
        flag.store(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }
}

impl Drop for ReaderFlag {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`; unmapped once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), std::mem::size_of::<u64>()) };
    }
}

/// Maps the first `len` bytes of the values of `map` (array `name`, created
/// with `BPF_F_MMAPABLE`), shared, with protection `prot`.
fn map_array(
    map: Map,
    name: &str,
    len: usize,
    prot: libc::c_int,
) -> Result<(MapData, NonNull<libc::c_void>), EbpfError> {
    let Map::Array(map) = map else {
        return Err(EbpfError::Io(std::io::Error::other(format!(
            "eBPF map {name} is not an array"
        ))));
    };
    // SAFETY: a new shared mapping of the array's values (the kernel checks
    // that the map is mappable and `len` fits in it); this process accesses
    // it only through the types above.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            prot,
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
    let ptr = NonNull::new(p)
        .ok_or_else(|| EbpfError::Io(std::io::Error::other("mmap returned null")))?;
    Ok((map, ptr))
}
