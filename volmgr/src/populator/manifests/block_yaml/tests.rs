//! The fast reader against serde_norway: what it accepts it must read as
//! serde_norway does, on hand-written, generated and mutated manifests.

use serde_json::{json, Value};

use super::parse;

/// serde_norway's reading of `text`, as the slow path does it.
fn slow(text: &str) -> Result<Value, String> {
    serde_norway::from_str::<Value>(text).map_err(|e| e.to_string())
}

/// Checks that the fast reader either gives up or agrees with serde_norway;
/// returns whether it accepted.
fn agrees(text: &str) -> bool {
    match parse(text) {
        None => false,
        Some(fast) => {
            assert_eq!(
                Ok(fast),
                slow(text),
                "the fast reader disagrees on:\n{text}"
            );
            true
        }
    }
}

const POD: &str = "apiVersion: v1
kind: Pod
metadata:
  name: pod-1
  namespace: bench
  uid: 0b6e1c6a-8d1f-4a3e-9b1c-000000000001
spec:
  containers:
  - name: app
    image: busybox
    volumeMounts:
    - name: cache
      mountPath: /cache
  volumes:
  - name: cache
    emptyDir:
      medium: Memory
      sizeLimit: 16Mi
";

const WRITTEN_BY_HAND: &str = r#"# A web server.
---
apiVersion: v1
kind: Pod
metadata:
  name: web   # the name
  labels:
    app.kubernetes.io/name: web
    "quoted key": 'it''s'
  annotations: {}
spec:
  securityContext:
    fsGroup: 2000
    runAsNonRoot: true
  containers:
    - name: nginx
      image: nginx:1.27
      command: ["sh", "-c", "echo \"hi\" \\ there"]
      args: [a, b,c]
      ports:
        - containerPort: 80
      volumeMounts:
        - {name: cache, mountPath: /var/cache/nginx, readOnly: false}
        - name: scratch
          mountPath: /scratch
  volumes:
  - name: cache
    emptyDir: {medium: Memory, sizeLimit: 64Mi}
  - name: scratch
    emptyDir: {}
  - name: none
    emptyDir:
  - name: cfg
    configMap:
      name: cfg
      items: []
      optional: ~
"#;

#[test]
fn reads_manifests_as_people_write_them() {
    assert!(agrees(POD));
    assert!(agrees(WRITTEN_BY_HAND));
    for text in [
        "a: 2024-01-01\n",
        "uid: 0b6e1c6a-8d1f-4a3e-9b1c-000000000001\n",
        "a: yes\n",
    ] {
        assert!(agrees(text), "gave up on {text:?}");
    }
    let v = parse(WRITTEN_BY_HAND).unwrap();
    assert_eq!(
        v["spec"]["containers"][0]["command"],
        json!(["sh", "-c", "echo \"hi\" \\ there"])
    );
    assert_eq!(
        v["spec"]["containers"][0]["ports"][0]["containerPort"],
        json!(80)
    );
    assert_eq!(v["spec"]["volumes"][2]["emptyDir"], Value::Null);
    assert_eq!(v["metadata"]["labels"]["quoted key"], json!("it's"));
    assert_eq!(
        v["spec"]["volumes"][0]["emptyDir"]["sizeLimit"],
        json!("64Mi")
    );
}

#[test]
fn gives_up_outside_its_subset() {
    for text in [
        "",
        "# only a comment\n",
        "a: 1\n---\nb: 2\n",
        "a: &x 1\nb: *x\n",
        "a: !!str 1\n",
        "a: |\n  text\n",
        "a: >\n  text\n",
        "a: one\n  two\n",
        "a: \"one\n  two\"\n",
        "a:\tb\n",
        "a: b\r\n",
        "a: 0x1f\n",
        "a: 1e3\n",
        "a: 1.5\n",
        "a: -1\n",
        "a: .inf\n",
        "a: NaN\n",
        "a: 007\n",
        "a: 12345678901234567890\n",
        "a: {b: {c: d}}\n",
        "a: [b, [c]]\n",
        "a: \"\\x41\"\n",
        "? a\n: b\n",
        "a: b\na: c\n",
        "a: b: c\n",
        "- a\n- - b\n",
        "scalar\n",
        "a:\n  - b\n  c: d\n",
        "a: b\n - c\n",
        "<<: {a: 1}\n",
        "---\n---\na: 1\n",
        "# a\u{1}b\na: 1\n",
        "a: b\u{0}c\n",
        "a: b\u{7f}\n",
        "a: b\u{9f}\n",
        "a: b \u{85}# c\n",
        "a: b\u{2028}c: d\n",
        "a: \u{feff}b\n",
        "\u{feff}a: b\n",
    ] {
        assert_eq!(parse(text), None, "accepted {text:?}");
    }
    let deep = (0..100)
        .map(|i| format!("{}k:\n", " ".repeat(i)))
        .collect::<String>();
    assert_eq!(parse(&deep), None, "accepted nesting past MAX_DEPTH");
}

/// A small deterministic generator (xorshift64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

/// Scalars whose type or quoting is easy to get wrong.
const SCALARS: &[&str] = &[
    "app",
    "busybox",
    "16Mi",
    "100m",
    "80",
    "0",
    "007",
    "0x1f",
    "0o17",
    "1e3",
    "1E3",
    "1.5",
    "-1",
    "+1",
    "true",
    "True",
    "TRUE",
    "false",
    "yes",
    "no",
    "on",
    "off",
    "y",
    "n",
    "null",
    "Null",
    "~",
    "",
    "NaN",
    "nan",
    "inf",
    "Infinity",
    ".inf",
    "2024-01-01",
    "12:30",
    "1_000",
    "1,000",
    "a#b",
    "a #b",
    "http://x:80/y",
    "foo,bar",
    "é",
    "e5",
    "123456789012345678",
    "18446744073709551616",
    "9223372036854775808",
    "it's",
    "say \"hi\"",
    "back\\slash",
    "a: b",
    "- x",
    "{x}",
    "[x]",
    "x]",
    "/cache",
    "_u",
    "3d",
    "1f",
    "12abc",
    "0b101",
    "2h30m",
];

