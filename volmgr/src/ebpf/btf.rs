//! Just enough of a BTF reader to find kernel struct member offsets in
//! `/sys/kernel/btf/vmlinux`: the eBPF program reads
//! `task->nsproxy->mnt_ns->ns.inum` with offsets computed here at load time,
//! so one object works across kernel builds.

use std::collections::HashMap;

/// Why an offset could not be found.
#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    /// The BTF could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The data is not BTF or is cut short.
    #[error("malformed BTF: {0}")]
    Malformed(&'static str),
    /// No struct of that name.
    #[error("no struct {0} in the kernel's BTF")]
    NoStruct(String),
    /// The struct has no such member.
    #[error("struct {0} has no member {1}")]
    NoMember(String, String),
}

const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;

#[derive(Debug, Clone)]
struct Member {
    name: u32,
    ty: u32,
    bit_offset: u32,
}

#[derive(Debug, Clone)]
struct Type {
    name: u32,
    kind: u32,
    /// For modifiers and typedefs: the referenced type.
    ty: u32,
    members: Vec<Member>,
}

/// Parsed BTF types (struct/union members and type references only).
#[derive(Debug)]
pub struct Btf {
    strings: Vec<u8>,
    /// Index = type id (0 is void).
    types: Vec<Type>,
    structs_by_name: HashMap<String, u32>,
}

fn u32_at(b: &[u8], off: usize) -> Result<u32, BtfError> {
    b.get(off..off + 4)
        .and_then(|s| s.try_into().ok())
        .map(u32::from_le_bytes)
        .ok_or(BtfError::Malformed("truncated"))
}

impl Btf {
    /// Reads the running kernel's BTF.
    pub fn from_sys_fs() -> Result<Btf, BtfError> {
        let path = "/sys/kernel/btf/vmlinux";
        let data = std::fs::read(path).map_err(|source| BtfError::Read {
            path: path.into(),
            source,
        })?;
        Btf::parse(&data)
    }

    /// Parses raw (little-endian) BTF.
    pub fn parse(data: &[u8]) -> Result<Btf, BtfError> {
        if data.len() < 24 || data[0..2] != [0x9f, 0xeb] {
            return Err(BtfError::Malformed("bad magic (not little-endian BTF)"));
        }
        let hdr_len = u32_at(data, 4)? as usize;
        let type_off = u32_at(data, 8)? as usize;
        let type_len = u32_at(data, 12)? as usize;
        let str_off = u32_at(data, 16)? as usize;
        let str_len = u32_at(data, 20)? as usize;
        let types_bytes = data
            .get(hdr_len + type_off..hdr_len + type_off + type_len)
            .ok_or(BtfError::Malformed("type section out of bounds"))?;
        let strings = data
            .get(hdr_len + str_off..hdr_len + str_off + str_len)
            .ok_or(BtfError::Malformed("string section out of bounds"))?
            .to_vec();
        let mut types = vec![Type {
            name: 0,
            kind: 0,
            ty: 0,
            members: Vec::new(),
        }];
        let mut off = 0;
        while off < types_bytes.len() {
            let name = u32_at(types_bytes, off)?;
            let info = u32_at(types_bytes, off + 4)?;
            let size_or_type = u32_at(types_bytes, off + 8)?;
            off += 12;
            let vlen = (info & 0xffff) as usize;
            let kind = (info >> 24) & 0x1f;
            let kind_flag = info >> 31 == 1;
            let mut members = Vec::new();
            let extra = match kind {
                1 | 14 | 17 => 4, // INT, VAR, DECL_TAG
                3 => 12,          // ARRAY
                KIND_STRUCT | KIND_UNION => {
                    for i in 0..vlen {
                        let m = off + 12 * i;
                        let raw = u32_at(types_bytes, m + 8)?;
                        members.push(Member {
                            name: u32_at(types_bytes, m)?,
                            ty: u32_at(types_bytes, m + 4)?,
                            bit_offset: if kind_flag { raw & 0x00ff_ffff } else { raw },
                        });
                    }
                    12 * vlen
                }
                6 | 13 => 8 * vlen,        // ENUM, FUNC_PROTO
                15 | 19 => 12 * vlen,      // DATASEC, ENUM64
                2 | 7..=12 | 16 | 18 => 0, // PTR, FWD, TYPEDEF, VOLATILE, CONST, RESTRICT, FUNC, FLOAT, TYPE_TAG
                _ => return Err(BtfError::Malformed("unknown type kind")),
            };
            off += extra;
            types.push(Type {
                name,
                kind,
                ty: size_or_type,
                members,
            });
        }
        let mut btf = Btf {
            strings,
            types,
            structs_by_name: HashMap::new(),
        };
        for (id, t) in btf.types.iter().enumerate() {
            if t.kind == KIND_STRUCT && t.name != 0 {
                let name = btf.string(t.name).to_string();
                // Keep the first (vmlinux BTF is deduplicated).
                btf.structs_by_name.entry(name).or_insert(id as u32);
            }
        }
        Ok(btf)
    }

    fn string(&self, off: u32) -> &str {
        let s = self.strings.get(off as usize..).unwrap_or_default();
        let end = s.iter().position(|&b| b == 0).unwrap_or(s.len());
        std::str::from_utf8(&s[..end]).unwrap_or("")
    }

