//! The shape of the code, checked on every test run (`docs/ARCHITECTURE.md`):
//!
//! - the library's modules form layers whose `crate::` references only point
//!   down (no module cycle);
//! - inside `populator/`, the folders keep their own layers
//!   ([`POPULATOR_LAYERS`]): objects, then conversion, then the populator
//!   and the resolver writing to it, then the manifests directory;
//! - the tracer observes: it never reaches the executor, the reconciler or
//!   anything that mounts;
//! - no function outside tests is longer than 80 lines, in the library, the
//!   command and the C ABI;
//! - in every crate (the library, `volmgr-kube`, the command, the C ABI), no
//!   files import each other in a circle ([`circles`]: `use` and paths in
//!   code; a folder's `pub use` of its children is its face, and a file
//!   naming its own folder's items is at home, not an import).
//!
//! The parser is deliberately small: it strips comments, string and char
//! literals, skips `#[cfg(test)]` items, and reads `crate::NAME` paths and
//! `fn` bodies by brace matching. Every check is shown to fail on a planted
//! violation by its own unit test below.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The layers, lowest first. A module may use modules of lower layers only,
/// never another module of its own layer. `util` is the lowest: every layer
/// may use it, and it uses no other module.
const LAYERS: &[&[&str]] = &[
    &["util"],
    &["failpoint", "quantity", "volume", "ebpf"],
    &["metrics"],
    &["status"],
    &["sys"],
    &["cache", "pluginmanager", "cri"],
    &["plugins"],
    &["tracer"],
    &["operationexecutor"],
    &["reconciler"],
    &["populator"],
    &["volumemanager"],
    &["observer"],
];

/// The layers inside `populator/`, lowest first: a place is a folder or file
/// relative to `populator/` (without `.rs`; `""` is the populator itself,
/// `PodSink` and the files beside `mod.rs`), and a file or a
/// `crate::populator::...` path belongs to the longest place it starts with.
/// A place may refer to its own and lower places only. Between folders,
/// paths are spelled `crate::populator::...` (a `super::super::` is refused)
/// so that this check sees them.
const POPULATOR_LAYERS: &[&str] = &[
    // Kinds, the store, lookups, who read what.
    "objects",
    // A `v1.Pod` into the volumes it needs, reading objects.
    "convert",
    // The populator: `PodSink`, the desired state's writer.
    "",
    // Pods resolved against objects, written to a `PodSink`.
    "resolver",
    // The manifests directory, a source of pods and objects.
    "manifests",
];

/// Names the tracer must not use: it records what it sees in the actual state
/// and leaves every mount and unmount to the reconciler.
const TRACER_FORBIDDEN: &[&str] = &[
    "Mounter",
    "OperationExecutor",
    "operationexecutor",
    "Reconciler",
];

/// The longest a function outside tests may be, in lines.
const MAX_FN_LINES: usize = 80;

fn rank(module: &str) -> Option<(usize, usize)> {
    // (layer, position in it)
    LAYERS.iter().enumerate().find_map(|(layer, names)| {
        names
            .iter()
            .position(|n| *n == module)
            .map(|pos| (layer, pos))
    })
}

/// Whether `from` may refer to `to`.
fn allowed(from: &str, to: &str) -> bool {
    if from == to {
        return true;
    }
    match (rank(from), rank(to)) {
        (Some((fl, _)), Some((tl, _))) => tl < fl,
        _ => false,
    }
}

