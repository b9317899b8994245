//! The HTML form of a backtest report: one self-contained page (an inline
//! stylesheet and inline SVG charts, no script, no font, image or link to
//! anything outside the file), so that it can be mailed or attached to a
//! ticket and read offline in any browser.
//!
//! Every string taken from the report goes through maud's escaping; only the
//! stylesheet constant below is written unescaped. The charts use SVG
//! presentation attributes (`fill`, `x`, `width`, ...), never `style`, and
//! each one is followed by the same numbers in a table (or in its labels).

use super::report::{Example, Fidelity, Flips, Latencies, Matrix, Moderators, Report, Sample, VersionRef};
use crate::clock::format_utc as utc;
use maud::{DOCTYPE, Markup, PreEscaped, html};
use std::collections::{BTreeMap, BTreeSet};

/// Text colour, muted text colour and the colours of the bars.
const FG: &str = "#1d2330";
const MUTED: &str = "#5b6475";
const GREY: &str = "#8a93a6";
const RED: &str = "#b3261e";
const GREEN: &str = "#1f7a3a";
const AMBER: &str = "#c77700";
const BLUE: &str = "#2450c8";

/// The flip buckets that carry examples, in the order shown, with their headings.
const BUCKETS: [(&str, &str); 3] = [
    ("newly_actioned", "Newly actioned"),
    ("newly_cleared", "Newly cleared"),
    ("changed", "Changed on the same side"),
];