    /// Byte offset of `member` in struct `strukt`, looking into anonymous
    /// struct and union members.
    pub fn member_offset(&self, strukt: &str, member: &str) -> Result<u64, BtfError> {
        let id = *self
            .structs_by_name
            .get(strukt)
            .ok_or_else(|| BtfError::NoStruct(strukt.into()))?;
        self.find_member(id, member, 0)
            .map(|bits| bits / 8)
            .ok_or_else(|| BtfError::NoMember(strukt.into(), member.into()))
    }

    fn find_member(&self, id: u32, member: &str, depth: u32) -> Option<u64> {
        if depth > 8 {
            return None;
        }
        let t = self.types.get(id as usize)?;
        for m in &t.members {
            if m.name != 0 {
                if self.string(m.name) == member {
                    return Some(u64::from(m.bit_offset));
                }
                continue;
            }
            // Anonymous struct or union: search inside.
            let inner = self.skip_modifiers(m.ty);
            if let Some(off) = self.find_member(inner, member, depth + 1) {
                return Some(u64::from(m.bit_offset) + off);
            }
        }
        None
    }

    fn skip_modifiers(&self, mut id: u32) -> u32 {
        for _ in 0..16 {
            match self.types.get(id as usize) {
                // TYPEDEF, VOLATILE, CONST, RESTRICT, TYPE_TAG
                Some(t) if matches!(t.kind, 8..=11 | 18) => id = t.ty,
                _ => break,
            }
        }
        id
    }
}

/// Offsets the program needs to read the mount namespace inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MntNsOffsets {
    /// `offsetof(struct task_struct, nsproxy)`.
    pub task_nsproxy: u64,
    /// `offsetof(struct nsproxy, mnt_ns)`.
    pub nsproxy_mnt_ns: u64,
    /// `offsetof(struct mnt_namespace, ns) + offsetof(struct ns_common, inum)`.
    pub mnt_ns_inum: u64,
}

impl MntNsOffsets {
    /// Computes the offsets from the kernel's BTF.
    pub fn from_btf(btf: &Btf) -> Result<MntNsOffsets, BtfError> {
        Ok(MntNsOffsets {
            task_nsproxy: btf.member_offset("task_struct", "nsproxy")?,
            nsproxy_mnt_ns: btf.member_offset("nsproxy", "mnt_ns")?,
            mnt_ns_inum: btf.member_offset("mnt_namespace", "ns")?
                + btf.member_offset("ns_common", "inum")?,
        })
    }
}

/// Offsets the file system tool programs need: the new program's argument
/// block and the exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExecOffsets {
    /// `offsetof(struct task_struct, mm)`.
    pub task_mm: u64,
    /// `offsetof(struct mm_struct, arg_start)`.
    pub mm_arg_start: u64,
    /// `offsetof(struct mm_struct, arg_end)`.
    pub mm_arg_end: u64,
    /// `offsetof(struct task_struct, exit_code)`.
    pub task_exit_code: u64,
}

impl ExecOffsets {
    /// Computes the offsets from the kernel's BTF.
    pub fn from_btf(btf: &Btf) -> Result<ExecOffsets, BtfError> {
        Ok(ExecOffsets {
            task_mm: btf.member_offset("task_struct", "mm")?,
            mm_arg_start: btf.member_offset("mm_struct", "arg_start")?,
            mm_arg_end: btf.member_offset("mm_struct", "arg_end")?,
            task_exit_code: btf.member_offset("task_struct", "exit_code")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_what_is_not_btf() {
        assert!(matches!(Btf::parse(b"nope"), Err(BtfError::Malformed(_))));
        let mut hdr = vec![0x9f, 0xeb, 1, 0, 24, 0, 0, 0];
        // type section claims 100 bytes that are not there
        hdr.extend_from_slice(&[0, 0, 0, 0, 100, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert!(matches!(Btf::parse(&hdr), Err(BtfError::Malformed(_))));
    }

    #[test]
    fn offsets_from_the_running_kernel() {
        let btf = match Btf::from_sys_fs() {
            Ok(b) => b,
            Err(e) => {
                eprintln!("SKIP: no kernel BTF here: {e}");
                return;
            }
        };
        let o = MntNsOffsets::from_btf(&btf).unwrap();
        // Plausible offsets: nsproxy is deep in task_struct; mnt_ns and the
        // inode number are near the start of their structs.
        assert!(o.task_nsproxy > 64 && o.task_nsproxy < 16384, "{o:?}");
        assert!(o.nsproxy_mnt_ns > 0 && o.nsproxy_mnt_ns < 128, "{o:?}");
        assert!(o.mnt_ns_inum < 256, "{o:?}");
        let x = ExecOffsets::from_btf(&btf).unwrap();
        assert!(x.task_mm > 64 && x.task_exit_code > 64, "{x:?}");
        assert_eq!(x.mm_arg_end, x.mm_arg_start + 8, "{x:?}");
        assert!(matches!(
            btf.member_offset("task_struct", "no_such_member"),
            Err(BtfError::NoMember(..))
        ));
        assert!(matches!(
            btf.member_offset("no_such_struct", "x"),
            Err(BtfError::NoStruct(_))
        ));
    }
}