/// Source text with comments, string and char literals blanked (newlines
/// kept, so line numbers stay right).
fn strip(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    let blank = |out: &mut String, c: u8| out.push(if c == b'\n' { '\n' } else { ' ' });
    while i < b.len() {
        let c = b[i];
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, b[i]);
                    i += 1;
                }
            }
        } else if c == b'r'
            && matches!(b.get(i + 1), Some(b'"') | Some(b'#'))
            && !ident_before(b, i)
        {
            // Raw string: r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&b'"') {
                out.push(c as char);
                i += 1;
                continue;
            }
            out.push(' ');
            i += 1;
            while i <= j {
                out.push(' ');
                i += 1;
            }
            loop {
                if i >= b.len() {
                    break;
                }
                if b[i] == b'"' && (0..hashes).all(|k| b.get(i + 1 + k) == Some(&b'#')) {
                    for _ in 0..=hashes {
                        out.push(' ');
                    }
                    i += 1 + hashes;
                    break;
                }
                blank(&mut out, b[i]);
                i += 1;
            }
        } else if c == b'"' {
            out.push(' ');
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    blank(&mut out, b[i]);
                    i += 1;
                }
                if i < b.len() {
                    blank(&mut out, b[i]);
                    i += 1;
                }
            }
            out.push(' ');
            i += 1;
        } else if c == b'\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a).
            let end = if b.get(i + 1) == Some(&b'\\') {
                (i + 2..b.len().min(i + 12)).find(|&k| b[k] == b'\'')
            } else if b.get(i + 2) == Some(&b'\'') {
                Some(i + 2)
            } else {
                None
            };
            match end {
                Some(e) => {
                    for _ in i..=e {
                        out.push(' ');
                    }
                    i = e + 1;
                }
                None => {
                    out.push('\'');
                    i += 1;
                }
            }
        } else {
            out.push(c as char);
            i += 1;
        }
    }
    out
}

fn ident_before(b: &[u8], i: usize) -> bool {
    i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_')
}

/// The index of the line holding the brace that closes the first `{` at or
/// after line `start`, or the line of a `;` that ends the item before any
/// brace opens.
fn item_end(lines: &[&str], start: usize) -> usize {
    let mut depth = 0usize;
    let mut opened = false;
    for (n, line) in lines.iter().enumerate().skip(start) {
        for ch in line.chars() {
            match ch {
                '{' => {
                    depth += 1;
                    opened = true;
                }
                '}' => {
                    depth = depth.saturating_sub(1);
                    if opened && depth == 0 {
                        return n;
                    }
                }
                ';' if !opened && depth == 0 => return n,
                _ => {}
            }
        }
    }
    lines.len().saturating_sub(1)
}

/// The stripped lines of `src` with `#[cfg(test)]` items blanked; `None` when
/// the whole file is test-only (declared under `#[cfg(test)]` by its parent).
fn non_test_lines(src: &str) -> Vec<String> {
    let stripped = strip(src);
    let lines: Vec<&str> = stripped.lines().collect();
    let mut keep: Vec<String> = Vec::with_capacity(lines.len());
    let mut n = 0;
    while n < lines.len() {
        if lines[n].trim() == "#[cfg(test)]" {
            let end = item_end(&lines, n + 1);
            for _ in n..=end {
                keep.push(String::new());
            }
            n = end + 1;
        } else {
            keep.push(lines[n].to_string());
            n += 1;
        }
    }
    keep
}

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<PathBuf> = rd.filter_map(|e| e.ok()).map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rs_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// Files declared `#[cfg(test)] mod NAME;` by their parent (e.g. `sys/fake.rs`).
fn test_only_files(src: &Path, files: &[PathBuf]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        for w in lines.windows(2) {
            if w[0].trim() != "#[cfg(test)]" {
                continue;
            }
            let decl = w[1]
                .trim()
                .trim_start_matches("pub ")
                .trim_start_matches("pub(crate) ");
            if let Some(name) = decl.strip_prefix("mod ").and_then(|r| r.strip_suffix(';')) {
                let dir = if f
                    .file_name()
                    .is_some_and(|n| n == "mod.rs" || n == "lib.rs")
                {
                    f.parent()
                        .map(Path::to_path_buf)
                        .unwrap_or_else(|| src.to_path_buf())
                } else {
                    f.with_extension("")
                };
                out.push(dir.join(format!("{name}.rs")));
                out.push(dir.join(name).join("mod.rs"));
            }
        }
    }
    out
}

/// The top-level module a file of `src` belongs to.
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (name != "lib").then(|| name.to_string())
}

