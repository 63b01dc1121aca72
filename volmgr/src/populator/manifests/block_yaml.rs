//! A fast reader for the YAML manifests are usually written in: one
//! document of block mappings and sequences, one-line scalars and flat
//! one-line flow collections (`{name: cache, medium: Memory}`, `["sh",
//! "-c", "..."]`, `{}`).
//!
//! Why: serde_norway builds every event of a document before anything is
//! deserialized, and costs about 12 µs for a 20-line pod (a JSON pod costs
//! 3 µs); on a storm of 10,000 YAML manifests that is the agent's largest
//! cost after the mounts themselves.
//!
//! It gives up (`None`) on anything outside that subset, and the caller
//! then parses the text with serde_norway as before: anchors, aliases,
//! tags, block scalars (`|`, `>`), multi-line or escaped-beyond-the-common
//! quoted scalars, nested flow collections, several documents, tabs, and
//! every plain scalar whose type is not plainly a string, a boolean, a null
//! or a small decimal integer (`0x1f`, `1e3`, `1.5`, `-1`, `.inf`,
//! `2024-01-01`, ...). What it accepts it reads exactly as serde_norway
//! does into a `serde_json::Value` (YAML 1.2's core schema: `true`, not
//! `yes`); the tests compare the two on generated and mutated manifests,
//! and the `manifests` fuzz target on any input.
//!
//! Nesting deeper than [`MAX_DEPTH`](super::yaml_depth::MAX_DEPTH) also
//! gives up, so the depth guard and its error stay the slow path's.

use serde_json::{Map, Number, Value};

use super::yaml_depth::MAX_DEPTH;

/// The document of `text` as serde_norway reads it into a `Value`, or
/// `None` when the text is outside the subset this reader knows (or holds
/// no document at all).
///
/// One pass over the text, holding one line at a time: memory beyond the
/// `Value` is bounded by the nesting, whatever the file's size.
pub fn parse(text: &str) -> Option<Value> {
    let printable_ascii = |b: u8| b == b'\n' || (0x20..0x7f).contains(&b) || b >= 0x80;
    if !text.bytes().all(printable_ascii) || (!text.is_ascii() && !text.chars().all(printable)) {
        return None;
    }
    let mut lines = Lines {
        rest: Some(text),
        started: false,
        refused: false,
    };
    let current = lines.next_line();
    let mut parser = Parser { lines, current };
    let first = parser.current?;
    let root = parser.block(first.indent, 1)?;
    (parser.current.is_none() && !parser.lines.refused).then_some(root)
}

/// Whether `c` may be in a stream this reader takes: YAML's printable
/// characters (the caller checks ASCII first), without the byte-order mark
/// and the line breaks beyond ASCII that libyaml honours (NEL, U+2028,
/// U+2029).
fn printable(c: char) -> bool {
    matches!(c, '\n' | ' '..='~' | '\u{a0}'..='\u{2027}' | '\u{202a}'..='\u{d7ff}' | '\u{e000}'..='\u{fefe}' | '\u{ff00}'..='\u{fffd}' | '\u{10000}'..)
}

/// One line holding content: its indentation and its text from the first
/// non-space character, trailing spaces cut.
#[derive(Debug, Clone, Copy)]
struct Line<'a> {
    indent: usize,
    text: &'a str,
}

/// The lines with content, one at a time, without blank and comment lines
/// and a leading `---`.
struct Lines<'a> {
    /// The text not read yet.
    rest: Option<&'a str>,
    /// Whether a line with content (or a `---`) was read.
    started: bool,
    /// Whether a line this reader does not take (a second `---`, a `...`)
    /// ended the reading early: the parse gives up.
    refused: bool,
}

impl<'a> Lines<'a> {
    fn next_line(&mut self) -> Option<Line<'a>> {
        while let Some(text) = self.rest {
            let (raw, rest) = match text.split_once('\n') {
                Some((raw, rest)) => (raw, Some(rest)),
                None => (text, None),
            };
            self.rest = rest;
            let trimmed = raw.trim_end_matches(' ');
            let content = trimmed.trim_start_matches(' ');
            if content.is_empty() || content.starts_with('#') {
                continue;
            }
            let indent = trimmed.len() - content.len();
            if indent == 0 && (content.starts_with("---") || content.starts_with("...")) {
                if !self.started && content == "---" {
                    self.started = true;
                    continue;
                }
                self.refused = true;
                self.rest = None;
                return None;
            }
            self.started = true;
            return Some(Line {
                indent,
                text: content,
            });
        }
        None
    }
}

