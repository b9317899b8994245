//! The figures of one run: a table on stdout and `bench-results.json`.

use serde::Serialize;

/// One measured figure, next to what it is compared with in the same run.
#[derive(Debug, Clone, Serialize)]
pub struct Figure {
    /// `B1` .. `B12`.
    pub id: &'static str,
    pub name: String,
    pub value: f64,
    pub unit: &'static str,
    /// Spread over the repetitions (min, max), when there were several.
    pub min: Option<f64>,
    pub max: Option<f64>,
    /// What it is compared with, measured in the same run.
    pub comparison: Option<String>,
    pub comparison_value: Option<f64>,
    /// `value / comparison_value`.
    pub ratio: Option<f64>,
    pub goal: String,
    /// `None` when the figure has no goal of its own (it is reported).
    pub met: Option<bool>,
    pub note: Option<String>,
}

impl Figure {
    pub fn new(id: &'static str, name: impl Into<String>, value: f64, unit: &'static str) -> Self {
        Figure {
            id,
            name: name.into(),
            value,
            unit,
            min: None,
            max: None,
            comparison: None,
            comparison_value: None,
            ratio: None,
            goal: String::new(),
            met: None,
            note: None,
        }
    }

    pub fn spread(mut self, min: f64, max: f64) -> Self {
        self.min = Some(min);
        self.max = Some(max);
        self
    }

    pub fn against(mut self, what: impl Into<String>, value: f64) -> Self {
        self.comparison = Some(what.into());
        self.comparison_value = Some(value);
        self.ratio = (value != 0.0).then(|| self.value / value);
        self
    }

    pub fn goal(mut self, goal: impl Into<String>, met: bool) -> Self {
        self.goal = goal.into();
        self.met = Some(met);
        self
    }

    pub fn note(mut self, note: impl Into<String>) -> Self {
        self.note = Some(note.into());
        self
    }
}

/// Where and how the figures were measured.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub nproc: usize,
    pub cpu_model: String,
    pub git_revision: String,
    pub build_profile: &'static str,
    pub tokio_workers: usize,
    pub quick: bool,
    pub load_generator: String,
    pub measured_at: String,
}

impl Machine {
    pub fn describe(quick: bool) -> Machine {
        let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split(':').nth(1))
                    .map(|m| m.trim().to_string())
            })
            .unwrap_or_else(|| "unknown".into());
        let run = |cmd: &str, args: &[&str]| {
            std::process::Command::new(cmd)
                .args(args)
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        };
        Machine {
            nproc: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu_model,
            git_revision: run("git", &["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into()),
            build_profile: if cfg!(debug_assertions) { "debug" } else { "release" },
            tokio_workers: tokio::runtime::Handle::try_current().map_or(0, |h| h.metrics().num_workers()),
            quick,
            load_generator: std::process::Command::new("wrk")
                .arg("-v")
                .output()
                .ok()
                .and_then(|o| {
                    let text = String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
                    text.lines()
                        .next()
                        .map(|l| l.split(" Copyright").next().unwrap_or(l).trim().to_string())
                })
                .unwrap_or_else(|| "wrk not found".into())
                + " (closed loop) on the same machine, taking a core; open-loop latency from gavel-bench's paced client",
            measured_at: run("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"]).unwrap_or_default(),
        }
    }
}

/// `bench-results.json`.
#[derive(Debug, Serialize)]
pub struct Results<'a> {
    pub machine: &'a Machine,
    pub figures: &'a [Figure],
}

fn fmt(v: f64, unit: &str) -> String {
    let n = if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    };
    format!("{n} {unit}")
}

/// The table: figure, value, comparison, ratio, goal, met?
pub fn print_table(machine: &Machine, figures: &[Figure]) {
    println!(
        "\ngavel benchmarks — {} × {}, {} build, {} tokio workers, rev {}{}",
        machine.nproc,
        machine.cpu_model,
        machine.build_profile,
        machine.tokio_workers,
        machine.git_revision,
        if machine.quick {
            " (QUICK MODE: small counts, figures not meaningful)"
        } else {
            ""
        }
    );
    println!("load generator: {}\n", machine.load_generator);
    println!(
        "{:<4} {:<44} {:>22} {:>36} {:>9}  {:<34} met?",
        "id", "figure", "value [min–max]", "comparison", "ratio", "goal"
    );
    for f in figures {
        let value = match (f.min, f.max) {
            (Some(lo), Some(hi)) => format!("{} [{:.3}–{:.3}]", fmt(f.value, f.unit), lo, hi),
            _ => fmt(f.value, f.unit),
        };
        let comparison = match (&f.comparison, f.comparison_value) {
            (Some(c), Some(v)) => format!("{c}: {}", fmt(v, f.unit)),
            _ => String::new(),
        };
        let ratio = f.ratio.map_or(String::new(), |r| format!("{r:.2}×"));
        let met = match f.met {
            Some(true) => "yes",
            Some(false) => "NO",
            None => "—",
        };
        println!(
            "{:<4} {:<44} {:>22} {:>36} {:>9}  {:<34} {}",
            f.id, f.name, value, comparison, ratio, f.goal, met
        );
        if let Some(note) = &f.note {
            println!("     {note}");
        }
    }
}