/// `crate::NAME` references of non-test code: (line, NAME).
fn crate_refs(lines: &[String]) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in lines.iter().enumerate() {
        let mut rest = line.as_str();
        while let Some(at) = rest.find("crate::") {
            let before = rest[..at].chars().last();
            rest = &rest[at + "crate::".len()..];
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.push((n + 1, name));
            }
        }
    }
    out
}

/// Layer violations in the library at `src`.
fn layer_violations(src: &Path) -> Vec<String> {
    let mut files = Vec::new();
    rs_files(src, &mut files);
    let test_only = test_only_files(src, &files);
    let mut out = Vec::new();
    for f in &files {
        if test_only.contains(f) {
            continue;
        }
        let Some(module) = module_of(src, f) else {
            continue;
        };
        let rel = f.strip_prefix(src).unwrap_or(f).display().to_string();
        if rank(&module).is_none() {
            out.push(format!(
                "{rel}: module `{module}` is in no layer (add it to LAYERS)"
            ));
            continue;
        }
        let text = std::fs::read_to_string(f).unwrap_or_default();
        let lines = non_test_lines(&text);
        for (line, to) in crate_refs(&lines) {
            if !allowed(&module, &to) {
                out.push(format!(
                    "{rel}:{line}: `{module}` uses `crate::{to}`, a layer above it"
                ));
            }
        }
        if module == "tracer" {
            for (n, line) in lines.iter().enumerate() {
                for word in TRACER_FORBIDDEN {
                    if contains_word(line, word) {
                        out.push(format!(
                            "{rel}:{}: the tracer uses `{word}`: it must only record in the actual state",
                            n + 1
                        ));
                    }
                }
            }
        }
    }
    out
}

/// The rank in [`POPULATOR_LAYERS`] of `path` (components joined by `/`).
fn populator_rank(path: &str) -> usize {
    let starts_with =
        |place: &str| place.is_empty() || path == place || path.starts_with(&format!("{place}/"));
    POPULATOR_LAYERS
        .iter()
        .enumerate()
        .filter(|(_, p)| starts_with(p))
        .max_by_key(|(_, p)| p.len())
        .map_or(0, |(rank, _)| rank)
}

/// `crate::populator::A::B` references of non-test code: (line, "A/B").
fn populator_refs(lines: &[String]) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in lines.iter().enumerate() {
        for (at, _) in line.match_indices("crate::populator::") {
            let rest = &line[at + "crate::populator::".len()..];
            let mut parts = Vec::new();
            for part in rest.split("::") {
                let name: String = part
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                let whole = name.len() == part.len();
                if !name.is_empty() {
                    parts.push(name);
                }
                if !whole {
                    break;
                }
            }
            out.push((n + 1, parts.join("/")));
        }
    }
    out
}

/// Sub-layer violations inside `src/populator/`.
fn populator_violations(src: &Path) -> Vec<String> {
    let root = src.join("populator");
    let mut files = Vec::new();
    rs_files(&root, &mut files);
    let test_only = test_only_files(src, &files);
    let mut out = Vec::new();
    for f in files.iter().filter(|f| !test_only.contains(f)) {
        let rel = f.strip_prefix(&root).unwrap_or(f).with_extension("");
        let place = rel.to_string_lossy().replace('\\', "/");
        let place = match place.as_str() {
            "mod" => "",
            p => p.strip_suffix("/mod").unwrap_or(p),
        };
        let from = populator_rank(place);
        let text = std::fs::read_to_string(f).unwrap_or_default();
        let lines = non_test_lines(&text);
        let shown = f.strip_prefix(src).unwrap_or(f).display().to_string();
        for (line, to) in populator_refs(&lines) {
            if populator_rank(&to) > from {
                out.push(format!(
                    "{shown}:{line}: uses `crate::populator::{}`, a layer above it in populator/",
                    to.replace('/', "::")
                ));
            }
        }
        for (n, line) in lines.iter().enumerate() {
            if line.contains("super::super::") {
                out.push(format!(
                    "{shown}:{}: `super::super::`: spell it `crate::populator::...`",
                    n + 1
                ));
            }
        }
    }
    out
}

