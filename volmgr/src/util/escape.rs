//! Printable text from untrusted names: pod and volume names, errors that
//! quote them, come from manifests and end up in the log and in `volmgr
//! status`; a newline there forges a log line, an escape sequence retitles
//! or repaints the reader's terminal.

use std::borrow::Cow;
use std::fmt::Write as _;

/// `s` cut to at most `max` bytes on a character boundary, ` ...` after
/// a cut: untrusted text quoted in evidence or status stays bounded.
pub fn shortened(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    format!("{} ...", &s[..s.floor_char_boundary(max)])
}

/// `s` with every control character (C0, DEL, C1) escaped as `\n`, `\r`,
/// `\t` or `\u{..}`, and backslashes doubled so that the escapes cannot be
/// forged either; `s` itself when there is nothing to escape.
pub fn printable(s: &str) -> Cow<'_, str> {
    if !s.chars().any(|c| c.is_control() || c == '\\') {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Displays a value through [`printable`].
#[derive(Debug, Clone, Copy)]
pub struct Printable<T>(pub T);

impl<T: std::fmt::Display> std::fmt::Display for Printable<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&printable(&self.0.to_string()))
    }
}

/// `s` as XML character data or an attribute value: `&`, `<`, `>`, `"`
/// and `'` escaped, and every character XML 1.0 does not allow (C0
/// controls, U+FFFE, U+FFFF), and the other controls (DEL, C1, tab, line
/// breaks), replaced with U+FFFD: a process or file system name with one
/// must not make the document invalid.
pub fn xml_text(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&apos;"),
            '\u{fffe}' | '\u{ffff}' => o.push('\u{fffd}'),
            c if c.is_control() => o.push('\u{fffd}'),
            c => o.push(c),
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Cut on a character boundary, ` ...` after a cut only.
    #[test]
    fn messages_are_shortened() {
        assert_eq!(shortened("ééé", 3), "é ...");
        assert_eq!(shortened("abc", 3), "abc");
    }

    #[test]
    fn xml_text_escapes_markup_and_replaces_what_xml_forbids() {
        assert_eq!(
            xml_text("a<b>&\"'\u{fffe}\u{ffff}\u{1b}\u{7f}\u{85}\tü\u{10000}"),
            "a&lt;b&gt;&amp;&quot;&apos;\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}ü\u{10000}"
        );
    }

    #[test]
    fn escapes_control_characters_only() {
        assert!(matches!(printable("pod-a ü"), Cow::Borrowed(_)));
        assert_eq!(
            printable("a\nINFO forged\x1b]0;title\x07\u{9b}\\n"),
            "a\\nINFO forged\\u{1b}]0;title\\u{7}\\u{9b}\\\\n"
        );
        assert_eq!(Printable("x\ty").to_string(), "x\\ty");
    }
}