/// The page's only stylesheet (the console's look, standalone).
const CSS: &str = r#"
:root { --fg: #1d2330; --muted: #5b6475; --line: #d9dde5; --accent: #2450c8; --bad: #b3261e; --ok: #1f7a3a; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg); background: #f6f7f9; }
main { padding: 16px 24px; max-width: 1280px; }
h1 { font-size: 20px; margin: 4px 0 12px; }
h2 { font-size: 16px; margin: 24px 0 8px; }
h3 { font-size: 14px; margin: 16px 0 4px; }
section { margin-bottom: 8px; }
code { font-family: ui-monospace, "SFMono-Regular", Menlo, monospace; font-size: 12px; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 4px 16px; margin: 0 0 12px; }
dl.facts dt { color: var(--muted); font-weight: 600; }
dl.facts dd { margin: 0; }
dl.kv { display: grid; grid-template-columns: max-content 1fr; gap: 2px 12px; margin: 0; }
dl.kv dt { font-family: ui-monospace, "SFMono-Regular", Menlo, monospace; font-size: 12px; }
dl.kv dd { margin: 0; overflow-wrap: anywhere; }
ul.plain { list-style: none; margin: 0; padding: 0; }
table { border-collapse: collapse; width: 100%; background: #fff; margin: 8px 0; }
table.narrow, table.matrix { width: auto; min-width: 320px; }
caption { text-align: left; color: var(--muted); font-size: 12px; padding: 4px 0; }
th, td { text-align: left; padding: 6px 8px; border-bottom: 1px solid var(--line); vertical-align: top; }
th { font-size: 12px; color: var(--muted); font-weight: 600; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
td.nowrap { white-space: nowrap; }
td.text { max-width: 420px; overflow-wrap: anywhere; }
tfoot td, tfoot th { border-bottom: none; font-weight: 600; }
.counts { display: flex; gap: 24px; flex-wrap: wrap; margin-bottom: 12px; }
.counts .n { font-size: 20px; font-weight: 700; display: block; }
.hint { color: var(--muted); }
.bad { color: var(--bad); font-weight: 600; }
.fidelity { display: inline-block; padding: 8px 12px; border-radius: 4px; border: 1px solid; }
.fidelity.ok { background: #e8f3ec; border-color: #b7dcc4; color: var(--ok); }
.fidelity.bad { background: #fbeaea; border-color: #f0b9b5; color: var(--bad); }
svg { display: block; max-width: 100%; height: auto; background: #fff; border: 1px solid var(--line); border-radius: 4px; margin: 8px 0; }
footer { color: var(--muted); font-size: 12px; margin-top: 24px; }
@media print { body { background: #fff; } main { max-width: none; } }
"#;

/// The whole page for `report`, as an HTML5 document.
pub fn render(report: &Report) -> String {
    let title = format!("Backtest: {} {}", report.candidate.name, report.candidate.version);
    let page = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                // Belt and braces for a file opened from a mailbox: nothing may load or run.
                meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'";
                title { (title) }
                style { (PreEscaped(CSS)) }
            }
            body {
                main {
                    (header(report))
                    (sample(&report.sample))
                    (fidelity(report.fidelity))
                    (recomputed(&report.recomputed_signals))
                    (matrix_section(
                        "verdicts",
                        "Verdicts: incumbent → candidate",
                        "The replaced plugin's verdict (or failed outcome, or none) in rows, the candidate's in columns.",
                        &report.verdicts,
                    ))
                    (matrix_section(
                        "statuses",
                        "Combined status: before → after",
                        "The item's combined status before in rows, with the candidate in columns; the other enforcing \
                         plugins' stored decisions are held fixed.",
                        &report.statuses,
                    ))
                    (flips(&report.flips))
                    (moderators(&report.moderators))
                    (latency(&report.latency_us))
                    (outcomes(&report.outcomes))
                    (examples(&report.flips))
                    footer { "Generated by gavel backtest; run started " (utc(report.started_at_ms)) "." }
                }
            }
        }
    };
    page.into_string()
}

// ----- sections -----

/// Title, candidates, candidate lists, incumbent versions, replaced
/// plugin, window and config.
fn header(r: &Report) -> Markup {
    html! {
        header #summary {
            h1 { "Backtest: " (r.candidate.name) " " (r.candidate.version) }
            dl.facts {
                @if r.candidates.len() > 1 {
                    dt { "Candidates" }
                    dd {
                        ul.plain { @for v in &r.candidates { li { (version_ref(v)) } } }
                        span.hint { "each deployed plugin that consulted the candidate lists, in place of its own decisions" }
                    }
                } @else {
                    dt { "Candidate" }
                    dd { (version_ref(&r.candidate)) }
                }
                @if !r.lists.is_empty() {
                    dt { "Candidate lists" }
                    dd {
                        ul.plain {
                            @for l in &r.lists {
                                li {
                                    strong { (l.name) } " " (l.kind.as_str()) ", " (l.entries) " entries "
                                    code title=(l.digest) { (short(&l.digest)) }
                                }
                            }
                        }
                    }
                }
                dt { "Incumbent" }
                dd {
                    @if r.incumbent.is_empty() {
                        "new plugin"
                    } @else {
                        ul.plain { @for v in &r.incumbent { li { (version_ref(v)) } } }
                    }
                }
                dt { "Replaces" }
                dd { @if r.replaces.is_empty() { "—" } @else { code { (r.replaces) } } }
                dt { "Window" }
                dd { (utc(r.window.since_ms)) " to " (utc(r.window.until_ms)) " (end excluded)" }
                dt { "Run" }
                dd { "started " (utc(r.started_at_ms)) ", took " (duration(r.elapsed_ms)) }
                dt { "Config" }
                dd { (config(r.config.as_ref())) }
                @if !r.overrides.is_empty() {
                    dt { "Overrides" }
                    dd { dl.kv { @for (k, v) in &r.overrides { dt { (k) } dd { (v) } } } }
                }
            }
        }
    }
}

/// `name version digest12`, the full digest as the tooltip.
fn version_ref(v: &VersionRef) -> Markup {
    html! { strong { (v.name) } " " (v.version) " " code title=(v.digest) { (short(&v.digest)) } }
}

/// The fixed config as a key/value list, or what was used instead.
fn config(config: Option<&BTreeMap<String, String>>) -> Markup {
    html! {
        @if let Some(c) = config {
            @if c.is_empty() {
                "fixed, empty"
            } @else {
                dl.kv { @for (k, v) in c { dt { (k) } dd { (v) } } }
            }
        } @else {
            "as stored with each replaced decision"
        }
    }
}

/// How many evaluations were available, asked for and replayed, and why some could not be.
fn sample(s: &Sample) -> Markup {
    let requested = s.requested.map_or_else(|| "all".to_string(), |n| n.to_string());
    let not_replayable = total(s.not_replayable.values());
    html! {
        section #sample {
            h2 { "Sample" }
            div.counts {
                div { span.n { (s.available) } "available in the window" }
                div { span.n { (requested) } "requested" }
                div { span.n { (s.replayed) } "replayed" }
                div { span.n { (not_replayable) } "not replayable" }
            }
            @if s.not_replayable.is_empty() {
                p.hint { "Every evaluation of the sample could be replayed." }
            } @else {
                table.narrow #not-replayable {
                    caption { "Evaluations of the sample that could not be replayed" }
                    thead { tr { th { "reason" } th.num { "evaluations" } } }
                    tbody { @for (reason, n) in &s.not_replayable { tr { td { (reason) } td.num { (n) } } } }
                }
            }
        }
    }
}

/// "checked N, identical M (xx.x %)", red when the replay is not faithful.
fn fidelity(f: Option<Fidelity>) -> Markup {
    html! {
        @if let Some(f) = f {
            @let class = if f.identical < f.checked { "fidelity bad" } else { "fidelity ok" };
            section #fidelity {
                h2 { "Fidelity" }
                p class=(class) {
                    "checked " (f.checked) ", identical " (f.identical) " (" (percent(f.identical, f.checked)) ")"
                }
                p.hint {
                    "Replayed evaluations whose stored decision was made by the candidate's own digest, and how many "
                    "it decided identically (outcome, verdict, score, labels, reason). Below 100 %, replay does not "
                    "reproduce history, and the figures below are less trustworthy."
                }
            }
        }
    }
}

/// The signals whose values were recomputed from stored items, if any.
fn recomputed(r: &std::collections::BTreeMap<String, u64>) -> Markup {
    html! {
        @if !r.is_empty() {
            section #recomputed-signals {
                h2 { "Recomputed signals" }
                ul {
                    @for (name, n) in r { li { code { (name) } ": " (n) " snapshots" } }
                }
                p.hint {
                    "The candidate declares these entity signals and the stored snapshots did not carry them: their "
                    "values were recomputed from the stored items at each snapshot's time, not read as the rules saw them."
                }
            }
        }
    }
}

