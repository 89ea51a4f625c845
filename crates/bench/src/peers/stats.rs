//! What a run collects (one value per round for each scenario, metric and server, plus remarks)
//! and how the table shows it: medians, numbers rounded for reading, Oncelog/Electric ratios.

use std::collections::BTreeMap;

use super::options::{Scenario, Server};

/// The values recorded, as the generators printed them (the "All rounds" list shows them so),
/// and the remarks printed under the table.
#[derive(Default, Debug)]
pub struct Results {
    values: BTreeMap<(Scenario, &'static str, Server), Vec<String>>,
    notes: BTreeMap<(Scenario, Server), Vec<String>>,
}

impl Results {
    /// Adds one round's value; an absent, empty or `null` value is not recorded.
    pub fn record(&mut self, scenario: Scenario, metric: &'static str, server: Server, value: Option<&str>) {
        let Some(value) = value.map(str::trim).filter(|v| !v.is_empty() && *v != "null") else {
            return;
        };
        self.values.entry((scenario, metric, server)).or_default().push(value.to_string());
    }

    pub fn note(&mut self, scenario: Scenario, server: Server, text: String) {
        self.notes.entry((scenario, server)).or_default().push(text);
    }

    /// Every recorded value of one cell, in round order.
    pub fn values(&self, scenario: Scenario, metric: &'static str, server: Server) -> &[String] {
        self.values.get(&(scenario, metric, server)).map_or(&[], Vec::as_slice)
    }

    /// The median of one cell, as the table uses it (see [`as_awk_prints`]).
    pub fn median(&self, scenario: Scenario, metric: &'static str, server: Server) -> Option<f64> {
        let numbers: Vec<f64> =
            self.values(scenario, metric, server).iter().filter_map(|v| v.parse::<f64>().ok()).collect();
        median(&numbers).map(as_awk_prints)
    }

    /// The remarks, as "scenario|server" keys sorted as text (as `sort` did), each with its
    /// remarks joined by "; ".
    pub fn notes(&self) -> Vec<(Scenario, Server, String)> {
        let mut out: Vec<(String, Scenario, Server, String)> = self
            .notes
            .iter()
            .map(|((sc, s), texts)| (format!("{}|{}", sc.name(), s.name()), *sc, *s, texts.join("; ")))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out.into_iter().map(|(_, sc, s, text)| (sc, s, text)).collect()
    }
}

/// The median: the middle value of an odd count, the mean of the two middle ones of an even
/// count, none of none.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| !v.is_nan()).collect();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(sorted[n / 2]),
        _ => Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2.0),
    }
}

/// A number as awk's `print` wrote it for the next step to read: whole numbers exactly, others
/// to 6 significant digits (`%.6g`).
pub fn as_awk_prints(v: f64) -> f64 {
    if !v.is_finite() || v.fract() == 0.0 {
        return v;
    }
    format!("{v:.5e}").parse().unwrap_or(v)
}

