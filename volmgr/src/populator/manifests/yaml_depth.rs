//! A cheap guard run before a YAML manifest is parsed: how deeply its
//! collections nest, measured with libyaml's own scanner (the very tokens
//! the parser will see, so no quoting or block-scalar subtlety can hide a
//! level from it) and stopped at the first token past [`MAX_DEPTH`].
//!
//! Why: libyaml's scanner does work per token proportional to the number
//! of open flow collections, so a document of nested flow mappings is
//! quadratic — a 500 KB file of `{a: {a: …}}` 100,000 levels deep took
//! 71 s of CPU — and serde_norway's own recursion limit (128) applies only
//! after the whole document was scanned and parsed into events. Stopping
//! at depth [`MAX_DEPTH`] bounds the scan to O(`MAX_DEPTH` × tokens), and
//! the parse that follows never sees a deeper document.

use std::mem::MaybeUninit;

use unsafe_libyaml_norway as unsafe_yaml;
use unsafe_yaml::yaml_token_type_t as T;

/// The deepest nesting of collections (block and flow mappings and
/// sequences together) a manifest may have. Pod manifests nest about ten
/// levels deep, lists of them a few more.
pub const MAX_DEPTH: usize = 64;

/// Where a YAML stream first nests deeper than [`MAX_DEPTH`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooDeep {
    /// Line of the collection that went past the limit (1-based).
    pub line: u64,
    /// Its column (1-based).
    pub column: u64,
    /// Byte offset where the document holding it starts (its `---`, or 0):
    /// the documents before it may be parsed.
    pub document_start: usize,
}

impl std::fmt::Display for TooDeep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "collections nested deeper than {MAX_DEPTH} levels (line {}, column {})",
            self.line, self.column
        )
    }
}

/// A libyaml scanner on a string, deleted on drop.
struct Scanner {
    /// Boxed: libyaml keeps pointers into the parser (its read handler's
    /// data), so it must not move once the input is set.
    parser: Box<MaybeUninit<unsafe_yaml::yaml_parser_t>>,
}

impl Scanner {
    /// A scanner reading `text`, which must outlive it (the lifetime is
    /// tied by [`check`], which owns both).
    fn new(text: &str) -> Option<Self> {
        let mut parser = Box::new(MaybeUninit::<unsafe_yaml::yaml_parser_t>::uninit());
        let p = parser.as_mut_ptr();
        // SAFETY: `p` points to writable memory for a parser; initialize
        // fills it (or fails on allocation, leaving nothing to delete).
        if unsafe { unsafe_yaml::yaml_parser_initialize(p) }.fail {
            return None;
        }
        // SAFETY: the parser was initialized and has no input yet; `text`
        // outlives the scanner (see above) and is not modified.
        unsafe { unsafe_yaml::yaml_parser_set_input_string(p, text.as_ptr(), text.len() as u64) };
        Some(Self { parser })
    }

    /// The next token's type and start, or `None` at the end of the stream
    /// or on a syntax error (the parser that follows reports it).
    fn next(&mut self) -> Option<(T, unsafe_yaml::yaml_mark_t)> {
        let mut token = MaybeUninit::<unsafe_yaml::yaml_token_t>::uninit();
        let t = token.as_mut_ptr();
        // SAFETY: the parser is initialized with its input; `t` points to
        // writable memory for one token, which scan zeroes then fills.
        if unsafe { unsafe_yaml::yaml_parser_scan(self.parser.as_mut_ptr(), t) }.fail {
            return None;
        }
        // SAFETY: scan succeeded: the token is initialized; it is read once
        // and then deleted (freeing its scalar or tag data).
        let (kind, mark) = unsafe { ((*t).type_, (*t).start_mark) };
        // SAFETY: as above; the token is not used after this.
        unsafe { unsafe_yaml::yaml_token_delete(t) };
        match kind {
            T::YAML_NO_TOKEN | T::YAML_STREAM_END_TOKEN => None,
            k => Some((k, mark)),
        }
    }
}

impl Drop for Scanner {
    fn drop(&mut self) {
        // SAFETY: the parser was initialized in `new` and is deleted once.
        unsafe { unsafe_yaml::yaml_parser_delete(self.parser.as_mut_ptr()) };
    }
}

