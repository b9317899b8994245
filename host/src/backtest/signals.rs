//! Signal values a candidate declares that a stored snapshot does not
//! carry (a new signal, counted only since the candidate was written):
//! recomputed from the stored items, as the live counts would have held
//! them at the snapshot's time. The report counts them by signal
//! (`recomputed_signals`), so a reader knows which values the rule saw
//! live and which were reconstructed.
//!
//! One forward scan of the stored items serves the whole backtest: units
//! come in decision order, so each recomputation only feeds the counts the
//! items created since the previous one (by id, as UUIDv7s sort by time).

use crate::clock::Millis;
use crate::domain::signals::{SignalItem, SignalSpec};
use crate::signals::MemoryCounts;
use crate::store::{Items, StoreResult};
use std::collections::BTreeMap;

/// Items read per page of the scan.
const PAGE: i64 = 1000;

/// The counts of every signal the candidates declare, fed from the store
/// as the replay moves forward in time.
pub(super) struct Recompute {
    counts: Vec<MemoryCounts>,
    /// The scan: the last item fed, and the creation time fed up to.
    after: Option<String>,
    fed_until: Option<Millis>,
}

impl Recompute {
    /// `None` when no candidate declares a signal.
    pub(super) fn for_specs(specs: &[&SignalSpec]) -> Option<Recompute> {
        let mut counts: Vec<MemoryCounts> = Vec::new();
        for spec in specs {
            if !counts.iter().any(|c| c.spec().name == spec.name) {
                counts.push(MemoryCounts::new((*spec).clone(), usize::MAX));
            }
        }
        (!counts.is_empty()).then_some(Recompute {
            counts,
            after: None,
            fed_until: None,
        })
    }

    /// Feeds the stored items created up to `now` (the first call starts
    /// at the earliest window any signal sums at `now`).
    async fn feed(&mut self, store: &dyn Items, now: Millis) -> StoreResult<()> {
        if self.fed_until.is_some_and(|f| f > now) {
            return Ok(());
        }
        let since = match self.fed_until {
            Some(f) => f,
            None => self
                .counts
                .iter()
                .map(|c| c.spec().window().start(now))
                .min()
                .unwrap_or(now),
        };
        loop {
            let page = store.items_created(since, now + 1, self.after.as_deref(), PAGE).await?;
            for item in &page {
                let context = crate::signals::parse_context(&item.context);
                let view = SignalItem::new(&item.author, &item.body, &context);
                for c in &self.counts {
                    let observations = c.spec().observations(&view);
                    c.add(&item.client, item.created_at, &observations);
                }
            }
            if let Some(last) = page.last() {
                self.after = Some(last.id.clone());
            }
            if (page.len() as i64) < PAGE {
                break;
            }
        }
        self.fed_until = Some(now + 1);
        Ok(())
    }

    /// Signal `name`'s values for an item of `client` (`item`'s keys) at
    /// `now`.
    pub(super) async fn values(
        &mut self,
        store: &dyn Items,
        name: &str,
        client: &str,
        item: &SignalItem<'_>,
        now: Millis,
    ) -> StoreResult<BTreeMap<String, u64>> {
        self.feed(store, now).await?;
        let Some(c) = self.counts.iter().find(|c| c.spec().name == name) else {
            return Ok(BTreeMap::new());
        };
        let keys = item.values(&c.spec().key);
        let values = c.values(client, &keys, now);
        Ok(keys.into_iter().zip(values).collect())
    }
}
