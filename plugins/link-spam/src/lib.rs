//! Link spam: too many links, or links through URL shorteners (which hide
//! where they lead). Config: `max_links` (default 3), `shorteners`
//! (comma-separated domains, default a common list), `new_author_items`
//! (an author with fewer recent items counts as new, default 2).

use gavel_plugin_sdk::{Decision, PluginInfo, Rule, Snapshot, export_rule};

pub struct LinkSpam;

const DEFAULT_SHORTENERS: &[&str] = &[
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

/// The host part of every link in `text` (lowercased, without `www.`).
fn link_hosts(text: &str) -> Vec<String> {
    text.split(|c: char| c.is_whitespace() || matches!(c, '<' | '>' | '"' | '(' | ')' | '[' | ']'))
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
            "1.0.0",
            "Too many links, or links hidden behind URL shorteners",
        )
    }

    fn evaluate(snapshot: &Snapshot) -> Result<Decision, String> {
        let max_links: usize = snapshot.config_or("max_links", 3)?;
        let new_author_items: u32 = snapshot.config_or("new_author_items", 2)?;
        let shorteners = snapshot.config_list("shorteners", DEFAULT_SHORTENERS);

        let hosts = link_hosts(&snapshot.item.text);
        let shortened = hosts
            .iter()
            .filter(|h| shorteners.iter().any(|s| *h == s || h.ends_with(&format!(".{s}"))))
            .count();
        let new_author = snapshot.author.recent_items < new_author_items;

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
            return Ok(decision.score(if new_author { 0.9 } else { 0.7 }));
        }
        if shortened > 0 && new_author {
            return Ok(Decision::hold("new author posting shortened links")
                .label("shortener")
                .score(0.6));
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
    }
}
