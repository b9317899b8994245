//! Link spam: too many links, or links through URL shorteners (which hide
//! where they lead), judged more strictly for new authors and for authors
//! not in good standing.
//!
//! The shorteners are the `domains` list named by config `shorteners_list`
//! (default `url-shorteners`), which moderators edit at runtime: a link's
//! host counts if it is a listed domain or a subdomain of one, and the
//! decision records the list version it used. While the host has no list
//! of that name, config `shorteners` (comma-separated domains, default a
//! common list) is used instead.
//!
//! Config: `max_links` (default 3); `new_author_ms` (an author gavel first saw less
//! than this long ago counts as new, default 7 days); `new_author_items`
//! (when the snapshot carries no first-seen time, e.g. a stored snapshot of
//! an older host: an author with fewer recent items counts as new, default
//! 2); `good_states` (comma-separated standing states that count as good,
//! default `good`: an author in any other state, e.g. `watch` or
//! `restricted`, is judged at least as strictly as a new one).

use gavel_plugin_sdk::lists::{self, ListError};
use gavel_plugin_sdk::{Decision, PluginInfo, Rule, Snapshot, export_rule};

pub struct LinkSpam;

/// Seven days: how long an author counts as new by default.
const DEFAULT_NEW_AUTHOR_MS: u64 = 7 * 24 * 3600 * 1000;

/// The list consulted unless config `shorteners_list` names another.
const DEFAULT_LIST: &str = "url-shorteners";

/// The shorteners used while the host has no list and config names none.
pub const DEFAULT_SHORTENERS: &[&str] = &[
    "bit.ly",
    "tinyurl.com",
    "t.co",
    "goo.gl",
    "ow.ly",
    "is.gd",
    "buff.ly",
    "cutt.ly",
    "rebrand.ly",
    "shorturl.at",
];

/// How many of `hosts` go through a URL shortener: asked of the host's
/// list, or (while it has none) of the sidecar config.
fn shortened(snapshot: &Snapshot, hosts: &[String]) -> Result<usize, String> {
    let list = snapshot.config("shorteners_list").unwrap_or(DEFAULT_LIST);
    let mut count = 0;
    for host in hosts {
        match lists::match_domain(list, host) {
            Ok(found) => count += usize::from(found.is_some()),
            Err(ListError::Unknown) => {
                let shorteners = snapshot.config_list("shorteners", DEFAULT_SHORTENERS);
                return Ok(hosts
                    .iter()
                    .filter(|h| shorteners.iter().any(|s| same_or_subdomain(h, s)))
                    .count());
            }
            Err(ListError::WrongKind(kind)) => return Err(format!("list `{list}` holds {kind}, not domains")),
            // A link host the list cannot read is no shortener it names.
            Err(ListError::Invalid(_)) => {}
        }
    }
    Ok(count)
}

/// The host part of every link in `text` (lowercased, without `www.`).
/// Whether `host` is `domain` or one of its subdomains.
fn same_or_subdomain(host: &str, domain: &str) -> bool {
    host.strip_suffix(domain)
        .is_some_and(|rest| rest.is_empty() || rest.ends_with('.'))
}

fn link_hosts(text: &str) -> Vec<String> {
    // Words that cannot start a link are skipped before anything is
    // allocated for them (most words of most posts).
    let may_be_link = |token: &str| {
        token
            .get(..4)
            .is_some_and(|p| p.eq_ignore_ascii_case("http") || p.eq_ignore_ascii_case("www."))
    };
    text.split(|c: char| c.is_whitespace() || matches!(c, '<' | '>' | '"' | '(' | ')' | '[' | ']'))
        .filter(|token| may_be_link(token))
        .filter_map(|token| {
            let lower = token.to_ascii_lowercase();
            let rest = lower
                .strip_prefix("https://")
                .or_else(|| lower.strip_prefix("http://"))
                .or_else(|| lower.starts_with("www.").then_some(lower.as_str()))?;
            let host = rest.split(['/', '?', '#', ':']).next().unwrap_or("");
            let host = host.strip_prefix("www.").unwrap_or(host).trim_end_matches('.');
            (!host.is_empty()).then(|| host.to_string())
        })
        .collect()
}

impl Rule for LinkSpam {
    fn info() -> PluginInfo {
        PluginInfo::new(
            "link-spam",
            "1.2.1",
            "Too many links, or links hidden behind URL shorteners",
        )
    }

    fn evaluate(snapshot: &Snapshot) -> Result<Decision, String> {
        let max_links: usize = snapshot.config_or("max_links", 3)?;
        let new_author_items: u32 = snapshot.config_or("new_author_items", 2)?;
        let new_author_ms: u64 = snapshot.config_or("new_author_ms", DEFAULT_NEW_AUTHOR_MS)?;
        let good_states = snapshot.config_list("good_states", &["good"]);

        let hosts = link_hosts(&snapshot.item.text);
        let shortened = shortened(snapshot, &hosts)?;
        // New: known to gavel for less than `new_author_ms`; without a
        // first-seen time (0), fewer than `new_author_items` recent items.
        let new_author = match snapshot.author_age_ms() {
            Some(age) => age < new_author_ms,
            None => snapshot.author.recent_items < new_author_items,
        };
        let state = &snapshot.author.standing.state;
        let poor_standing = !good_states.iter().any(|g| g == state);
        let strict = new_author || poor_standing;

        if hosts.len() > max_links && shortened > 0 {
            return Ok(
                Decision::reject(format!("{} links, {shortened} through URL shorteners", hosts.len()))
                    .label("link-spam")
                    .label("shortener")
                    .score(0.95),
            );
        }
        if hosts.len() > max_links {
            let decision = Decision::hold(format!("{} links (more than {max_links})", hosts.len())).label("link-spam");
            return Ok(decision.score(if strict { 0.9 } else { 0.7 }));
        }
        if shortened > 0 && strict {
            let reason = if poor_standing {
                format!("author in standing `{state}` posting shortened links")
            } else {
                "new author posting shortened links".to_string()
            };
            return Ok(Decision::hold(reason).label("shortener").score(0.6));
        }
        if shortened > 0 {
            return Ok(Decision::flag("link through a URL shortener")
                .label("shortener")
                .score(0.4));
        }
        Ok(Decision::allow())
    }
}