/// A matrix as a heatmap and as a table.
fn matrix_section(id: &str, heading: &str, hint: &str, m: &Matrix) -> Markup {
    let aria = format!("{heading}: heatmap of evaluation counts, old in rows, new in columns");
    html! {
        section id=(id) {
            h2 { (heading) }
            p.hint { (hint) " The diagonal (unchanged) is outlined." }
            (heatmap(&format!("{id}-chart"), &aria, m))
            (matrix_table(heading, m))
        }
    }
}

/// Evaluations by how the combined status moved, as horizontal bars.
fn flips(f: &Flips) -> Markup {
    let all = total([f.unchanged, f.newly_actioned, f.newly_cleared, f.changed].iter());
    let bar = |label: &str, n: u64, colour: &'static str| Bar {
        label: label.to_string(),
        value: Some(n as f64),
        text: format!("{n} ({})", percent(n, all)),
        colour,
    };
    let bars = [
        bar("unchanged", f.unchanged, GREY),
        bar("newly actioned", f.newly_actioned, RED),
        bar("newly cleared", f.newly_cleared, GREEN),
        bar("changed", f.changed, AMBER),
    ];
    html! {
        section #flips {
            h2 { "Flips" }
            p.hint {
                "Newly actioned: not actioned before (visible, awaiting a provider), held for review or rejected now. "
                "Newly cleared: the reverse. Changed: another status on the same side."
            }
            (bar_chart("flips-chart", "Evaluations by how the combined status moved", &bars, max_value(&bars)))
        }
    }
}

/// Agreement of the old and the new combined status with moderators' decisions.
fn moderators(m: &Moderators) -> Markup {
    html! {
        section #moderators {
            h2 { "Agreement with moderators" }
            @if m.decided == 0 {
                p.hint #no-moderators {
                    "No replayed item was decided by a moderator, so agreement with moderators cannot be compared."
                }
            } @else {
                p { (m.decided) " replayed items were decided by a moderator (whether the item is actioned)." }
                (bar_chart(
                    "moderators-chart",
                    "Share of moderator-decided items each side agrees with, old versus new",
                    &[agreement_bar("old (incumbent)", m.old_agree, m.decided, GREY),
                      agreement_bar("new (candidate)", m.new_agree, m.decided, BLUE)],
                    1.0,
                ))
                ul {
                    li { "Reversals avoided: " strong { (m.reversals_avoided) }
                         " (the incumbent actioned, a moderator reversed it, the candidate would not have actioned)" }
                    li { "Overturns reintroduced: " strong { (m.overturns_reintroduced) }
                         " (a moderator cleared, the incumbent did not action, the candidate would)" }
                }
            }
        }
    }
}

/// p50 and p99, candidate against incumbent.
fn latency(l: &Latencies) -> Markup {
    let inc = l.incumbent;
    let bar = |label: &str, v: Option<u64>, colour: &'static str| Bar {
        label: label.to_string(),
        value: v.map(|v| v as f64),
        text: v.map_or_else(|| "not stored".to_string(), micros),
        colour,
    };
    let bars = [
        bar("p50 candidate", Some(l.candidate.p50), BLUE),
        bar("p50 incumbent", inc.map(|i| i.p50), GREY),
        bar("p99 candidate", Some(l.candidate.p99), BLUE),
        bar("p99 incumbent", inc.map(|i| i.p99), GREY),
    ];
    html! {
        section #latency {
            h2 { "Latency" }
            p.hint {
                "Evaluation time: the candidate's measured during this replay, the incumbent's as stored when it ran."
                @if inc.is_none() { " There is no incumbent figure to compare with." }
            }
            (bar_chart("latency-chart", "Evaluation latency p50 and p99, candidate versus incumbent", &bars, max_value(&bars)))
        }
    }
}