struct Parser<'a> {
    lines: Lines<'a>,
    /// The line being looked at (`None`: the end).
    current: Option<Line<'a>>,
}

/// Whether a line is an entry of a block sequence.
fn is_item(text: &str) -> bool {
    text == "-" || text.starts_with("- ")
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<Line<'a>> {
        self.current
    }

    /// Moves on to the next line.
    fn advance(&mut self) {
        self.current = self.lines.next_line();
    }

    /// The mapping or sequence whose first line (the current one) is
    /// indented by `indent`.
    fn block(&mut self, indent: usize, depth: usize) -> Option<Value> {
        let line = self.peek()?;
        if is_item(line.text) {
            self.sequence(indent, depth)
        } else {
            self.mapping(indent, None, depth)
        }
    }

    /// A block mapping whose keys are indented by `indent`; `first` is its
    /// first entry when it began on a sequence entry's line (`- name: x`).
    fn mapping(&mut self, indent: usize, first: Option<&'a str>, depth: usize) -> Option<Value> {
        if depth > MAX_DEPTH {
            return None;
        }
        let mut map = Map::new();
        if let Some(text) = first {
            self.entry(text, indent, depth, &mut map)?;
        }
        while let Some(line) = self.peek() {
            if line.indent < indent {
                break;
            }
            if line.indent > indent || is_item(line.text) {
                return None;
            }
            self.advance();
            self.entry(line.text, indent, depth, &mut map)?;
        }
        Some(Value::Object(map))
    }

    /// One `key: value` line of a mapping indented by `indent`, with the
    /// lines of its value.
    fn entry(
        &mut self,
        text: &'a str,
        indent: usize,
        depth: usize,
        map: &mut Map<String, Value>,
    ) -> Option<()> {
        let Start::Key(key, rest) = split_key(text) else {
            return None;
        };
        let value = self.value(rest, indent, true, depth)?;
        match map.insert(key, value) {
            None => Some(()),
            Some(_) => None,
        }
    }

    /// A block sequence whose dashes are indented by `indent`.
    fn sequence(&mut self, indent: usize, depth: usize) -> Option<Value> {
        if depth > MAX_DEPTH {
            return None;
        }
        let mut items = Vec::new();
        while let Some(line) = self.peek() {
            if line.indent < indent || (line.indent == indent && !is_item(line.text)) {
                break;
            }
            if line.indent > indent {
                return None;
            }
            self.advance();
            let rest = line.text[1..].trim_start_matches(' ');
            if is_item(rest) {
                return None;
            }
            let item = match split_key(rest) {
                Start::GiveUp => return None,
                Start::Key(..) => {
                    let column = indent + (line.text.len() - rest.len());
                    self.mapping(column, Some(rest), depth + 1)?
                }
                Start::Value => self.value(rest, indent, false, depth)?,
            };
            items.push(item);
        }
        Some(Value::Array(items))
    }

    /// The value after a key or a dash on a line indented by `indent`:
    /// `rest` when the line has one (a more-indented line after it, which
    /// would continue a multi-line scalar, is refused by the mapping or
    /// sequence that reads on), else the block on the lines below (more
    /// indented, or a sequence at the key's own indentation when
    /// `same_indent_sequence`), else null.
    fn value(
        &mut self,
        rest: &'a str,
        indent: usize,
        same_indent_sequence: bool,
        depth: usize,
    ) -> Option<Value> {
        if !rest.is_empty() {
            return inline(rest);
        }
        match self.peek() {
            Some(l) if l.indent > indent => self.block(l.indent, depth + 1),
            Some(l) if l.indent == indent && same_indent_sequence && is_item(l.text) => {
                self.sequence(indent, depth + 1)
            }
            _ => Some(Value::Null),
        }
    }
}

/// What a line's text (after any dash) starts with.
enum Start<'a> {
    /// `key:` then the rest of the line (possibly empty).
    Key(String, &'a str),
    /// No `key:`: a scalar or a flow collection.
    Value,
    /// Something this reader does not take.
    GiveUp,
}