fn contains_word(line: &str, word: &str) -> bool {
    line.match_indices(word).any(|(at, _)| {
        let before = line[..at].chars().last();
        let after = line[at + word.len()..].chars().next();
        !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
            && !after.is_some_and(|c| c.is_alphanumeric() || c == '_')
    })
}

/// Functions outside tests longer than `max` lines: "file:line fn name (N lines)".
fn long_functions(file: &Path, text: &str, max: usize) -> Vec<String> {
    let lines = non_test_lines(text);
    let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
    let mut out = Vec::new();
    for (n, line) in refs.iter().enumerate() {
        let Some(name) = fn_name(line) else {
            continue;
        };
        // A declaration without a body (trait method, extern) ends with `;`.
        let end = item_end(&refs, n);
        let has_body = refs[n..=end].iter().any(|l| l.contains('{'));
        if !has_body {
            continue;
        }
        let len = end - n + 1;
        if len > max {
            out.push(format!(
                "{}:{} fn {name} ({len} lines)",
                file.display(),
                n + 1
            ));
        }
    }
    out
}

fn fn_name(line: &str) -> Option<String> {
    let mut words = line.split_whitespace().peekable();
    while let Some(w) = words.next() {
        match w {
            "pub" | "async" | "unsafe" | "const" | "extern" | "\"C\"" | "default" => continue,
            w if w.starts_with("pub(") => continue,
            "fn" => {
                let name: String = words
                    .next()?
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                return (!name.is_empty()).then_some(name);
            }
            _ => return None,
        }
    }
    None
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn layers_only_point_down() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let v = layer_violations(&src);
    assert!(v.is_empty(), "layer violations:\n{}", v.join("\n"));
}

/// Layer violations in test code (test modules and test-only files): a test
/// that needs a higher layer lives in that layer (as the reconciler's, the
/// tracer check's, the resolver's and the manifests source's tests through
/// the whole manager live in `volumemanager/tests/`).
fn test_layer_violations(src: &Path) -> Vec<String> {
    let mut files = Vec::new();
    rs_files(src, &mut files);
    let mut out = Vec::new();
    for f in &files {
        let Some(module) = module_of(src, f) else {
            continue;
        };
        let rel = f.strip_prefix(src).unwrap_or(f).display().to_string();
        let text = std::fs::read_to_string(f).unwrap_or_default();
        let lines: Vec<String> = strip(&text).lines().map(str::to_string).collect();
        for (line, to) in crate_refs(&lines) {
            if rank(&to).is_some() && !allowed(&module, &to) {
                out.push(format!(
                    "{rel}:{line}: `{module}` (test code too) uses `crate::{to}`, a layer above it: test it from that layer"
                ));
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

#[test]
fn test_code_keeps_the_layers_too() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let v = test_layer_violations(&src);
    assert!(
        v.is_empty(),
        "layer violations in test code:\n{}",
        v.join("\n")
    );
}

#[test]
fn the_test_layer_check_sees_a_planted_use() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("reconciler")).unwrap();
    std::fs::write(
        dir.path().join("reconciler/x.rs"),
        "#[cfg(test)]\nmod tests {\n    use crate::volumemanager::VolumeManager;\n}\n",
    )
    .unwrap();
    let v = test_layer_violations(dir.path());
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].starts_with("reconciler/x.rs:3:"), "{v:?}");
}

#[test]
fn populator_folders_keep_their_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    assert!(src.join("populator/objects").is_dir() && src.join("populator/convert").is_dir());
    let v = populator_violations(&src);
    assert!(
        v.is_empty(),
        "populator layer violations:\n{}",
        v.join("\n")
    );
}

