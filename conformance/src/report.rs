//! The outcome of a run: scenario × client, printed as a table and written as Markdown.

use std::time::Duration;

/// How one client did in one scenario.
#[derive(Clone, Debug)]
pub enum Outcome {
    /// Every step's check held.
    Pass(Duration),
    /// A step failed: which, and why.
    Fail(String),
    /// The scenario does not apply to the client, with the reason.
    NotApplicable(String),
}

impl Outcome {
    /// A short cell for the table (`n/a` without its reason).
    pub fn cell(&self) -> String {
        match self {
            Self::Pass(took) => format!("pass ({:.1} s)", took.as_secs_f64()),
            Self::Fail(_) => "FAIL".to_owned(),
            Self::NotApplicable(_) => "n/a".to_owned(),
        }
    }

    /// The cell with the reason of an `n/a`.
    pub fn cell_with_reason(&self) -> String {
        match self {
            Self::NotApplicable(why) => format!("n/a: {why}"),
            other => other.cell(),
        }
    }
}

/// The results: one row per scenario (name, title), one column per client.
pub struct Table {
    pub clients: Vec<String>,
    pub rows: Vec<(String, String, Vec<Outcome>)>,
}

impl Table {
    /// Whether no scenario failed.
    pub fn passed(&self) -> bool {
        self.rows.iter().all(|(_, _, cells)| !cells.iter().any(|c| matches!(c, Outcome::Fail(_))))
    }

    /// The table as plain text, then every failure with its reason.
    pub fn text(&self) -> String {
        let width = self.rows.iter().map(|(name, _, _)| name.len()).max().unwrap_or(8).max(8);
        let mut out = format!("{:width$}", "scenario");
        for client in &self.clients {
            out.push_str(&format!("  {client:14}"));
        }
        out.push('\n');
        for (name, _, cells) in &self.rows {
            out.push_str(&format!("{name:width$}"));
            for cell in cells {
                out.push_str(&format!("  {:14}", cell.cell()));
            }
            out.push('\n');
        }
        for (name, _, cells) in &self.rows {
            for (client, cell) in self.clients.iter().zip(cells) {
                if let Outcome::Fail(why) = cell {
                    out.push_str(&format!("\nFAIL {name} ({client}): {why}\n"));
                }
            }
        }
        out
    }

    /// The table as Markdown (the scenario's title beside its name; failures listed below).
    pub fn markdown(&self) -> String {
        let mut out = String::from("| scenario | outcome every client must show |");
        for client in &self.clients {
            out.push_str(&format!(" {client} |"));
        }
        out.push_str("\n|---|---|");
        out.push_str(&"---|".repeat(self.clients.len()));
        out.push('\n');
        for (name, title, cells) in &self.rows {
            out.push_str(&format!("| `{name}` | {title} |"));
            for cell in cells {
                out.push_str(&format!(" {} |", cell.cell_with_reason().replace('|', "\\|")));
            }
            out.push('\n');
        }
        for (name, _, cells) in &self.rows {
            for (client, cell) in self.clients.iter().zip(cells) {
                if let Outcome::Fail(why) = cell {
                    let first = why.lines().next().unwrap_or_default();
                    out.push_str(&format!("\n- **FAIL** `{name}` ({client}): {first}\n"));
                }
            }
        }
        out
    }
}