/// Splits `key: rest`. A key is a quoted scalar, or a plain one of
/// letters, digits and `_ - . /` that starts with a letter, a digit or `_`
/// and is not a null or boolean word. A text that starts with anything
/// else is no key (a flow collection, a scalar or an error: the caller's
/// to tell).
fn split_key(text: &str) -> Start<'_> {
    let start = text.bytes().next();
    if !start.is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'"' || b == b'\'') {
        return Start::Value;
    }
    if let Some(q) = start.filter(|b| *b == b'"' || *b == b'\'') {
        let Some((key, after)) = quoted(text, q) else {
            return Start::GiveUp;
        };
        return match after.strip_prefix(':') {
            Some(rest) if rest.is_empty() => Start::Key(key, rest),
            Some(rest) if rest.starts_with(' ') => Start::Key(key, rest.trim_start_matches(' ')),
            Some(_) => Start::GiveUp,
            None => Start::Value,
        };
    }
    let colon = text
        .match_indices(':')
        .map(|(i, _)| i)
        .find(|&i| matches!(text.as_bytes().get(i + 1), None | Some(b' ')));
    let Some(i) = colon else {
        return Start::Value;
    };
    let key = &text[..i];
    let good_bytes = key
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'/'));
    if !good_bytes || special_word(key).is_some() {
        return Start::GiveUp;
    }
    Start::Key(key.to_string(), text[i + 1..].trim_start_matches(' '))
}

/// A value written on the key's (or dash's) line: a scalar or a flat flow
/// collection, then at most a comment.
fn inline(text: &str) -> Option<Value> {
    match text.as_bytes()[0] {
        b'{' => {
            let (v, after) = flow_mapping(text)?;
            end_of_line(after).then_some(v)
        }
        b'[' => {
            let (v, after) = flow_sequence(text)?;
            end_of_line(after).then_some(v)
        }
        q @ (b'"' | b'\'') => {
            let (s, after) = quoted(text, q)?;
            end_of_line(after).then_some(Value::String(s))
        }
        _ => {
            let end = text.find(" #").unwrap_or(text.len());
            let s = text[..end].trim_end_matches(' ');
            if s.contains(": ") || s.ends_with(':') {
                return None;
            }
            plain(s)
        }
    }
}

/// Whether only spaces and a comment are left on the line.
fn end_of_line(after: &str) -> bool {
    let trimmed = after.trim_start_matches(' ');
    trimmed.is_empty() || (trimmed.len() < after.len() && trimmed.starts_with('#'))
}

/// `{key: scalar, ...}` with no nested collection, and the text after it.
fn flow_mapping(text: &str) -> Option<(Value, &str)> {
    let mut map = Map::new();
    let mut rest = text[1..].trim_start_matches(' ');
    loop {
        if let Some(after) = rest.strip_prefix('}') {
            return Some((Value::Object(map), after));
        }
        let (key, after) = match rest.as_bytes().first()? {
            q @ (b'"' | b'\'') => quoted(rest, *q)?,
            _ => {
                let i = rest.find(':')?;
                match split_key(&rest[..=i]) {
                    Start::Key(k, _) => (k, &rest[i..]),
                    _ => return None,
                }
            }
        };
        let after = after.strip_prefix(": ")?.trim_start_matches(' ');
        let (value, after) = flow_scalar(after)?;
        if map.insert(key, value).is_some() {
            return None;
        }
        rest = flow_separator(after)?;
    }
}

/// `[scalar, ...]` with no nested collection, and the text after it.
fn flow_sequence(text: &str) -> Option<(Value, &str)> {
    let mut items = Vec::new();
    let mut rest = text[1..].trim_start_matches(' ');
    loop {
        if let Some(after) = rest.strip_prefix(']') {
            return Some((Value::Array(items), after));
        }
        let (value, after) = flow_scalar(rest)?;
        items.push(value);
        rest = flow_separator(after)?;
    }
}

/// After a flow entry: `, ` (then the next entry or the end) or the end
/// bracket, left for the caller.
fn flow_separator(after: &str) -> Option<&str> {
    let after = after.trim_start_matches(' ');
    if let Some(next) = after.strip_prefix(',') {
        let next = next.trim_start_matches(' ');
        // `{a: b, }` is valid YAML, but `{a: b,, }` is not: take neither.
        return (!next.starts_with(['}', ']', ','])).then_some(next);
    }
    after.starts_with(['}', ']']).then_some(after)
}

