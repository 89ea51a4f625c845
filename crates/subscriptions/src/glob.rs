//! Subscription patterns: `*` is exactly one path segment, `**` zero or more, anything else a
//! literal segment. Leading and trailing `/` are ignored, as are empty segments, and a run of
//! `**` is one `**` (they match the same paths).
//!
//! Matching costs O(path segments × pattern segments) whatever the pattern: it walks the path
//! once, keeping the set of pattern positions still alive (a pattern is a tiny automaton). A
//! pattern is also bounded ([`check`]): at most [`MAX_PATTERN_BYTES`] bytes, [`MAX_SEGMENTS`]
//! segments and [`MAX_DOUBLE_STARS`] `**`.

/// Longest pattern accepted, in bytes (as received).
pub const MAX_PATTERN_BYTES: usize = 1024;
/// Most segments in a pattern (after normalizing).
pub const MAX_SEGMENTS: usize = 64;
/// Most `**` segments in a pattern (after normalizing).
pub const MAX_DOUBLE_STARS: usize = 4;

/// Why a pattern was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    #[error("a pattern may be at most 1024 bytes long")]
    TooLong,
    #[error("a pattern may have at most 64 segments")]
    TooManySegments,
    #[error("a pattern may have at most 4 '**' segments")]
    TooManyDoubleStars,
}

/// The pattern's segments, normalized (what is stored and compared).
pub fn normalize(pattern: &str) -> String {
    segments(pattern).collect::<Vec<_>>().join("/")
}

/// Checks a pattern as received against the limits, and normalizes it.
pub fn check(pattern: &str) -> Result<String, PatternError> {
    if pattern.len() > MAX_PATTERN_BYTES {
        return Err(PatternError::TooLong);
    }
    let segs: Vec<&str> = segments(pattern).collect();
    if segs.len() > MAX_SEGMENTS {
        return Err(PatternError::TooManySegments);
    }
    if segs.iter().filter(|s| **s == "**").count() > MAX_DOUBLE_STARS {
        return Err(PatternError::TooManyDoubleStars);
    }
    Ok(segs.join("/"))
}

/// Non-empty segments, with each run of `**` folded into one.
fn segments(p: &str) -> impl Iterator<Item = &str> {
    let mut last_double = false;
    p.split('/').filter(|s| !s.is_empty()).filter(move |s| {
        let double = *s == "**";
        let keep = !(double && last_double);
        last_double = double;
        keep
    })
}

/// Whether `path` matches `pattern`.
pub fn matches(pattern: &str, path: &str) -> bool {
    let pattern: Vec<&str> = segments(pattern).collect();
    if pattern.len() < 128 {
        matches_bits(&pattern, path)
    } else {
        matches_wide(&pattern, path)
    }
}

/// The automaton with its set of live positions in one `u128` (patterns of at most 127
/// segments: every pattern [`check`] accepts): a path segment costs a few bit operations plus
/// one string comparison per live literal position, and nothing is allocated per segment.
/// Matching runs for every write a subscription may be woken by, and for every new stream a
/// pattern's listing shows: deep paths made the general form below cost ~0.7 ms a match.
fn matches_bits(pattern: &[&str], path: &str) -> bool {
    let (mut double, mut single, mut literal) = (0u128, 0u128, 0u128);
    for (i, p) in pattern.iter().enumerate() {
        match *p {
            "**" => double |= 1 << i,
            "*" => single |= 1 << i,
            _ => literal |= 1 << i,
        }
    }
    // A `**` may also take no segment: wherever it is alive, the position after it is too
    // (repeated, so that an unfolded run of `**` is covered as well).
    let close = |mut alive: u128| loop {
        let more = alive | ((alive & double) << 1);
        if more == alive {
            return alive;
        }
        alive = more;
    };
    let mut alive = close(1);
    for seg in path.split('/').filter(|s| !s.is_empty()) {
        // `**` takes this segment and stays; `*` takes it and moves on.
        let mut next = (alive & double) | ((alive & single) << 1);
        let mut lits = alive & literal;
        while lits != 0 {
            let i = lits.trailing_zeros() as usize;
            if pattern[i] == seg {
                next |= 1 << (i + 1);
            }
            lits &= lits - 1;
        }
        alive = close(next);
        if alive == 0 {
            return false;
        }
    }
    alive & (1 << pattern.len()) != 0
}