/// The candidate's outcomes (ok, error, trap, ...).
fn outcomes(o: &BTreeMap<String, u64>) -> Markup {
    let all = total(o.values());
    html! {
        section #outcomes {
            h2 { "Candidate outcomes" }
            @if o.is_empty() {
                p.hint { "None: nothing was replayed." }
            } @else {
                table.narrow {
                    thead { tr { th { "outcome" } th.num { "evaluations" } th.num { "share" } } }
                    tbody {
                        @for (k, n) in o {
                            @let class = if k != "ok" && *n > 0 { "num bad" } else { "num" };
                            tr { td { (k) } td class=(class) { (n) } td.num { (percent(*n, all)) } }
                        }
                    }
                }
            }
        }
    }
}

/// The example evaluations of each flip bucket.
fn examples(f: &Flips) -> Markup {
    let others: Vec<&String> = f
        .examples
        .keys()
        .filter(|k| !BUCKETS.iter().any(|(b, _)| *b == k.as_str()))
        .collect();
    html! {
        section #examples {
            h2 { "Examples" }
            p.hint { "Up to 20 evaluations per bucket whose combined status the candidate changes." }
            @for (key, heading) in BUCKETS {
                (example_table(key, heading, Some(bucket_count(f, key)), bucket(f, key)))
            }
            @for key in others {
                (example_table(key, key, None, bucket(f, key)))
            }
        }
    }
}

fn example_table(key: &str, heading: &str, count: Option<u64>, rows: &[Example]) -> Markup {
    html! {
        h3 {
            (heading)
            @if let Some(n) = count { " (" (rows.len()) " shown of " (n) ")" }
        }
        @if rows.is_empty() {
            p.hint { "No examples." }
        } @else {
            table.examples data-bucket=(key) {
                thead { tr {
                    th { "item" } th { "time" } th { "old decision" } th { "new decision" } th { "status" } th { "excerpt" }
                } }
                tbody { @for e in rows { (example_row(e)) } }
            }
        }
    }
}

fn example_row(e: &Example) -> Markup {
    html! {
        tr {
            td { code { (e.item_id) } }
            td.nowrap { (utc(e.at_ms)) }
            td { (decision(&e.old_decision, &e.old_reason)) }
            td { (decision(&e.new_decision, &e.new_reason)) }
            td.nowrap { (e.old_status) " → " (e.new_status) }
            td.text { (e.excerpt) }
        }
    }
}

fn decision(what: &str, reason: &str) -> Markup {
    html! {
        strong { (what) }
        @if !reason.is_empty() { br; small { (reason) } }
    }
}

// ----- charts -----

/// One horizontal bar: `value` None draws no bar, only `text`.
struct Bar {
    label: String,
    value: Option<f64>,
    text: String,
    colour: &'static str,
}

/// An `<svg>` with its accessible name; the chart's shapes are `body`.
fn svg_frame(id: &str, aria: &str, width: f64, height: f64, body: Markup) -> Markup {
    html! {
        svg id=(id) xmlns="http://www.w3.org/2000/svg" width=(num(width)) height=(num(height))
            viewBox={ "0 0 " (num(width)) " " (num(height)) } role="img" aria-label=(aria) {
            title { (aria) }
            (body)
        }
    }
}

/// Horizontal bars on one scale, `max` the longest (0: no bar drawn).
fn bar_chart(id: &str, aria: &str, bars: &[Bar], max: f64) -> Markup {
    const LABEL_W: f64 = 140.0;
    const BAR_W: f64 = 420.0;
    const TEXT_W: f64 = 160.0;
    const ROW: f64 = 28.0;
    const PAD: f64 = 8.0;
    let width = LABEL_W + BAR_W + TEXT_W;
    let height = 2.0 * PAD + ROW * bars.len() as f64;
    let body = html! {
        line x1=(num(LABEL_W)) y1=(num(PAD)) x2=(num(LABEL_W)) y2=(num(height - PAD)) stroke="#888" {}
        @for (i, b) in bars.iter().enumerate() {
            @let y = PAD + ROW * i as f64;
            @let length = b.value.map_or(0.0, |v| scaled(v, max, BAR_W));
            text x=(num(LABEL_W - 8.0)) y=(num(y + ROW / 2.0 + 4.0)) text-anchor="end" font-size="12" fill=(FG) {
                (b.label)
            }
            @if b.value.is_some() {
                rect x=(num(LABEL_W)) y=(num(y + 4.0)) width=(num(length)) height=(num(ROW - 8.0)) fill=(b.colour) {
                    title { (b.label) ": " (b.text) }
                }
            }
            text x=(num(LABEL_W + length + 6.0)) y=(num(y + ROW / 2.0 + 4.0)) font-size="12" fill=(MUTED) { (b.text) }
        }
    };
    svg_frame(id, aria, width, height, body)
}