/// An upper bound on the depth any document of `text` can reach: every
/// collection the scanner opens needs one of these bytes (a block mapping
/// its `:` or `?`, a block sequence its `-`, a flow collection its bracket),
/// so with no more of them than [`MAX_DEPTH`] the scan is not needed —
/// the case of most single-pod manifests, whose YAML parse it would
/// otherwise make about a third dearer.
fn indicators(text: &str) -> usize {
    text.bytes()
        .filter(|b| matches!(b, b'[' | b'{' | b'-' | b':' | b'?'))
        .count()
}

/// Checks that no document of `text` nests collections deeper than
/// [`MAX_DEPTH`]; stops at the first token past it. Syntax errors are not
/// reported here (the parser reports them, having then done no more work
/// than this scan).
pub fn check(text: &str) -> Result<(), TooDeep> {
    if indicators(text) <= MAX_DEPTH {
        return Ok(());
    }
    let Some(mut scanner) = Scanner::new(text) else {
        return Ok(());
    };
    let mut depth = 0usize;
    let mut document_start = 0usize;
    while let Some((kind, mark)) = scanner.next() {
        match kind {
            T::YAML_DOCUMENT_START_TOKEN => {
                document_start = usize::try_from(mark.index).unwrap_or(usize::MAX);
                depth = 0;
            }
            T::YAML_BLOCK_SEQUENCE_START_TOKEN
            | T::YAML_BLOCK_MAPPING_START_TOKEN
            | T::YAML_FLOW_SEQUENCE_START_TOKEN
            | T::YAML_FLOW_MAPPING_START_TOKEN => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return Err(TooDeep {
                        line: mark.line + 1,
                        column: mark.column + 1,
                        document_start,
                    });
                }
            }
            T::YAML_BLOCK_END_TOKEN
            | T::YAML_FLOW_SEQUENCE_END_TOKEN
            | T::YAML_FLOW_MAPPING_END_TOKEN => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nested_flow(levels: usize) -> String {
        format!("{}x{}", "{a: ".repeat(levels), "}".repeat(levels))
    }

    #[test]
    fn measures_flow_and_block_nesting() {
        assert_eq!(check(&nested_flow(MAX_DEPTH)), Ok(()));
        let e = check(&nested_flow(MAX_DEPTH + 1)).unwrap_err();
        assert_eq!((e.line, e.column, e.document_start), (1, 4 * 64 + 1, 0));
        // Block levels count too (one per indentation step).
        let block: String = (0..=MAX_DEPTH)
            .map(|i| format!("{}a:\n", " ".repeat(i)))
            .collect::<String>()
            + &" ".repeat(MAX_DEPTH + 1)
            + "x\n";
        assert!(check(&block).is_err());
        // Brackets inside scalars are not collections.
        let quoted = format!(
            "a: \"{}\"\nb: '{}'\nc: |\n  {}\nd: x{}\n",
            "{".repeat(500),
            "[".repeat(500),
            "{".repeat(500),
            "{[".repeat(500)
        );
        assert_eq!(check(&quoted), Ok(()));
    }

    /// The shortcut's bound holds at its edge: the deepest documents with
    /// at most MAX_DEPTH indicator bytes, in each style, are within the
    /// limit, and one more level (one more byte) goes through the scan.
    #[test]
    fn the_indicator_bound_is_never_below_the_depth() {
        let flow = "[".repeat(MAX_DEPTH) + &"]".repeat(MAX_DEPTH);
        let block_seq: String = (0..MAX_DEPTH)
            .map(|i| format!("{}- \n", " ".repeat(2 * i)))
            .collect();
        let block_map: String = (0..MAX_DEPTH)
            .map(|i| format!("{}a:\n", " ".repeat(i)))
            .collect();
        for text in [&flow, &block_seq, &block_map] {
            assert_eq!(indicators(text), MAX_DEPTH);
            assert_eq!(check(text), Ok(()));
        }
        let deeper = "[".repeat(MAX_DEPTH + 1) + &"]".repeat(MAX_DEPTH + 1);
        assert!(check(&deeper).is_err());
        let pod =
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  containers:\n  - name: c\n";
        assert!(indicators(pod) <= MAX_DEPTH, "a small pod skips the scan");
    }

    #[test]
    fn reports_the_document_that_goes_too_deep() {
        let text = format!("a: 1\n---\nb: 2\n---\n{}\n", nested_flow(100_000));
        let e = check(&text).unwrap_err();
        assert_eq!(&text[e.document_start..e.document_start + 3], "---");
        assert_eq!(e.line, 5);
        assert_eq!(&text[..e.document_start], "a: 1\n---\nb: 2\n");
    }
}
