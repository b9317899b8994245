//! Verdicts, in order of severity, and how several are combined.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// What a rule (or a moderator) concludes about an item. Ordered by
/// severity: `Allow < Flag < Defer < Hold < Reject`. `Defer` hands the item
/// to an external provider: any stricter verdict makes asking unnecessary,
/// and it outranks `flag`, which the provider's answer may confirm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Allow,
    Flag,
    Defer,
    Hold,
    Reject,
}

impl Verdict {
    pub const ALL: [Verdict; 5] = [
        Verdict::Allow,
        Verdict::Flag,
        Verdict::Defer,
        Verdict::Hold,
        Verdict::Reject,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Allow => "allow",
            Verdict::Flag => "flag",
            Verdict::Defer => "defer",
            Verdict::Hold => "hold",
            Verdict::Reject => "reject",
        }
    }

    /// The most severe of `verdicts`, or `None` when there are none.
    pub fn most_severe(verdicts: impl IntoIterator<Item = Verdict>) -> Option<Verdict> {
        verdicts.into_iter().max()
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Verdict {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Verdict::ALL
            .into_iter()
            .find(|v| v.as_str() == s)
            .ok_or_else(|| format!("unknown verdict {s:?}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn severity_order_and_combination() {
        assert!(Verdict::Allow < Verdict::Flag && Verdict::Flag < Verdict::Defer);
        assert!(Verdict::Defer < Verdict::Hold && Verdict::Hold < Verdict::Reject);
        assert_eq!(
            Verdict::most_severe([Verdict::Flag, Verdict::Allow, Verdict::Hold]),
            Some(Verdict::Hold)
        );
        assert_eq!(Verdict::most_severe([]), None);
    }

    #[test]
    fn names_round_trip() {
        for v in Verdict::ALL {
            assert_eq!(v.as_str().parse::<Verdict>(), Ok(v));
        }
        assert!("ban".parse::<Verdict>().is_err());
    }
}