/// A square grid over the labels of both axes, a cell's shade by its count.
fn heatmap(id: &str, aria: &str, m: &Matrix) -> Markup {
    const LABEL_W: f64 = 130.0;
    const TOP: f64 = 48.0;
    const CELL_W: f64 = 92.0;
    const CELL_H: f64 = 34.0;
    const PAD: f64 = 8.0;
    let axis = axis_labels(m);
    let max = m.values().flat_map(|row| row.values()).copied().max().unwrap_or(0);
    let n = axis.len().max(1) as f64;
    let width = LABEL_W + CELL_W * n + PAD;
    let height = TOP + CELL_H * n + PAD;
    let body = html! {
        text x="4" y="16" font-size="11" fill=(MUTED) { "old ↓" }
        text x=(num(LABEL_W)) y="16" font-size="11" fill=(MUTED) { "new →" }
        @if axis.is_empty() {
            text x=(num(LABEL_W)) y=(num(TOP + CELL_H / 2.0 + 4.0)) font-size="12" fill=(MUTED) { "nothing replayed" }
        }
        @for (j, col) in axis.iter().enumerate() {
            text x=(num(LABEL_W + CELL_W * j as f64 + CELL_W / 2.0)) y=(num(TOP - 8.0)) text-anchor="middle"
                font-size="11" fill=(FG) { (clip(col, 12)) title { (col) } }
        }
        @for (i, row) in axis.iter().enumerate() {
            @let y = TOP + CELL_H * i as f64;
            text x=(num(LABEL_W - 8.0)) y=(num(y + CELL_H / 2.0 + 4.0)) text-anchor="end" font-size="11" fill=(FG) {
                (clip(row, 18)) title { (row) }
            }
            @for (j, col) in axis.iter().enumerate() {
                (heat_cell(LABEL_W + CELL_W * j as f64, y, CELL_W, CELL_H, row, col, cell(m, row, col), max))
            }
        }
    };
    svg_frame(id, aria, width, height, body)
}

/// One cell of a heatmap: the shaded square and its count; the diagonal outlined.
#[allow(clippy::too_many_arguments)]
fn heat_cell(x: f64, y: f64, w: f64, h: f64, row: &str, col: &str, count: u64, max: u64) -> Markup {
    let t = intensity(count, max);
    let stroke = if row == col { FG } else { "none" };
    let ink = if t > 0.55 { "#ffffff" } else { FG };
    html! {
        rect x=(num(x + 1.0)) y=(num(y + 1.0)) width=(num(w - 2.0)) height=(num(h - 2.0)) fill=(shade(t))
            stroke=(stroke) stroke-width="1.5" {
            title { (row) " → " (col) ": " (count) }
        }
        text x=(num(x + w / 2.0)) y=(num(y + h / 2.0 + 4.0)) text-anchor="middle" font-size="12" fill=(ink) { (count) }
    }
}

/// The matrix's exact numbers, with row and column totals.
fn matrix_table(caption: &str, m: &Matrix) -> Markup {
    let axis = axis_labels(m);
    let column_total = |col: &str| total(m.values().filter_map(|row| row.get(col)));
    let all = total(m.values().flat_map(|row| row.values()));
    html! {
        table.matrix {
            caption { (caption) " (rows old, columns new)" }
            thead { tr {
                th scope="col" { "old \\ new" }
                @for col in &axis { th.num scope="col" { (col) } }
                th.num scope="col" { "total" }
            } }
            tbody {
                @for row in &axis {
                    tr {
                        th scope="row" { (row) }
                        @for col in &axis { td.num { (cell(m, row, col)) } }
                        td.num { (total(m.get(*row).into_iter().flat_map(|r| r.values()))) }
                    }
                }
                @if axis.is_empty() { tr { td { "nothing replayed" } } }
            }
            @if !axis.is_empty() {
                tfoot { tr {
                    th scope="row" { "total" }
                    @for col in &axis { td.num { (column_total(col)) } }
                    td.num { (all) }
                } }
            }
        }
    }
}