const KEYS: &[&str] = &[
    "name",
    "a",
    "b.c/d",
    "x-y",
    "_k",
    "1",
    "80",
    "true",
    "null",
    "k k",
    "app.kubernetes.io/name",
    "007",
    "0x1f",
    "on",
    "y",
];

/// A scalar written plain, single-quoted or double-quoted.
fn scalar(rng: &mut Rng) -> String {
    let s = rng.pick(SCALARS);
    match rng.below(4) {
        0 => format!("'{}'", s.replace('\'', "''")),
        1 => format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\"")),
        _ => s.to_string(),
    }
}

fn key(rng: &mut Rng) -> String {
    let k = rng.pick(KEYS);
    match rng.below(6) {
        0 => format!("\"{k}\""),
        1 => format!("'{k}'"),
        _ => k.to_string(),
    }
}

/// A flat flow collection.
fn flow(rng: &mut Rng) -> String {
    let n = rng.below(4);
    if rng.below(2) == 0 {
        let items: Vec<String> = (0..n).map(|_| scalar(rng)).collect();
        format!("[{}]", items.join(", "))
    } else {
        let items: Vec<String> = (0..n)
            .map(|_| format!("{}: {}", key(rng), scalar(rng)))
            .collect();
        format!("{{{}}}", items.join(", "))
    }
}

/// A value written after `key:` or `-`: on the same line (returned) or as
/// lines below, indented from `indent`.
fn value(rng: &mut Rng, indent: usize, depth: usize, out: &mut String) -> String {
    match rng.below(if depth > 4 { 2 } else { 5 }) {
        0 => format!(" {}", scalar(rng)),
        1 => format!(" {}", flow(rng)),
        2 => {
            out.push('\n');
            let step = 1 + rng.below(3);
            mapping(rng, indent + step, depth + 1, out);
            String::new()
        }
        _ => {
            out.push('\n');
            let same = rng.below(2) == 0;
            sequence(rng, if same { indent } else { indent + 2 }, depth + 1, out);
            String::new()
        }
    }
}

fn mapping(rng: &mut Rng, indent: usize, depth: usize, out: &mut String) {
    for _ in 0..1 + rng.below(4) {
        out.push_str(&" ".repeat(indent));
        out.push_str(&key(rng));
        out.push(':');
        let mut below = String::new();
        let inline = value(rng, indent, depth, &mut below);
        out.push_str(&inline);
        if rng.below(8) == 0 {
            out.push_str(" # note: x");
        }
        if below.is_empty() {
            out.push('\n');
        } else {
            out.push_str(&below);
        }
    }
}

fn sequence(rng: &mut Rng, indent: usize, depth: usize, out: &mut String) {
    for _ in 0..1 + rng.below(3) {
        out.push_str(&" ".repeat(indent));
        out.push('-');
        if depth < 5 && rng.below(2) == 0 {
            // A compact mapping on the dash's line.
            let mut m = String::new();
            mapping(rng, indent + 2, depth + 1, &mut m);
            out.push_str(&m[indent + 1..]);
        } else {
            let mut below = String::new();
            let inline = value(rng, indent, depth, &mut below);
            out.push_str(&inline);
            if below.is_empty() {
                out.push('\n');
            } else {
                out.push_str(&below);
            }
        }
    }
}

#[test]
fn agrees_with_serde_norway_on_generated_documents() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut accepted, total) = (0, 20_000);
    for _ in 0..total {
        let mut text = String::new();
        mapping(&mut rng, 0, 0, &mut text);
        accepted += usize::from(agrees(&text));
    }
    // Most generated documents hold some scalar it gives up on; enough
    // must be read for the comparison to mean something.
    assert!(accepted > total / 20, "only {accepted} of {total} read");
}

/// Characters that change how YAML reads a line.
const EDITS: &[&str] = &[
    " ", "  ", "-", "- ", ":", ": ", "#", " #", "\n", "{", "}", "[", "]", ",", "'", "\"", "&a ",
    "*a", "!", "|", ">", "~", "0", "1", "x", ".", "?", "\\", "\t", "---\n", "\u{1}", "\u{0}",
    "\u{85}", "\u{9f}", "\u{feff}", "\u{2028}", "\u{2029}", "é", "\u{a0}",
];

#[test]
fn agrees_with_serde_norway_on_mutated_manifests() {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let (mut accepted, total) = (0, 30_000);
    for i in 0..total {
        let mut text = if i % 2 == 0 { POD } else { WRITTEN_BY_HAND }.to_string();
        for _ in 0..1 + rng.below(3) {
            let mut at = rng.below(text.len() + 1);
            while !text.is_char_boundary(at) {
                at -= 1;
            }
            match rng.below(3) {
                0 => text.insert_str(at, rng.pick(EDITS)),
                1 => {
                    let mut end = (at + 1 + rng.below(3)).min(text.len());
                    while !text.is_char_boundary(end) {
                        end += 1;
                    }
                    text.replace_range(at..end, "");
                }
                _ => {
                    let mut end = (at + 1).min(text.len());
                    while !text.is_char_boundary(end) {
                        end += 1;
                    }
                    text.replace_range(at..end, rng.pick(EDITS));
                }
            }
        }
        accepted += usize::from(agrees(&text));
    }
    assert!(accepted > total / 10, "only {accepted} of {total} read");
}