/// A scalar inside a flow collection, and the text after it.
fn flow_scalar(text: &str) -> Option<(Value, &str)> {
    match text.as_bytes().first()? {
        q @ (b'"' | b'\'') => {
            let (s, after) = quoted(text, *q)?;
            Some((Value::String(s), after))
        }
        _ => {
            let end = text.find([',', '}', ']', '{', '[', '#', ':'])?;
            if !matches!(text.as_bytes()[end], b',' | b'}' | b']') {
                return None;
            }
            let s = text[..end].trim_end_matches(' ');
            Some((plain(s)?, &text[end..]))
        }
    }
}

/// A one-line quoted scalar starting `text` (its quote is `q`) and the
/// text after its closing quote. Double-quoted: the escapes `\" \\ \/ \n
/// \t` only.
fn quoted(text: &str, q: u8) -> Option<(String, &str)> {
    let body = &text[1..];
    let mut out = String::new();
    let mut chars = body.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '\'' if q == b'\'' => {
                if body[i + 1..].starts_with('\'') {
                    chars.next();
                    out.push('\'');
                } else {
                    return Some((out, &body[i + 1..]));
                }
            }
            '"' if q == b'"' => return Some((out, &body[i + 1..])),
            '\\' if q == b'"' => match chars.next()?.1 {
                '"' => out.push('"'),
                '\\' => out.push('\\'),
                '/' => out.push('/'),
                'n' => out.push('\n'),
                't' => out.push('\t'),
                _ => return None,
            },
            c => out.push(c),
        }
    }
    None
}

/// The null and boolean words of YAML 1.2's core schema.
fn special_word(s: &str) -> Option<Value> {
    match s {
        "null" | "Null" | "NULL" | "~" => Some(Value::Null),
        "true" | "True" | "TRUE" => Some(Value::Bool(true)),
        "false" | "False" | "FALSE" => Some(Value::Bool(false)),
        _ => None,
    }
}

/// A plain scalar's value when its type is plain to see: a string that
/// starts with a letter, `/` or `_` (or a digit followed by a letter no
/// number can hold, as `16Mi` or `100m`), a null or boolean word, or a
/// decimal integer of up to 18 digits without a leading zero.
fn plain(s: &str) -> Option<Value> {
    let first = *s.as_bytes().first()?;
    if let Some(v) = special_word(s) {
        return Some(v);
    }
    if first.is_ascii_alphabetic() || first == b'/' || first == b'_' {
        let float_word = ["inf", "infinity", "nan"];
        if float_word.iter().any(|w| s.eq_ignore_ascii_case(w)) {
            return None;
        }
        return Some(Value::String(s.to_string()));
    }
    if !first.is_ascii_digit() {
        return None;
    }
    if s.bytes().all(|b| b.is_ascii_digit()) {
        if (s.len() > 1 && first == b'0') || s.len() > 18 {
            return None;
        }
        return s
            .parse::<u64>()
            .ok()
            .map(|n| Value::Number(Number::from(n)));
    }
    if certainly_not_a_number(s) {
        Some(Value::String(s.to_string()))
    } else {
        None
    }
}

/// Whether a plain scalar that starts with a digit can be no number in any
/// form YAML readers take: decimal, `0x`/`0o`/`0b` with their digits, or a
/// float (`1.5`, `1e3`, `1.5E-3`). `:`, `,` and `_` give up too (numbers
/// in YAML 1.1's forms).
fn certainly_not_a_number(s: &str) -> bool {
    let b = s.as_bytes();
    if b.iter().any(|c| b":,_".contains(c)) {
        return false;
    }
    let radix_digits: Option<fn(&u8) -> bool> = match b.get(..2) {
        Some(b"0x" | b"0X") => Some(u8::is_ascii_hexdigit),
        Some(b"0o" | b"0O") => Some(|c| (b'0'..=b'7').contains(c)),
        Some(b"0b" | b"0B") => Some(|c| *c == b'0' || *c == b'1'),
        _ => None,
    };
    if let Some(digit) = radix_digits {
        return !b[2..].iter().all(digit);
    }
    let stray_letter = b
        .iter()
        .any(|c| c.is_ascii_alphabetic() && !matches!(c, b'e' | b'E'));
    let stray_sign = b
        .iter()
        .enumerate()
        .any(|(i, c)| matches!(c, b'+' | b'-') && i > 0 && !matches!(b[i - 1], b'e' | b'E'));
    stray_letter
        || stray_sign
        || !b
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || b".+-".contains(c))
}

#[cfg(test)]
mod tests;
