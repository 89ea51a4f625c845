//! The run's timeline as an SVG: acknowledged, refused and unknown operations per second, with
//! the faults shaded. Written as SVG text (no plotting dependency: a few shapes).

use crate::history::{Op, Outcome};

/// A fault's window, in milliseconds since the run began.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    pub from_ms: u64,
    pub to_ms: u64,
    /// What it was ("SIGKILL", "disk full").
    pub kind: &'static str,
}

const WIDTH: f64 = 960.0;
const HEIGHT: f64 = 300.0;
const PAD: f64 = 40.0;

/// Operations completed per second by outcome, one bucket per second of `span_ms`.
fn per_second(ops: &[Op], span_ms: u64) -> [Vec<u64>; 3] {
    let n = (span_ms / 1000 + 1) as usize;
    let mut out = [vec![0; n], vec![0; n], vec![0; n]];
    for op in ops {
        let i = ((op.completed_ms / 1000) as usize).min(n - 1);
        let k = match op.outcome {
            Outcome::Ok => 0,
            Outcome::Failed => 1,
            Outcome::Unknown => 2,
        };
        out[k][i] += 1;
    }
    out
}

pub fn timeline_svg(ops: &[Op], faults: &[Fault]) -> String {
    let span_ms = ops.iter().map(|o| o.completed_ms).chain(faults.iter().map(|f| f.to_ms)).max().unwrap_or(0).max(1000);
    let series = per_second(ops, span_ms);
    let top = series.iter().flatten().copied().max().unwrap_or(0).max(1) as f64;
    let x = |ms: f64| PAD + ms / span_ms as f64 * (WIDTH - 2.0 * PAD);
    let y = |v: f64| HEIGHT - PAD - v / top * (HEIGHT - 2.0 * PAD);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" font-family=\"sans-serif\" font-size=\"11\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    for f in faults {
        s.push_str(&format!(
            "<rect class=\"fault\" x=\"{:.1}\" y=\"{PAD}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{}\"><title>{}</title></rect>\n",
            x(f.from_ms as f64),
            (x(f.to_ms as f64) - x(f.from_ms as f64)).max(1.0),
            HEIGHT - 2.0 * PAD,
            match f.kind {
                "SIGKILL" => "#f4c7c3",
                "pause" => "#e0e0e0",
                _ => "#c3d7f4",
            },
            f.kind
        ));
    }
    for (values, (name, color)) in
        series.iter().zip([("ok", "#1a7f37"), ("refused", "#9a6700"), ("unknown", "#cf222e")])
    {
        let points: Vec<String> = values
            .iter()
            .enumerate()
            .map(|(i, v)| format!("{:.1},{:.1}", x(i as f64 * 1000.0 + 500.0), y(*v as f64)))
            .collect();
        s.push_str(&format!(
            "<polyline class=\"{name}\" fill=\"none\" stroke=\"{color}\" stroke-width=\"1.5\" points=\"{}\"/>\n",
            points.join(" ")
        ));
    }
    s.push_str(&format!(
        "<line x1=\"{PAD}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" stroke=\"black\"/>\n<text x=\"{PAD}\" y=\"{t}\">operations per second (max {top}): ok (green), refused (amber), unknown (red); SIGKILL shaded red, full disk blue, pause grey; {secs} s</text>\n</svg>\n",
        b = HEIGHT - PAD,
        r = WIDTH - PAD,
        t = PAD - 12.0,
        secs = span_ms / 1000
    ));
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::OpKind;

    fn op(completed_ms: u64, outcome: Outcome) -> Op {
        Op {
            id: completed_ms,
            process: "p".into(),
            invoked_ms: completed_ms,
            completed_ms,
            outcome,
            kind: OpKind::Read { stream: "s".into(), from: 0, bytes: String::new() },
        }
    }

    #[test]
    fn the_timeline_shades_each_fault_and_counts_each_second() {
        let ops =
            vec![op(100, Outcome::Ok), op(900, Outcome::Ok), op(1500, Outcome::Unknown), op(2500, Outcome::Failed)];
        assert_eq!(per_second(&ops, 2500), [vec![2, 0, 0], vec![0, 0, 1], vec![0, 1, 0]]);
        let svg = timeline_svg(
            &ops,
            &[
                Fault { from_ms: 1000, to_ms: 1200, kind: "SIGKILL" },
                Fault { from_ms: 2000, to_ms: 2100, kind: "disk full" },
            ],
        );
        assert_eq!(svg.matches("class=\"fault\"").count(), 2);
        assert_eq!(svg.matches("<polyline").count(), 3);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    }
}