// ----- helpers -----

/// Every value that occurs as a row or a column, sorted: the same order on
/// both axes, so that the diagonal is "unchanged".
fn axis_labels(m: &Matrix) -> Vec<&str> {
    let mut labels = BTreeSet::new();
    for (row, cols) in m {
        labels.insert(row.as_str());
        labels.extend(cols.keys().map(String::as_str));
    }
    labels.into_iter().collect()
}

fn cell(m: &Matrix, row: &str, col: &str) -> u64 {
    m.get(row).and_then(|r| r.get(col)).copied().unwrap_or(0)
}

fn bucket<'a>(f: &'a Flips, key: &str) -> &'a [Example] {
    f.examples.get(key).map_or(&[][..], Vec::as_slice)
}

fn bucket_count(f: &Flips, key: &str) -> u64 {
    match key {
        "newly_actioned" => f.newly_actioned,
        "newly_cleared" => f.newly_cleared,
        "changed" => f.changed,
        _ => 0,
    }
}

fn agreement_bar(label: &str, agree: u64, decided: u64, colour: &'static str) -> Bar {
    let share = if decided > 0 {
        agree as f64 / decided as f64
    } else {
        0.0
    };
    Bar {
        label: label.to_string(),
        value: Some(share),
        text: format!("{} ({agree} of {decided})", percent(agree, decided)),
        colour,
    }
}

fn max_value(bars: &[Bar]) -> f64 {
    bars.iter()
        .filter_map(|b| b.value)
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max)
}

/// A sum that cannot overflow.
fn total<'a>(values: impl Iterator<Item = &'a u64>) -> u64 {
    values.fold(0, |sum, v| sum.saturating_add(*v))
}

/// `v` out of `max` as a length out of `full`; 0 when nothing can be scaled.
fn scaled(v: f64, max: f64, full: f64) -> f64 {
    if max > 0.0 && v.is_finite() && max.is_finite() {
        (v / max).clamp(0.0, 1.0) * full
    } else {
        0.0
    }
}

/// How dark a cell is, 0 (no count) to 1 (the largest); square root so that
/// small counts stay visible next to a large diagonal.
fn intensity(count: u64, max: u64) -> f64 {
    if count == 0 || max == 0 {
        0.0
    } else {
        (0.15 + 0.85 * (count as f64 / max as f64).sqrt()).clamp(0.0, 1.0)
    }
}

/// From near-white (0) to the console's blue (1).
fn shade(t: f64) -> String {
    const LOW: [f64; 3] = [243.0, 245.0, 249.0];
    const HIGH: [f64; 3] = [36.0, 80.0, 200.0];
    let t = if t.is_finite() { t.clamp(0.0, 1.0) } else { 0.0 };
    let channel = |i: usize| (LOW[i] + (HIGH[i] - LOW[i]) * t).round() as u8;
    format!("#{:02x}{:02x}{:02x}", channel(0), channel(1), channel(2))
}

/// An SVG coordinate: one decimal, and never `NaN` or `inf`.
fn num(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.1}")
    } else {
        "0".to_string()
    }
}

/// `12.5 %`, or `—` for a share of nothing.
fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        "—".to_string()
    } else {
        format!("{:.1} %", part as f64 * 100.0 / whole as f64)
    }
}

/// `850 µs`, `12.3 ms`, `1.25 s`.
fn micros(us: u64) -> String {
    match us {
        0..1_000 => format!("{us} µs"),
        1_000..1_000_000 => format!("{:.1} ms", us as f64 / 1e3),
        _ => format!("{:.2} s", us as f64 / 1e6),
    }
}

/// `850 ms`, `12.3 s`, `4 min 05 s`.
fn duration(ms: u64) -> String {
    match ms {
        0..1_000 => format!("{ms} ms"),
        1_000..60_000 => format!("{:.1} s", ms as f64 / 1e3),
        _ => format!("{} min {:02} s", ms / 60_000, ms % 60_000 / 1000),
    }
}

/// The first 12 hex digits of a digest (after an optional `sha256:`).
fn short(digest: &str) -> &str {
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    hex.get(..12).unwrap_or(hex)
}

/// At most `max` characters, with `…` when cut.
fn clip(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let mut cut: String = s.chars().take(max.saturating_sub(1)).collect();
        cut.push('…');
        cut
    }
}

#[cfg(test)]
mod tests {
    use super::super::report::{Latency, Window};
    use super::*;

    const SVG_NS: &str = "http://www.w3.org/2000/svg";

