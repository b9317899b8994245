//! Verdicts, in order of severity, and how several are combined.

super::string_enum! {
    /// What a rule (or a moderator) concludes about an item. Ordered by
    /// severity: `Allow < Flag < Defer < Hold < Reject`. `Defer` hands the item
    /// to an external provider: any stricter verdict makes asking unnecessary,
    /// and it outranks `flag`, which the provider's answer may confirm.
    pub enum Verdict("verdict") {
        Allow = "allow",
        Flag = "flag",
        Defer = "defer",
        Hold = "hold",
        Reject = "reject",
    }
}

impl Verdict {
    /// The most severe of `verdicts`, or `None` when there are none.
    pub fn most_severe(verdicts: impl IntoIterator<Item = Verdict>) -> Option<Verdict> {
        verdicts.into_iter().max()
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
        for &v in Verdict::ALL {
            assert_eq!(v.as_str().parse::<Verdict>(), Ok(v));
        }
        assert!("ban".parse::<Verdict>().is_err());
    }
}
