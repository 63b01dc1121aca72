//! Scenarios of the kubelet's `pkg/volume/util/atomic_writer_test.go`
//! (`TestWriteOnce`, `TestUpdate`, `TestMultipleUpdates`,
//! `TestPathsToRemove`, `TestValidatePath`), replayed on volmgr's writer:
//! after every write, what a container sees through the volume's visible
//! names is exactly the payload, no more. `docs/KUBELET-SCENARIOS.md` maps
//! them all.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use super::{validate_path, write, Ownership, WriteOutcome, WriterError};
use crate::sys::root_dir::{RelPath, RootDir};
use crate::sys::Target;
use crate::volume::PayloadFile;

/// A payload: (path as given, data, mode).
type Items<'a> = &'a [(&'a str, &'a [u8], u32)];

fn payload(items: Items<'_>) -> BTreeMap<String, PayloadFile> {
    items
        .iter()
        .map(|(p, d, m)| {
            let f = PayloadFile {
                data: Arc::from(*d),
                mode: *m,
                fs_user: None,
            };
            (p.to_string(), f)
        })
        .collect()
}

/// The payload as a container sees it: cleaned path → (data, mode).
fn expected(items: Items<'_>) -> BTreeMap<String, (Vec<u8>, u32)> {
    items
        .iter()
        .map(|(p, d, m)| {
            let clean: Vec<&str> = p
                .split('/')
                .filter(|c| !c.is_empty() && *c != ".")
                .collect();
            (clean.join("/"), (d.to_vec(), *m))
        })
        .collect()
}

/// Every file reachable from the volume's visible names (not `..`), with
/// its data and mode, following the writer's symlinks.
fn observed(v: &Path) -> BTreeMap<String, (Vec<u8>, u32)> {
    fn walk(p: &Path, rel: &str, out: &mut BTreeMap<String, (Vec<u8>, u32)>) {
        let meta = std::fs::metadata(p).unwrap();
        if meta.is_dir() {
            for e in std::fs::read_dir(p).unwrap() {
                let name = e.unwrap().file_name().into_string().unwrap();
                walk(&p.join(&name), &format!("{rel}/{name}"), out);
            }
        } else {
            let mode = meta.permissions().mode() & 0o7777;
            out.insert(rel.to_string(), (std::fs::read(p).unwrap(), mode));
        }
    }
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(v).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        if !name.starts_with("..") {
            walk(&v.join(&name), &name, &mut out);
        }
    }
    out
}

fn volume() -> (tempfile::TempDir, RootDir, Target) {
    let d = tempfile::tempdir().unwrap();
    let root = RootDir::open(d.path()).unwrap();
    let dir = root
        .mkdir_all(&RelPath::new(["vol"]).unwrap(), 0o755)
        .unwrap();
    (d, root, dir)
}