    fn version(name: &str, version: &str, digest: &str) -> VersionRef {
        VersionRef {
            name: name.to_string(),
            version: version.to_string(),
            digest: digest.to_string(),
        }
    }

    fn matrix(cells: &[(&str, &str, u64)]) -> Matrix {
        let mut m = Matrix::new();
        for (from, to, n) in cells {
            m.entry(from.to_string()).or_default().insert(to.to_string(), *n);
        }
        m
    }

    fn example(item: &str, reason: &str) -> Example {
        Example {
            item_id: item.to_string(),
            at_ms: 1_796_195_703_000,
            old_decision: "allow".to_string(),
            old_reason: "nothing matched".to_string(),
            new_decision: "reject".to_string(),
            new_reason: reason.to_string(),
            old_status: "visible".to_string(),
            new_status: "rejected".to_string(),
            excerpt: "Buy cheap <b>pills</b> & more".to_string(),
        }
    }

    fn full_report() -> Report {
        let mut examples = BTreeMap::new();
        examples.insert(
            "newly_actioned".to_string(),
            vec![
                example("item-1", "<script>alert(1)</script>"),
                example("item-2", "spam phrase"),
            ],
        );
        examples.insert("newly_cleared".to_string(), vec![]);
        examples.insert("changed".to_string(), vec![example("item-3", "")]);
        Report {
            candidate: version(
                "spam-filter",
                "1.3.0",
                "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            ),
            candidates: vec![version(
                "spam-filter",
                "1.3.0",
                "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            )],
            lists: vec![crate::backtest::ListRef {
                name: "scam-phrases".to_string(),
                kind: crate::lists::ListKind::Terms,
                entries: 3,
                digest: "9c1e0000111122223333444455556666777788889999aaaabbbbccccddddeeee".to_string(),
            }],
            incumbent: vec![
                version(
                    "spam-filter",
                    "1.2.0",
                    "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210",
                ),
                version(
                    "spam-filter",
                    "1.2.1",
                    "aaaaaaaaaaaabbbbbbbbbbbbccccccccccccddddddddddddeeeeeeeeeeeeffff",
                ),
            ],
            replaces: "spam-filter".to_string(),
            overrides: BTreeMap::from([("threshold".to_string(), "<5>".to_string())]),
            config: Some(BTreeMap::from([
                ("threshold".to_string(), "0.8".to_string()),
                ("phrases".to_string(), "\"buy now\"".to_string()),
            ])),
            window: Window {
                since_ms: 1_796_000_000_000,
                until_ms: 1_796_195_703_000,
            },
            sample: Sample {
                available: 1_000,
                requested: Some(500),
                replayed: 480,
                not_replayable: BTreeMap::from([
                    ("snapshot expired".to_string(), 15),
                    ("no stored snapshot".to_string(), 5),
                ]),
            },
            verdicts: matrix(&[
                ("allow", "allow", 400),
                ("allow", "reject", 30),
                ("reject", "reject", 45),
                ("error", "allow", 5),
            ]),
            statuses: matrix(&[
                ("visible", "visible", 420),
                ("visible", "rejected", 30),
                ("rejected", "rejected", 30),
            ]),
            flips: Flips {
                unchanged: 449,
                newly_actioned: 30,
                newly_cleared: 0,
                changed: 1,
                examples,
            },
            moderators: Moderators {
                decided: 40,
                old_agree: 30,
                new_agree: 36,
                old_agreement: Some(0.75),
                new_agreement: Some(0.9),
                reversals_avoided: 3,
                overturns_reintroduced: 1,
            },
            outcomes: BTreeMap::from([("ok".to_string(), 475), ("error".to_string(), 5)]),
            latency_us: Latencies {
                candidate: Latency { p50: 850, p99: 4_200 },
                incumbent: Some(Latency { p50: 900, p99: 12_000 }),
            },
            fidelity: Some(Fidelity {
                checked: 200,
                identical: 199,
            }),
            recomputed_signals: BTreeMap::from([("domain-authors".to_string(), 480)]),
            started_at_ms: 1_796_195_800_000,
            elapsed_ms: 12_345,
        }
    }

    fn empty_report() -> Report {
        Report {
            candidate: version("", "", ""),
            candidates: vec![],
            lists: vec![],
            incumbent: vec![],
            replaces: String::new(),
            config: None,
            overrides: BTreeMap::new(),
            window: Window {
                since_ms: 0,
                until_ms: 0,
            },
            sample: Sample::default(),
            verdicts: Matrix::new(),
            statuses: Matrix::new(),
            flips: Flips::default(),
            moderators: Moderators::default(),
            outcomes: BTreeMap::new(),
            latency_us: Latencies::default(),
            fidelity: Some(Fidelity::default()),
            recomputed_signals: BTreeMap::new(),
            started_at_ms: 0,
            elapsed_ms: 0,
        }
    }

    /// No URL at all, but the SVG namespace of each `xmlns`.
    fn assert_no_url(page: &str) {
        let namespaces = page.matches(SVG_NS).count();
        let xmlns = page.matches(&format!("xmlns=\"{SVG_NS}\"")).count();
        assert_eq!(
            namespaces, xmlns,
            "the SVG namespace appears outside an xmlns attribute"
        );
        let rest = page.replace(&format!("xmlns=\"{SVG_NS}\""), "");
        for scheme in ["http://", "https://", "url(", "src=", "href=", "@import"] {
            assert!(!rest.to_lowercase().contains(scheme), "the page contains {scheme}");
        }
    }

    #[test]
    fn a_full_report_renders_a_self_contained_page() {
        let page = render(&full_report());
        assert!(page.starts_with("<!DOCTYPE html>"));
        assert!(page.contains("<title>Backtest: spam-filter 1.3.0</title>"));
        assert!(page.matches("<svg").count() >= 3, "fewer than 3 charts");
        assert_eq!(page.matches("<svg").count(), page.matches("role=\"img\"").count());
        assert_eq!(page.matches("<style>").count(), 1);
        assert!(!page.to_lowercase().contains("<script"), "a script element");
        assert!(!page.contains(" style="), "a style attribute");
        assert_no_url(&page);
        assert!(!page.contains("NaN"));
    }

    #[test]
    fn report_strings_are_escaped() {
        let page = render(&full_report());
        assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(page.contains("Buy cheap &lt;b&gt;pills&lt;/b&gt; &amp; more"));
        assert!(page.contains("&quot;buy now&quot;"));
    }

    #[test]
    fn the_header_and_sections_carry_the_figures() {
        let page = render(&full_report());
        assert!(page.contains("0123456789ab<"), "the short candidate digest");
        assert!(!page.contains("0123456789abc<"));
        assert!(page.contains("1.2.0") && page.contains("1.2.1"));
        assert!(page.contains("2026-12-02 07:15:03 UTC"));
        assert!(page.contains("threshold"));
        assert!(page.contains("snapshot expired"));
        assert!(page.contains("checked 200, identical 199 (99.5 %)"));
        assert!(page.contains("class=\"fidelity bad\""));
        assert!(page.contains("<table class=\"matrix\">"));
        assert!(page.contains("data-bucket=\"newly_actioned\""));
        assert!(page.contains("visible → rejected"));
        assert!(page.contains("moderators-chart"));
        assert!(page.contains("90.0 % (36 of 40)"));
        assert!(
            page.contains("<strong>scam-phrases</strong> terms, 3 entries"),
            "the candidate list"
        );
        assert!(page.contains("9c1e00001111<"));
        assert!(
            page.contains("<li><code>domain-authors</code>: 480 snapshots</li>"),
            "the recomputed signals"
        );
        assert!(!render(&empty_report()).contains("recomputed-signals"));
    }

    #[test]
    fn an_empty_report_renders_without_nan() {
        let page = render(&empty_report());
        for bad in ["NaN", "\"inf", "\"-inf"] {
            assert!(!page.contains(bad), "the page contains {bad}");
        }
        assert!(page.matches("<svg").count() >= 3);
        assert!(page.contains("new plugin"));
        assert!(page.contains("No replayed item was decided by a moderator"));
        assert!(page.contains("checked 0, identical 0 (—)"));
        assert!(page.contains("class=\"fidelity ok\""));
        assert!(page.contains("not stored"));
        assert_no_url(&page);
    }

    #[test]
    fn fidelity_is_left_out_when_absent() {
        let mut report = full_report();
        report.fidelity = None;
        assert!(!render(&report).contains("id=\"fidelity\""));
    }

    #[test]
    fn helpers_never_divide_by_zero() {
        assert_eq!(percent(0, 0), "—");
        assert_eq!(scaled(5.0, 0.0, 100.0), 0.0);
        assert_eq!(intensity(0, 0), 0.0);
        assert_eq!(num(f64::NAN), "0");
        assert_eq!(shade(f64::NAN), "#f3f5f9");
        assert_eq!(shade(1.0), "#2450c8");
        assert_eq!(short("sha256:0123456789abcdef"), "0123456789ab");
        assert_eq!(clip("held_for_review_long", 8), "held_fo…");
    }
}