#[test]
fn no_function_outside_tests_is_longer_than_80_lines() {
    let ws = workspace();
    let mut files = Vec::new();
    for dir in ["volmgr/src", "volmgr-kube/src", "cli/src", "ffi/src"] {
        let mut found = Vec::new();
        rs_files(&ws.join(dir), &mut found);
        let test_only = test_only_files(&ws.join(dir), &found);
        files.extend(found.into_iter().filter(|f| !test_only.contains(f)));
    }
    assert!(files.len() > 50, "found only {} source files", files.len());
    let mut by_file: BTreeMap<PathBuf, Vec<String>> = BTreeMap::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        let long = long_functions(f.strip_prefix(&ws).unwrap_or(f), &text, MAX_FN_LINES);
        if !long.is_empty() {
            by_file.insert(f.clone(), long);
        }
    }
    let all: Vec<String> = by_file.into_values().flatten().collect();
    assert!(
        all.is_empty(),
        "functions over {MAX_FN_LINES} lines:\n{}",
        all.join("\n")
    );
}

/// A file's module path under its crate's `src` (`reconciler/start.rs` →
/// `["reconciler", "start"]`; `mod.rs`, `lib.rs` and `main.rs` are their
/// folder).
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap_or(file);
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap_or_default();
    if !matches!(last.as_str(), "mod.rs" | "lib.rs" | "main.rs") {
        parts.push(last.trim_end_matches(".rs").to_string());
    }
    parts
}

/// The paths a `use` tree names, braces expanded (`a::{b, c::d}` → `a::b`,
/// `a::c::d`); `self` in braces is the prefix itself.
fn use_paths(tree: &str, out: &mut Vec<String>) {
    // Renames (`a::b as c`) dropped, then the spaces.
    let mut words = tree.split_whitespace();
    let mut flat = String::new();
    while let Some(w) = words.next() {
        if w == "as" {
            let alias = words.next().unwrap_or("");
            flat.push_str(alias.trim_start_matches(|c: char| c.is_alphanumeric() || c == '_'));
        } else {
            flat.push_str(w);
        }
    }
    let tree = flat;
    let Some(open) = tree.find('{') else {
        out.push(tree);
        return;
    };
    let prefix = &tree[..open];
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let (mut depth, mut start) = (0, 0);
    let mut parts = Vec::new();
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    for p in parts.into_iter().filter(|p| !p.is_empty()) {
        if p == "self" {
            out.push(prefix.trim_end_matches("::").to_string());
        } else {
            use_paths(&format!("{prefix}{p}"), out);
        }
    }
}

/// The module paths code names: every `use` (but `pub use`, a folder's
/// face) and every `crate::`, `super::` or `self::` path in code.
fn named_paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let b = code.as_bytes();
    let mut i = 0;
    while let Some(at) = code[i..].find("use ") {
        let at = i + at;
        i = at + 4;
        if ident_before(b, at) {
            continue;
        }
        let before = code[..at].trim_end();
        if before.ends_with("pub") || before.ends_with(')') {
            continue;
        }
        let end = code[at..].find(';').map_or(code.len(), |e| at + e);
        use_paths(&code[at + 4..end], &mut out);
    }
    for root in ["crate::", "super::", "self::"] {
        let mut j = 0;
        while let Some(at) = code[j..].find(root) {
            let at = j + at;
            j = at + root.len();
            if ident_before(b, at) || code[..at].ends_with("::") {
                continue;
            }
            let path: String = code[at..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            out.push(path.trim_end_matches(':').to_string());
        }
    }
    out
}

/// The file a path named in module `from` leads to: the longest prefix of
/// it that is a module of the crate (`None` for other crates, for `from`
/// itself and for its ancestors: a file sees its folder's items, as an
/// `impl` split over a folder's files names its type in `mod.rs`; the
/// check is between files that are not each other's folder).
fn target_file(
    from: &[String],
    path: &str,
    modules: &BTreeMap<Vec<String>, PathBuf>,
) -> Option<PathBuf> {
    let mut segs: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
    let mut abs: Vec<String> = match segs.first().copied() {
        Some("crate") => {
            segs.remove(0);
            Vec::new()
        }
        Some("super") | Some("self") => from.to_vec(),
        _ => from.to_vec(),
    };
    for s in segs {
        match s {
            "super" => {
                abs.pop();
            }
            "self" => {}
            s => abs.push(s.to_string()),
        }
    }
    (1..=abs.len())
        .rev()
        .map(|n| &abs[..n])
        .find(|p| modules.contains_key(*p))
        .filter(|p| !from.starts_with(p))
        .and_then(|p| modules.get(p))
        .cloned()
}