export_rule!(LinkSpam);

#[cfg(test)]
mod tests {
    use super::*;
    use gavel_plugin_sdk::Verdict;
    use gavel_plugin_sdk::testing::{SnapshotBuilder, run_cases};

    #[test]
    fn shared_cases() {
        run_cases::<LinkSpam>(include_str!("../cases.json"));
    }

    #[test]
    fn hosts_are_extracted_and_normalised() {
        assert_eq!(
            link_hosts("see https://WWW.Example.com/a?b, http://bit.ly/x and www.foo.org."),
            vec!["example.com", "bit.ly", "foo.org"]
        );
        assert!(link_hosts("no links here, just https:// nothing").is_empty());
    }

    #[test]
    fn a_shortener_matches_itself_and_its_subdomains_only() {
        assert!(same_or_subdomain("bit.ly", "bit.ly"));
        assert!(same_or_subdomain("m.bit.ly", "bit.ly"));
        assert!(!same_or_subdomain("notbit.ly", "bit.ly"));
        assert!(!same_or_subdomain("bit.ly.example", "bit.ly"));
    }

    #[test]
    fn subdomain_of_a_shortener_counts() {
        let s = SnapshotBuilder::new()
            .text("go https://m.bit.ly/abc")
            .author_stats(10, 0, 0)
            .build();
        assert_eq!(LinkSpam::evaluate(&s).unwrap().verdict, Verdict::Flag);
    }

    #[test]
    fn bad_config_is_an_error_not_a_silent_default() {
        let s = SnapshotBuilder::new().text("x").config("max_links", "three").build();
        assert!(LinkSpam::evaluate(&s).unwrap_err().contains("max_links"));
        let s = SnapshotBuilder::new().text("x").config("new_author_ms", "7d").build();
        assert!(LinkSpam::evaluate(&s).unwrap_err().contains("new_author_ms"));
    }

    #[test]
    fn the_first_seen_time_decides_who_is_new_when_known() {
        const DAY: u64 = 24 * 3600 * 1000;
        const NOW: u64 = 1_767_225_600_000;
        let shortened = |author_age: u64, recent_items: u32| {
            let s = SnapshotBuilder::new()
                .text("look https://bit.ly/3xyz")
                .author_stats(recent_items, 0, 0)
                .standing("good", 0.0, recent_items, 0, NOW - author_age)
                .now_ms(NOW)
                .build();
            LinkSpam::evaluate(&s).unwrap().verdict
        };
        assert_eq!(
            shortened(DAY, 10),
            Verdict::Hold,
            "first seen a day ago: new, however busy"
        );
        assert_eq!(
            shortened(30 * DAY, 0),
            Verdict::Flag,
            "known for a month: not new, however quiet"
        );
        assert_eq!(
            shortened(7 * DAY, 0),
            Verdict::Flag,
            "new means less than new_author_ms"
        );
        // A first sighting ahead of the host's clock is as new as it gets.
        let ahead = SnapshotBuilder::new()
            .text("look https://bit.ly/3xyz")
            .author_stats(10, 0, 0)
            .standing("good", 0.0, 10, 0, NOW + DAY)
            .now_ms(NOW)
            .build();
        assert_eq!(LinkSpam::evaluate(&ahead).unwrap().verdict, Verdict::Hold);
    }

    #[test]
    fn an_author_not_in_good_standing_is_judged_like_a_new_one() {
        let s = |state: &str| {
            SnapshotBuilder::new()
                .text("look https://bit.ly/3xyz")
                .author_stats(10, 0, 0)
                .standing(state, 2.5, 10, 1, 1)
                .now_ms(1_767_225_600_000)
                .build()
        };
        assert_eq!(LinkSpam::evaluate(&s("good")).unwrap().verdict, Verdict::Flag);
        for state in ["watch", "restricted"] {
            let d = LinkSpam::evaluate(&s(state)).unwrap();
            assert_eq!(d.verdict, Verdict::Hold, "{state}");
            assert!(d.reason.contains(state), "{state}: {}", d.reason);
        }
        let many = SnapshotBuilder::new()
            .text("http://a.example http://b.example http://c.example http://d.example")
            .author_stats(10, 0, 0)
            .standing("watch", 2.5, 10, 1, 1)
            .now_ms(1_767_225_600_000)
            .build();
        assert_eq!(LinkSpam::evaluate(&many).unwrap().score, 0.9);
    }
}
