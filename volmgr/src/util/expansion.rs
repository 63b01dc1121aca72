//! `$(VAR)` references, as Kubernetes expands them in a container's `env`
//! values, `command`, `args` and `subPathExpr`
//! (`third_party/forked/golang/expansion/expand.go`): `$(NAME)` is replaced
//! by the mapping's answer, `$$` is one `$`, and anything else (a `$`
//! not followed by `(` or `$`, an unclosed `$(`) is kept as written.

const OPERATOR: u8 = b'$';
const OPENER: u8 = b'(';
const CLOSER: u8 = b')';

/// Expands every `$(NAME)` in `input` with `mapping` (see the module doc).
pub fn expand(input: &str, mut mapping: impl FnMut(&str) -> String) -> String {
    let bytes = input.as_bytes();
    let mut out = String::with_capacity(input.len());
    let mut checkpoint = 0;
    let mut cursor = 0;
    while cursor < bytes.len() {
        if bytes[cursor] == OPERATOR && cursor + 1 < bytes.len() {
            out.push_str(&input[checkpoint..cursor]);
            let rest = &input[cursor + 1..];
            let advance = match rest.as_bytes()[0] {
                OPERATOR => {
                    out.push('$');
                    1
                }
                OPENER => match rest.bytes().position(|b| b == CLOSER) {
                    Some(end) => {
                        out.push_str(&mapping(&rest[1..end]));
                        end + 1
                    }
                    None => {
                        out.push_str("$(");
                        1
                    }
                },
                // A `$` that starts nothing: kept, with what follows it.
                _ => {
                    let next = rest.chars().next().map_or(1, char::len_utf8);
                    out.push('$');
                    out.push_str(&rest[..next]);
                    next
                }
            };
            cursor += advance;
            checkpoint = cursor + 1;
        }
        cursor += 1;
    }
    out.push_str(&input[checkpoint.min(input.len())..]);
    out
}

/// The mapping of `MappingFuncFor`: a name's value from the first of
/// `contexts` that has it; an unknown name stays `$(NAME)`.
pub fn mapping_for<'a>(
    contexts: &'a [&'a std::collections::HashMap<String, String>],
) -> impl FnMut(&str) -> String + 'a {
    move |name| {
        contexts
            .iter()
            .find_map(|c| c.get(name).cloned())
            .unwrap_or_else(|| format!("$({name})"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Cases from Kubernetes' `expand_test.go`.
    #[test]
    fn expands_as_kubernetes_does() {
        let env: HashMap<String, String> = [
            ("VAR_A", "A"),
            ("VAR_B", "B"),
            ("VAR_C", "C"),
            ("VAR_REF", "$(VAR_A)"),
            ("VAR_EMPTY", ""),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let ctx = [&env];
        let cases = [
            ("$(VAR_A)", "A"),
            ("___$(VAR_B)___", "___B___"),
            ("$(VAR_A)-$(VAR_A)", "A-A"),
            ("$(VAR_A)$(VAR_B)$(VAR_C)", "ABC"),
            ("$(VAR_REF)", "$(VAR_A)"),
            ("$(VAR_EMPTY)", ""),
            ("$(UNKNOWN)", "$(UNKNOWN)"),
            ("$$(VAR_A)", "$(VAR_A)"),
            ("$$$(VAR_A)", "$A"),
            ("$$$$(VAR_A)", "$$(VAR_A)"),
            ("$$", "$"),
            ("$", "$"),
            ("$(VAR_A", "$(VAR_A"),
            ("$(", "$("),
            ("$()", "$()"),
            ("$VAR_A", "$VAR_A"),
            ("foo$", "foo$"),
            ("$(VAR_A)$", "A$"),
            ("$(VAR_A)$(", "A$("),
            ("ü$(VAR_A)$ü", "üA$ü"),
        ];
        for (input, want) in cases {
            assert_eq!(expand(input, mapping_for(&ctx)), want, "{input}");
        }
    }
}
