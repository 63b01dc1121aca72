//! The pod's volumes as a C array of structs, for callers that ask often
//! (a kubelet asks for every container it starts): no JSON to write or to
//! parse. Every string lives in one arena the list owns, so a Go caller
//! copies the arena once and slices its strings out of the copy.

use std::ffi::c_char;

use volmgr_core::cache::actual_state_of_world::VolumeMountState;
use volmgr_core::volume::check_pod_uid;
use volmgr_core::volumemanager::VolumeManager;

use crate::boundary::{guard, out_arg, str_arg, try_ffi};
use crate::error::*;
use crate::handle::{handle, volmgr};

/// A volume certainly mounted for the pod.
pub const VOLMGR_VOLUME_MOUNTED: u32 = 0;
/// A volume whose mount state is uncertain (an operation was interrupted).
pub const VOLMGR_VOLUME_UNCERTAIN: u32 = 1;

/// One volume of a pod: what the kubelet's `container.VolumeInfo` needs.
/// Every string is NUL-terminated and lives in the list's arena.
#[repr(C)]
pub struct volmgr_mounted_volume {
    /// The volume's name in the pod spec.
    pub outer_volume_spec_name: *const c_char,
    /// The unique volume name.
    pub volume_name: *const c_char,
    /// The plugin (`kubernetes.io/empty-dir`, ...).
    pub plugin: *const c_char,
    /// Where the volume is (for a raw block volume, the device file).
    pub path: *const c_char,
    /// For a volume in `volumeDevices`, the device file to hand to the
    /// runtime; NULL otherwise.
    pub block_device_path: *const c_char,
    /// `VOLMGR_VOLUME_MOUNTED` or `VOLMGR_VOLUME_UNCERTAIN`.
    pub state: u32,
    /// The volume's own read-only flag (a read-only CSI volume).
    pub read_only: bool,
    /// Whether the runtime may relabel it for SELinux (the kubelet's
    /// `GetAttributes().SELinuxRelabel`; see
    /// `volmgr_get_mounted_volumes_for_pod`).
    pub selinux_relabel: bool,
    /// The containers' subPath bind mounts of this volume (`sub_paths_len`
    /// of them; NULL when none), in the list's ownership.
    pub sub_paths: *const volmgr_sub_path,
    /// How many `sub_paths`.
    pub sub_paths_len: usize,
}

/// One container's subPath bind mount of a volume: the runtime binds
/// `path` (not the volume's path) into the container.
#[repr(C)]
pub struct volmgr_sub_path {
    /// The container's name.
    pub container: *const c_char,
    /// The index of the `volumeMount` in the container's `volumeMounts`.
    pub index: usize,
    /// The path inside the volume (`subPath`, or `subPathExpr` expanded).
    pub sub_path: *const c_char,
    /// The bind mount,
    /// `ROOT/pods/<uid>/volume-subpaths/<volume>/<container>/<index>`.
    pub path: *const c_char,
}

/// A pod's volumes, sorted by `outer_volume_spec_name`. Free with
/// `volmgr_volume_list_free`.
#[repr(C)]
pub struct volmgr_volume_list {
    /// `len` entries.
    pub volumes: *const volmgr_mounted_volume,
    /// How many.
    pub len: usize,
    /// The bytes every string of the entries points into.
    pub arena: *const c_char,
    /// The arena's size in bytes.
    pub arena_len: usize,
}

/// The list and what it points into, in one allocation's ownership.
#[repr(C)]
struct Owned {
    /// First, so a pointer to it is a pointer to the whole.
    list: volmgr_volume_list,
    rows: Vec<volmgr_mounted_volume>,
    subs: Vec<volmgr_sub_path>,
    arena: Vec<u8>,
}

/// One subPath before the arena is final: offsets into it.
struct SubRow {
    container: usize,
    index: usize,
    sub_path: usize,
    path: usize,
}

/// One row before the arena is final: offsets into it.
struct Row {
    strings: [usize; 4],
    block: Option<usize>,
    state: u32,
    read_only: bool,
    selinux_relabel: bool,
    /// Its entries in the subPath rows.
    subs: std::ops::Range<usize>,
}

/// Appends `s` and its NUL to `arena`; its offset.
fn push(arena: &mut Vec<u8>, s: &[u8]) -> usize {
    let at = arena.len();
    // Names and paths never hold NUL (paths come from the kernel or were
    // checked); one would only cut the C string short.
    arena.extend_from_slice(s);
    arena.push(0);
    at
}

