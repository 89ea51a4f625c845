//! Subscription patterns: `*` is exactly one path segment, `**` zero or more, anything else a
//! literal segment. Leading and trailing `/` are ignored, as are empty segments.

/// The pattern's segments, normalized (what is stored and compared).
pub fn normalize(pattern: &str) -> String {
    segments(pattern).collect::<Vec<_>>().join("/")
}

fn segments(p: &str) -> impl Iterator<Item = &str> {
    p.split('/').filter(|s| !s.is_empty())
}

/// Whether `path` matches `pattern`.
pub fn matches(pattern: &str, path: &str) -> bool {
    let pattern: Vec<&str> = segments(pattern).collect();
    let path: Vec<&str> = segments(path).collect();
    match_from(&pattern, &path)
}

fn match_from(pattern: &[&str], path: &[&str]) -> bool {
    match pattern.split_first() {
        None => path.is_empty(),
        // `**` takes zero or more segments: try every split (patterns are short).
        Some((&"**", rest)) => (0..=path.len()).any(|i| match_from(rest, &path[i..])),
        Some((&seg, rest)) => match path.split_first() {
            Some((&p, path_rest)) => (seg == "*" || seg == p) && match_from(rest, path_rest),
            None => false,
        },
    }
}

/// The longest path prefix every match shares (its literal leading segments): where a listing
/// of candidate streams can start.
pub fn literal_prefix(pattern: &str) -> String {
    let mut out = String::new();
    for seg in segments(pattern) {
        if seg == "*" || seg == "**" {
            return out;
        }
        out.push_str(seg);
        out.push('/');
    }
    // A pattern without wildcards matches exactly one path.
    out.pop();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_pattern_table() {
        let cases = [
            ("events/*", "events/a", true),
            ("events/*", "events/a/b", false),
            ("events/*", "events", false),
            ("/events/*/", "events/a", true),
            ("events/**", "events", true),
            ("events/**", "events/a/b/c", true),
            ("**", "anything/at/all", true),
            ("a/**/z", "a/z", true),
            ("a/**/z", "a/b/c/z", true),
            ("a/**/z", "a/b/c/y", false),
            ("a/*/c", "a/b/c", true),
            ("a/*/c", "a/b/d", false),
            ("exact/path", "exact/path", true),
            ("exact/path", "exact/pathx", false),
            ("ev*", "events", false),
        ];
        for (pattern, path, want) in cases {
            assert_eq!(matches(pattern, path), want, "{pattern} ~ {path}");
        }
    }

    #[test]
    fn literal_prefixes() {
        assert_eq!(literal_prefix("events/*"), "events/");
        assert_eq!(literal_prefix("/a/b/**"), "a/b/");
        assert_eq!(literal_prefix("**"), "");
        assert_eq!(literal_prefix("exact/path"), "exact/path");
    }

    /// A second, independent model: the pattern as a regular expression over the path string.
    fn regex_model(pattern: &str, path: &str) -> bool {
        fn go(p: &[u8], s: &[u8]) -> bool {
            // Tokens: "**/" (zero or more whole segments), "*" (one segment), literal bytes.
            if p.is_empty() {
                return s.is_empty();
            }
            if p.starts_with(b"**/") {
                let mut i = 0;
                loop {
                    if go(&p[3..], &s[i..]) {
                        return true;
                    }
                    match s[i..].iter().position(|&b| b == b'/') {
                        Some(j) => i += j + 1,
                        None => return false,
                    }
                }
            }
            if p == b"**" {
                return true;
            }
            if p[0] == b'*' {
                let end = s.iter().position(|&b| b == b'/').unwrap_or(s.len());
                return end > 0 && go(&p[1..], &s[end..]);
            }
            !s.is_empty() && s[0] == p[0] && go(&p[1..], &s[1..])
        }
        let p = normalize(pattern);
        let s = normalize(path);
        // "a/**" also matches "a" itself: the model writes that case out.
        let mut head = p.as_str();
        while let Some(h) = head.strip_suffix("/**") {
            if go(h.as_bytes(), s.as_bytes()) {
                return true;
            }
            head = h;
        }
        go(p.as_bytes(), s.as_bytes())
    }

    proptest! {
        #[test]
        fn matching_agrees_with_a_regex_model(
            pattern in proptest::collection::vec(prop_oneof![Just("*"), Just("**"), Just("a"), Just("b")], 1..5),
            path in proptest::collection::vec(prop_oneof![Just("a"), Just("b"), Just("c")], 0..6),
        ) {
            let pattern = pattern.join("/");
            let path = path.join("/");
            prop_assert_eq!(matches(&pattern, &path), regex_model(&pattern, &path), "{} ~ {}", pattern, path);
        }
    }
}
