//! What a request names: its target collection or object, its query and
//! field selector.

use std::collections::BTreeMap;

use serde_json::Value;

/// What a path names.
#[derive(Debug)]
pub(super) struct Target {
    pub(super) resource: String,
    /// `None`: all namespaces (or cluster-scoped).
    pub(super) namespace: Option<String>,
    pub(super) name: Option<String>,
    pub(super) subresource: Option<String>,
    /// Under `/api/v1` (the core group).
    pub(super) core: bool,
}

impl Target {
    /// The key of the object `name` in this collection.
    pub(super) fn key(&self, name: &str) -> (String, String, String) {
        (
            self.resource.clone(),
            self.namespace.clone().unwrap_or_default(),
            name.to_string(),
        )
    }
}

pub(super) fn parse_path(path: &str) -> Option<Target> {
    let rest = path.strip_prefix("/api/v1/").or_else(|| {
        let r = path.strip_prefix("/apis/")?;
        let mut it = r.splitn(3, '/');
        it.next()?;
        it.next()?;
        it.next()
    })?;
    let segs: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
    let (namespace, segs) = match segs.as_slice() {
        ["namespaces", ns, tail @ ..] if !tail.is_empty() => (Some(ns.to_string()), tail.to_vec()),
        _ => (None, segs),
    };
    let seg = |i: usize| segs.get(i).map(|s| s.to_string());
    Some(Target {
        resource: seg(0)?,
        namespace,
        name: seg(1),
        subresource: seg(2),
        core: path.starts_with("/api/v1/"),
    })
}

pub(super) fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(v) => {
                        out.push(v);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub(super) fn query_map(q: &str) -> BTreeMap<String, String> {
    q.split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

/// Whether `obj` matches a field selector (`a.b=v,c.d!=w`).
pub(super) fn matches(selector: &str, obj: &Value) -> bool {
    selector.split(',').filter(|t| !t.is_empty()).all(|term| {
        let (field, want, negate) = if let Some((f, v)) = term.split_once("!=") {
            (f, v, true)
        } else if let Some((f, v)) = term.split_once("==") {
            (f, v, false)
        } else if let Some((f, v)) = term.split_once('=') {
            (f, v, false)
        } else {
            return false;
        };
        let mut v = obj;
        for part in field.split('.') {
            v = &v[part];
        }
        let got = v.as_str().unwrap_or("");
        (got == want) != negate
    })
}