/// A table cell: whole numbers below 100 as they are, 100 and above rounded with thousands
/// separators, 10 to 100 with one decimal, below 10 with two.
pub fn fmt_value(v: f64) -> String {
    let a = v.abs();
    if a < 100.0 && v.fract() == 0.0 {
        return format!("{v:.0}");
    }
    if a >= 100.0 {
        return thousands(&format!("{v:.0}"));
    }
    if a >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn thousands(digits: &str) -> String {
    let n = digits.len();
    let mut out = String::with_capacity(n + n / 3);
    for (i, c) in digits.chars().enumerate() {
        out.push(c);
        let rest = n - i - 1;
        if rest > 0 && rest.is_multiple_of(3) && c != '-' {
            out.push(',');
        }
    }
    out
}

/// Oncelog / Electric of the medians, two decimals; "—" if either is missing or Electric's is 0.
pub fn ratio(oncelog: Option<f64>, electric: Option<f64>) -> String {
    match (oncelog, electric) {
        (Some(o), Some(e)) if e != 0.0 => format!("{:.2}", o / e),
        _ => "—".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[7.0]), Some(7.0));
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[10.0, 2.0]), Some(6.0));
        // Sorted as numbers, not as text ("10" < "9").
        assert_eq!(median(&[9.0, 10.0, 100.0]), Some(10.0));
        assert_eq!(median(&[-1.0, 5.0, 0.5]), Some(0.5));
    }

    #[test]
    fn medians_of_cells_skip_what_was_not_recorded() {
        let mut r = Results::default();
        // Three rounds for Oncelog; Electric skipped (or without a value) in the second round.
        for (round, (o, e)) in [("10", Some("30")), ("20", None), ("40", Some("31.5"))].into_iter().enumerate() {
            r.record(Scenario::S1, "appends_per_s", Server::Oncelog, Some(o));
            r.record(Scenario::S1, "appends_per_s", Server::Electric, e);
            r.record(Scenario::S1, "p99_ms", Server::Electric, Some(if round == 1 { "null" } else { "" }));
        }
        assert_eq!(r.values(Scenario::S1, "appends_per_s", Server::Oncelog), ["10", "20", "40"]);
        assert_eq!(r.values(Scenario::S1, "appends_per_s", Server::Electric), ["30", "31.5"]);
        assert_eq!(r.median(Scenario::S1, "appends_per_s", Server::Oncelog), Some(20.0));
        assert_eq!(r.median(Scenario::S1, "appends_per_s", Server::Electric), Some(30.75));
        assert_eq!(r.median(Scenario::S1, "p99_ms", Server::Electric), None);
        assert_eq!(r.median(Scenario::S1, "appends_per_s", Server::Node), None);
        assert!(r.values(Scenario::S1, "p99_ms", Server::Electric).is_empty());
    }

    #[test]
    fn medians_are_read_back_as_awk_printed_them() {
        assert_eq!(as_awk_prints(12_345_678.0), 12_345_678.0);
        assert_eq!(as_awk_prints(1_234_567.5), 1_234_570.0);
        assert_eq!(as_awk_prints(99.999_999_9), 100.0);
        assert_eq!(as_awk_prints(0.123_456_78), 0.123_457);
        assert_eq!(fmt_value(as_awk_prints(99.999_999_9)), "100");
    }

    #[test]
    fn cells_are_rounded_for_reading() {
        assert_eq!(fmt_value(0.0), "0");
        assert_eq!(fmt_value(5.0), "5");
        assert_eq!(fmt_value(99.0), "99");
        assert_eq!(fmt_value(5.125), "5.12");
        assert_eq!(fmt_value(0.084), "0.08");
        assert_eq!(fmt_value(17.5), "17.5");
        assert_eq!(fmt_value(99.96), "100.0");
        assert_eq!(fmt_value(100.0), "100");
        assert_eq!(fmt_value(355.4), "355");
        assert_eq!(fmt_value(9188.25), "9,188");
        assert_eq!(fmt_value(19531.2), "19,531");
        assert_eq!(fmt_value(1_000_000.0), "1,000,000");
        assert_eq!(fmt_value(20000.0), "20,000");
        assert_eq!(fmt_value(-1234.0), "-1,234");
        assert_eq!(fmt_value(-123.0), "-123");
        assert_eq!(fmt_value(-5.5), "-5.50");
    }

    #[test]
    fn ratios() {
        assert_eq!(ratio(Some(9188.0), Some(8434.0)), "1.09");
        assert_eq!(ratio(Some(28.5), Some(4.0)), "7.12");
        assert_eq!(ratio(Some(0.0), Some(27_399.0)), "0.00");
        assert_eq!(ratio(Some(0.0), Some(0.0)), "—");
        assert_eq!(ratio(Some(1.0), None), "—");
        assert_eq!(ratio(None, Some(1.0)), "—");
    }

    #[test]
    fn notes_are_sorted_as_text_and_joined() {
        let mut r = Results::default();
        r.note(Scenario::S1, Server::Oncelog, "round 1: a".into());
        r.note(Scenario::S1Wide, Server::Electric, "b".into());
        r.note(Scenario::S1, Server::Oncelog, "round 2: c".into());
        r.note(Scenario::Catchup4k, Server::Oncelog, "d".into());
        let notes = r.notes();
        assert_eq!(
            notes,
            vec![
                (Scenario::Catchup4k, Server::Oncelog, "d".to_string()),
                // "s1wide|…" sorts before "s1|…" as text ('w' < '|').
                (Scenario::S1Wide, Server::Electric, "b".to_string()),
                (Scenario::S1, Server::Oncelog, "round 1: a; round 2: c".to_string()),
            ]
        );
    }
}