/// The pod's volumes (with `uncertain`, those in an uncertain state too).
fn build(vm: &VolumeManager, uid: &str, uncertain: bool) -> Box<Owned> {
    use std::os::unix::ffi::OsStrExt;
    // Before the actual state's lock: the desired state's is taken first.
    let subs = volmgr_core::volume::PodUid::new(uid)
        .map(|u| vm.sub_paths_of_pod(&u))
        .unwrap_or_default();
    let (mut rows, sub_rows, arena) = vm.with_actual_state(|asw| {
        let mut arena = Vec::with_capacity(1024);
        let mut rows: Vec<(Vec<u8>, Row)> = Vec::new();
        let mut sub_rows: Vec<SubRow> = Vec::new();
        for (name, plugin, m) in asw.mounts_of_pod(uid) {
            if !uncertain && m.state != VolumeMountState::Mounted {
                continue;
            }
            let first_sub = sub_rows.len();
            for s in subs.get(m.outer_volume_spec_name()).into_iter().flatten() {
                sub_rows.push(SubRow {
                    container: push(&mut arena, s.container.as_bytes()),
                    index: s.index,
                    sub_path: push(&mut arena, s.sub_path.as_bytes()),
                    path: push(&mut arena, s.path.as_bytes()),
                });
            }
            let outer = push(&mut arena, m.outer_volume_spec_name().as_bytes());
            let path = push(&mut arena, m.path.as_os_str().as_bytes());
            let row = Row {
                strings: [
                    outer,
                    push(&mut arena, name.as_str().as_bytes()),
                    push(&mut arena, plugin.as_bytes()),
                    path,
                ],
                block: m.spec.is_block().then_some(path),
                state: match m.state {
                    VolumeMountState::Mounted => VOLMGR_VOLUME_MOUNTED,
                    VolumeMountState::Uncertain => VOLMGR_VOLUME_UNCERTAIN,
                },
                read_only: m.spec.read_only(),
                selinux_relabel: m.selinux_relabel,
                subs: first_sub..sub_rows.len(),
            };
            rows.push((m.outer_volume_spec_name().as_bytes().to_vec(), row));
        }
        (rows, sub_rows, arena)
    });
    rows.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    own(rows, sub_rows, arena)
}

/// The list of `rows` (sorted) and `sub_rows`, whose strings are in
/// `arena`: the C structs, pointing into the arena and the subPath array.
fn own(rows: Vec<(Vec<u8>, Row)>, sub_rows: Vec<SubRow>, arena: Vec<u8>) -> Box<Owned> {
    let mut owned = Box::new(Owned {
        list: volmgr_volume_list {
            volumes: std::ptr::null(),
            len: 0,
            arena: std::ptr::null(),
            arena_len: 0,
        },
        rows: Vec::with_capacity(rows.len()),
        subs: Vec::with_capacity(sub_rows.len()),
        arena,
    });
    // The arena is final: pointers into it stay valid while it lives (and
    // so are those into `subs` once it is filled: it never grows again).
    let base = owned.arena.as_ptr().cast::<c_char>();
    let at = |off: usize| base.wrapping_add(off);
    for s in sub_rows {
        owned.subs.push(volmgr_sub_path {
            container: at(s.container),
            index: s.index,
            sub_path: at(s.sub_path),
            path: at(s.path),
        });
    }
    let subs_base = owned.subs.as_ptr();
    for (_, r) in rows {
        owned.rows.push(volmgr_mounted_volume {
            outer_volume_spec_name: at(r.strings[0]),
            volume_name: at(r.strings[1]),
            plugin: at(r.strings[2]),
            path: at(r.strings[3]),
            block_device_path: r.block.map_or(std::ptr::null(), at),
            state: r.state,
            read_only: r.read_only,
            selinux_relabel: r.selinux_relabel,
            sub_paths: match r.subs.is_empty() {
                true => std::ptr::null(),
                false => subs_base.wrapping_add(r.subs.start),
            },
            sub_paths_len: r.subs.len(),
        });
    }
    owned.list = volmgr_volume_list {
        volumes: owned.rows.as_ptr(),
        len: owned.rows.len(),
        arena: base,
        arena_len: owned.arena.len(),
    };
    owned
}

/// The kubelet's `GetMountedVolumesForPod` (with `uncertain`,
/// `GetPossiblyMountedVolumesForPod`) as an array of structs: the same
/// entries as `volmgr_get_mounted_volumes_for_pod`'s JSON, without JSON.
/// `*out` is owned by the caller (`volmgr_volume_list_free`); an unknown
/// pod gives an empty list.
///
/// # Safety
/// `vm` live or NULL; `pod_uid` a string or NULL; `out` writable or NULL.
#[no_mangle]
pub unsafe extern "C" fn volmgr_get_volume_list_for_pod(
    vm: *mut volmgr,
    pod_uid: *const c_char,
    uncertain: bool,
    out: *mut *mut volmgr_volume_list,
) -> volmgr_status {
    guard(|| {
        // SAFETY: per this function's contract.
        let h = try_ffi!(unsafe { handle(vm) });
        // SAFETY: per this function's contract.
        let uid = try_ffi!(unsafe { str_arg(pod_uid, "pod_uid") });
        let out = try_ffi!(out_arg(out, "out"));
        try_ffi!(check_pod_uid(uid).map_err(|e| fail(VOLMGR_ERR_INVALID_ARGUMENT, e.to_string())));
        let owned = build(&h.vm, uid, uncertain);
        // SAFETY: checked non-NULL. `list` is the first field of the
        // `repr(C)` box: a pointer to it is a pointer to the box.
        unsafe { *out = Box::into_raw(owned).cast::<volmgr_volume_list>() };
        VOLMGR_OK
    })
}

/// Frees a list from `volmgr_get_volume_list_for_pod` (NULL is a no-op).
///
/// # Safety
/// `list` is NULL or from `volmgr_get_volume_list_for_pod`, not freed before.
#[no_mangle]
pub unsafe extern "C" fn volmgr_volume_list_free(list: *mut volmgr_volume_list) {
    if list.is_null() {
        return;
    }
    let _ = guard(|| {
        // SAFETY: per the contract, `list` came from Box::into_raw of an
        // `Owned`, whose first field it is.
        drop(unsafe { Box::from_raw(list.cast::<Owned>()) });
        VOLMGR_OK
    });
}