/// Files of the crate at `src` that import each other in a loop, each
/// circle as its files (relative to `src`), test code left out.
fn circles(src: &Path) -> Vec<Vec<String>> {
    let mut files = Vec::new();
    rs_files(src, &mut files);
    let test_only = test_only_files(src, &files);
    files.retain(|f| !test_only.contains(f));
    let modules: BTreeMap<Vec<String>, PathBuf> = files
        .iter()
        .map(|f| (module_path(src, f), f.clone()))
        .collect();
    let mut edges: BTreeMap<PathBuf, Vec<PathBuf>> = BTreeMap::new();
    for f in &files {
        let code = non_test_lines(&std::fs::read_to_string(f).unwrap_or_default()).join("\n");
        let from = module_path(src, f);
        let mut to: Vec<PathBuf> = named_paths(&code)
            .iter()
            .filter_map(|p| target_file(&from, p, &modules))
            .collect();
        to.sort();
        to.dedup();
        edges.insert(f.clone(), to);
    }
    strongly_connected(&edges)
        .into_iter()
        .filter(|c| c.len() > 1)
        .map(|c| {
            c.iter()
                .map(|f| f.strip_prefix(src).unwrap_or(f).display().to_string())
                .collect()
        })
        .collect()
}

/// The strongly connected components of `edges` (Tarjan's algorithm).
fn strongly_connected(edges: &BTreeMap<PathBuf, Vec<PathBuf>>) -> Vec<Vec<PathBuf>> {
    struct T<'a> {
        edges: &'a BTreeMap<PathBuf, Vec<PathBuf>>,
        index: BTreeMap<&'a PathBuf, (usize, usize)>,
        stack: Vec<&'a PathBuf>,
        next: usize,
        out: Vec<Vec<PathBuf>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a PathBuf) {
        t.index.insert(v, (t.next, t.next));
        t.next += 1;
        t.stack.push(v);
        for w in t.edges.get(v).into_iter().flatten() {
            match t.index.get(w).copied() {
                None => {
                    visit(t, w);
                    let low = t.index[w].1.min(t.index[v].1);
                    if let Some(e) = t.index.get_mut(v) {
                        e.1 = low;
                    }
                }
                Some((wi, _)) if t.stack.contains(&w) => {
                    let low = wi.min(t.index[v].1);
                    if let Some(e) = t.index.get_mut(v) {
                        e.1 = low;
                    }
                }
                _ => {}
            }
        }
        let (vi, vl) = t.index[v];
        if vi == vl {
            let mut comp = Vec::new();
            while let Some(w) = t.stack.pop() {
                comp.push(w.clone());
                if w == v {
                    break;
                }
            }
            t.out.push(comp);
        }
    }
    let mut t = T {
        edges,
        index: BTreeMap::new(),
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !t.index.contains_key(v) {
            visit(&mut t, v);
        }
    }
    t.out
}

#[test]
fn no_files_import_each_other_in_a_circle() {
    let ws = workspace();
    let mut all = Vec::new();
    for dir in ["volmgr/src", "volmgr-kube/src", "cli/src", "ffi/src"] {
        for c in circles(&ws.join(dir)) {
            all.push(format!("{dir}: {}", c.join(" <-> ")));
        }
    }
    assert!(all.is_empty(), "files in a circle:\n{}", all.join("\n"));
}