/// Writes `steps` in turn into one volume, checking after each that the
/// volume shows exactly that payload.
fn replay(name: &str, steps: &[Items<'_>]) {
    let (_d, root, dir) = volume();
    for (n, step) in steps.iter().enumerate() {
        write(&root, &dir, &payload(step), Ownership::default())
            .unwrap_or_else(|e| panic!("{name}, write {n}: {e}"));
        assert_eq!(
            observed(dir.path()),
            expected(step),
            "{name}, after write {n}"
        );
    }
}

/// ELF bytes, as the kubelet's "mystery binary": data, not text.
const BINARY: &[u8] = b"\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00>\x00";

/// `TestWriteOnce`: binary data, dotfiles, modes, nested and unclean
/// paths, and the "kitchen sink" of all of them, each in a fresh volume.
#[test]
fn one_payload_is_exactly_what_the_volume_shows() {
    let cases: &[(&str, Items<'_>)] = &[
        ("basic", &[("foo", b"foo", 0o644), ("bar", b"bar", 0o644)]),
        (
            "binary and a dotfile of it",
            &[
                ("binary.bin", BINARY, 0o644),
                (".binary.bin", BINARY, 0o644),
            ],
        ),
        ("modes", &[("foo", b"foo", 0o777), ("bar", b"bar", 0o400)]),
        (
            "dotfiles with modes",
            &[
                ("foo", b"foo", 0o407),
                ("bar", b"bar", 0o440),
                (".dotfile", b"dotfile", 0o777),
                (".dotfile.file", b"dotfile.file", 0o666),
            ],
        ),
        (
            "subdirectories, unclean",
            &[
                ("foo//bar.txt", b"foo//bar", 0o644),
                ("bar///bar/zab.txt", b"bar/../bar/zab.txt", 0o400),
            ],
        ),
        (
            "kitchen sink",
            &[
                ("foo.log", b"foo", 0o644),
                ("bar.zap", b"bar", 0o644),
                (".dotfile", b"dotfile", 0o644),
                ("foo/bar.txt", b"foo/bar", 0o644),
                ("bar/zab.txt", b"bar/zab.txt", 0o644),
                ("foo/blaz/bar.txt", b"foo/blaz/bar", 0o644),
                ("bar/zib/zab.txt", b"bar/zib/zab.txt", 0o400),
                ("1/2/3/4/5/6/7/8/9/10/.dotfile.lib", b"1-2-3-dotfile", 0o777),
            ],
        ),
    ];
    for (name, items) in cases {
        replay(name, &[items]);
    }
}

/// `TestUpdate`, `TestMultipleUpdates` and `TestPathsToRemove`: payloads
/// written in turn into one volume; files and whole directory trees that
/// leave the payload leave the volume, modes and data follow.
#[test]
fn every_update_leaves_exactly_the_new_payload() {
    let first: Items<'_> = &[
        ("foo/bar.txt", b"foo", 0o644),
        ("bar/1/2/sip.txt", b"sip", 0o644),
        ("bar/1/2/3/4/5/6zab.txt", b"bar", 0o644),
    ];
    let sequences: &[(&str, &[Items<'_>])] = &[
        (
            "data and modes change",
            &[
                &[("foo", b"foo", 0o644), ("bar", b"bar", 0o644)],
                &[("foo", b"foo2", 0o400), ("bar", b"bar2", 0o640)],
                &[("foo", b"foo3", 0o600), ("bar", b"bar3", 0o600)],
            ],
        ),
        (
            "deep files added",
            &[
                &[("foo/bar.txt", b"foo", 0o644)],
                &[
                    ("foo/bar.txt", b"foo", 0o644),
                    ("blu/two/2/3/4/5/zip.txt", b"zip", 0o644),
                    ("foo/2/3/4/5/zip.txt", b"zip", 0o644),
                ],
            ],
        ),
        (
            "a deep tree removed, its sibling kept",
            &[
                first,
                &[
                    ("foo/bar.txt", b"foo", 0o644),
                    ("bar/1/2/sip.txt", b"sip", 0o644),
                ],
            ],
        ),
        ("everything removed", &[first, &[]]),
        (
            "added and removed at once",
            &[
                &[("foo/bar.txt", b"foo", 0o644)],
                &[("bar/baz.txt", b"baz", 0o644)],
            ],
        ),
        (
            "unclean paths, then clean ones, then fewer",
            &[
                &[
                    ("bar//zab.txt", b"bar/zab.txt", 0o644),
                    ("bar/zib////zib/zab.txt", b"bar/zib/zab.txt", 0o644),
                    ("zip/zap/zup/fop.txt", b"fop", 0o644),
                ],
                &[
                    ("bar/zab.txt", b"bar/zab.txt2", 0o644),
                    ("bar/zib/zib/zab.txt", b"bar/zib/zab.txt2", 0o644),
                ],
                &[("bar/zab.txt", b"bar/zab.txt", 0o644)],
            ],
        ),
    ];
    for (name, steps) in sequences {
        replay(name, steps);
    }
}

/// `TestUpdate`, "no update": the same payload, even written with unclean
/// paths, rewrites nothing.
#[test]
fn the_same_payload_again_is_not_rewritten() {
    let (_d, root, dir) = volume();
    let items: Items<'_> = &[
        ("foo/bar.txt", b"foo", 0o644),
        ("bar/zab.txt", b"bar", 0o644),
    ];
    let unclean: Items<'_> = &[
        ("foo//bar.txt", b"foo", 0o644),
        ("./bar/zab.txt", b"bar", 0o644),
    ];
    let first = write(&root, &dir, &payload(items), Ownership::default()).unwrap();
    assert!(matches!(first, WriteOutcome::Written { .. }));
    for again in [items, unclean] {
        let out = write(&root, &dir, &payload(again), Ownership::default()).unwrap();
        assert_eq!(out, WriteOutcome::Unchanged);
    }
    assert_eq!(observed(dir.path()), expected(items));
}

/// `TestValidatePath`'s limits: a path longer than 4096 bytes and a name
/// longer than 255 are refused; the longest allowed ones are written.
#[test]
fn path_and_name_length_limits() {
    let long_name = "a".repeat(256);
    let long_path = format!("{}/b", ["c"; 2048].join("/"));
    assert_eq!(long_path.len(), 4097);
    for bad in [long_name.as_str(), long_path.as_str()] {
        assert!(
            matches!(validate_path(bad), Err(WriterError::InvalidPath { .. })),
            "{} bytes accepted",
            bad.len()
        );
    }
    let name = "a".repeat(255);
    assert!(validate_path(&name).is_ok());
    assert!(validate_path(&long_path[2..]).is_ok(), "4095 bytes");
    let items: &[(&str, &[u8], u32)] = &[(name.as_str(), b"x", 0o644)];
    replay("a 255-byte name", &[items]);
}