/// The same automaton for any number of segments (a pattern stored before the limits existed).
fn matches_wide(pattern: &[&str], path: &str) -> bool {
    // `alive[i]`: the path read so far can be matched by `pattern[..i]`.
    let mut alive = vec![false; pattern.len() + 1];
    let mut next = alive.clone();
    alive[0] = true;
    close_over_double_stars(pattern, &mut alive);
    for seg in path.split('/').filter(|s| !s.is_empty()) {
        next.fill(false);
        for (i, p) in pattern.iter().enumerate() {
            if !alive[i] {
                continue;
            }
            match *p {
                // `**` takes this segment and stays.
                "**" => next[i] = true,
                "*" => next[i + 1] = true,
                lit if lit == seg => next[i + 1] = true,
                _ => {}
            }
        }
        close_over_double_stars(pattern, &mut next);
        std::mem::swap(&mut alive, &mut next);
        if !alive.contains(&true) {
            return false;
        }
    }
    alive[pattern.len()]
}

/// A `**` may also take no segment: wherever it is alive, the position after it is too.
fn close_over_double_stars(pattern: &[&str], alive: &mut [bool]) {
    for (i, p) in pattern.iter().enumerate() {
        if alive[i] && *p == "**" {
            alive[i + 1] = true;
        }
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
    fn runs_of_double_stars_are_one() {
        assert_eq!(normalize("e/**/**/**/**/b"), "e/**/b");
        assert_eq!(normalize("**/**"), "**");
        assert_eq!(normalize("a/**/*/**/b"), "a/**/*/**/b");
    }

    #[test]
    fn patterns_beyond_the_limits_are_refused() {
        assert_eq!(check("/a/**/b/"), Ok("a/**/b".to_owned()));
        assert_eq!(check(&"a".repeat(MAX_PATTERN_BYTES + 1)), Err(PatternError::TooLong));
        assert_eq!(check(&vec!["x"; MAX_SEGMENTS + 1].join("/")), Err(PatternError::TooManySegments));
        assert!(check(&vec!["x"; MAX_SEGMENTS].join("/")).is_ok());
        assert_eq!(check("**/a/**/b/**/c/**/d/**"), Err(PatternError::TooManyDoubleStars));
        // A run counts once.
        assert!(check("**/**/a/**/b/**/c/**").is_ok());
    }

    /// The defect this matcher replaced: `**` tried every split, so each extra `**` multiplied
    /// the work by the path's depth (`e/**/**/**/**/b` over a path 300 segments deep ran for
    /// minutes). The automaton finishes these in microseconds; the bound below is only there so
    /// that a regression fails instead of hanging the test run.
    #[test]
    fn adversarial_patterns_over_deep_paths_finish() {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let deep = format!("e/{}c", "x/".repeat(300));
            let deep_b = format!("e/{}b", "x/".repeat(300));
            // Not folded: a pattern stored before the limits existed reaches the matcher as is.
            let answers: Vec<bool> = ["e/**/**/**/**/b", "e/**/x/**/x/**/x/**/b", "**/*/**/*/**/*/**/b"]
                .iter()
                .flat_map(|p| [matches(p, &deep), matches(p, &deep_b)])
                .collect();
            let _ = tx.send(answers);
        });
        let answers = rx.recv_timeout(std::time::Duration::from_secs(20)).expect("matching did not finish in 20 s");
        assert_eq!(answers, [false, true, false, true, false, true]);
    }

    /// Both forms of the automaton at the seam between them: 127 segments fit one `u128`, 128
    /// take the general form.
    #[test]
    fn long_patterns_match_on_either_side_of_the_bitset() {
        for n in [126, 127, 128, 130] {
            let pattern = format!("{}/*", vec!["x"; n - 1].join("/"));
            let hit = vec!["x"; n].join("/");
            let miss = vec!["x"; n + 1].join("/");
            assert!(matches(&pattern, &hit) && !matches(&pattern, &miss), "{n} segments");
            let stars = format!("**/{}", vec!["x"; n - 1].join("/"));
            assert!(matches(&stars, &miss) && !matches(&stars, &vec!["x"; n - 2].join("/")), "{n} segments with **");
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
            pattern in proptest::collection::vec(prop_oneof![Just("*"), Just("**"), Just("a"), Just("b")], 1..7),
            path in proptest::collection::vec(prop_oneof![Just("a"), Just("b"), Just("c")], 0..6),
        ) {
            let pattern = pattern.join("/");
            let path = path.join("/");
            prop_assert_eq!(matches(&pattern, &path), regex_model(&pattern, &path), "{} ~ {}", pattern, path);
            let segs: Vec<&str> = segments(&pattern).collect();
            prop_assert_eq!(matches_bits(&segs, &path), matches_wide(&segs, &path), "{} ~ {}", pattern, path);
        }
    }
}