#[test]
fn the_circle_check_sees_a_planted_circle() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("a")).unwrap();
    std::fs::write(src.join("lib.rs"), "mod a;\nmod b;\npub use a::*;\n").unwrap();
    std::fs::write(src.join("a/mod.rs"), "mod c;\npub use c::C;\n").unwrap();
    // a/c.rs -> b.rs -> a/c.rs, through a grouped use and a path in code.
    std::fs::write(
        src.join("a/c.rs"),
        "use crate::{b::B, util};\npub struct C;\n#[cfg(test)]\nmod tests {\n    use super::super::super::lib;\n}\n",
    )
    .unwrap();
    std::fs::write(
        src.join("b.rs"),
        "pub struct B;\nfn f() { let _ = crate::a::c::C; }\n// crate::a in a comment\n",
    )
    .unwrap();
    let c = circles(src);
    assert_eq!(c.len(), 1, "{c:?}");
    let mut files = c[0].clone();
    files.sort();
    assert_eq!(files, vec!["a/c.rs".to_string(), "b.rs".to_string()]);
    // Without the path in b.rs, no circle (the faces do not count).
    std::fs::write(src.join("b.rs"), "pub struct B;\n").unwrap();
    assert!(circles(src).is_empty());
}

#[test]
fn the_checks_catch_what_they_look_for() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("cache")).unwrap();
    std::fs::create_dir_all(src.join("tracer")).unwrap();
    std::fs::write(src.join("lib.rs"), "pub mod cache;\npub mod tracer;\n").unwrap();
    // cache → reconciler points up; the one in a test module and the one in a
    // comment or string do not count.
    std::fs::write(
        src.join("cache/mod.rs"),
        "use crate::volume::X;\n// crate::reconciler in a comment\nfn f() { let _ = \"crate::reconciler\"; crate::reconciler::go(); }\n#[cfg(test)]\nmod tests {\n    use crate::volumemanager::VolumeManager;\n}\n",
    )
    .unwrap();
    std::fs::write(src.join("tracer/mod.rs"), "use crate::sys::Mounter;\n").unwrap();
    let v = layer_violations(src);
    assert_eq!(v.len(), 2, "{v:#?}");
    assert!(
        v[0].contains("cache/mod.rs:3") && v[0].contains("crate::reconciler"),
        "{v:#?}"
    );
    assert!(
        v[1].contains("tracer/mod.rs:1") && v[1].contains("Mounter"),
        "{v:#?}"
    );

    // populator/: objects must not use convert, convert not the resolver;
    // convert may use objects, the resolver the populator's root.
    std::fs::create_dir_all(src.join("populator/objects")).unwrap();
    std::fs::create_dir_all(src.join("populator/convert")).unwrap();
    std::fs::write(
        src.join("populator/objects/mod.rs"),
        "use crate::populator::convert::pod::X;\nuse crate::populator::objects::ObjectRef;\n",
    )
    .unwrap();
    std::fs::write(
        src.join("populator/resolver.rs"),
        "use crate::populator::{PodSink, X};\nuse crate::populator::convert::pod::D;\n",
    )
    .unwrap();
    std::fs::write(
        src.join("populator/convert/pod.rs"),
        "use crate::populator::objects::lookup::L;\nuse crate::populator::resolver::R;\nfn f() { super::super::x(); }\n",
    )
    .unwrap();
    let v = populator_violations(src);
    assert_eq!(v.len(), 3, "{v:#?}");
    assert!(
        v[0].contains("convert/pod.rs:2") && v[0].contains("populator::resolver"),
        "{v:#?}"
    );
    assert!(
        v[1].contains("convert/pod.rs:3") && v[1].contains("super::super"),
        "{v:#?}"
    );
    assert!(
        v[2].contains("objects/mod.rs:1") && v[2].contains("convert::pod"),
        "{v:#?}"
    );

    let body: String = (0..81)
        .map(|i| format!("    let _x{i} = '{{';\n"))
        .collect();
    let text = format!(
        "pub fn short() {{\n}}\npub async fn long() {{\n{body}}}\ntrait T {{\n    fn decl(&self);\n}}\n#[cfg(test)]\nmod tests {{\n    fn long_test() {{\n{body}    }}\n}}\n"
    );
    let long = long_functions(Path::new("x.rs"), &text, 80);
    assert_eq!(long, vec!["x.rs:3 fn long (83 lines)".to_string()]);
    assert!(!allowed("cache", "pluginmanager") && !allowed("pluginmanager", "cache"));
    assert!(allowed("plugins", "pluginmanager") && allowed("status", "metrics"));
}
