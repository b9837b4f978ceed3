//! Producer-id blocks for a cluster: one counter in the coordination store
//! (`<prefix>/producer_ids`, the next id no broker has taken), from which
//! each broker takes blocks with a compare-and-swap, so no two brokers ever
//! hand out the same producer id (what Kafka's controller does with
//! AllocateProducerIds).

use std::ops::Range;

use crate::store::{Compare, CoordStore, Op, StoreError};
use crate::Settings;

/// Ids per block, as Kafka's controller hands them out.
pub const BLOCK: i64 = 1000;

/// Takes the next block, starting at `floor` at the lowest (the ids a
/// broker's data directory may have handed out before it joined a
/// cluster).
pub async fn take_block(
    store: &dyn CoordStore,
    settings: &Settings,
    floor: i64,
) -> Result<Range<i64>, StoreError> {
    let key = settings.key("producer_ids");
    loop {
        let (stored, when) = match store.get(&key).await? {
            None => (0, Compare::Absent(key.clone())),
            Some(kv) => {
                let next = std::str::from_utf8(&kv.value)
                    .ok()
                    .and_then(|v| v.trim().parse::<i64>().ok())
                    .ok_or_else(|| StoreError::Refused(format!("{key} holds no producer id")))?;
                (next, Compare::ModRevision(key.clone(), kv.mod_revision))
            }
        };
        let start = stored.max(floor);
        let end = start
            .checked_add(BLOCK)
            .ok_or_else(|| StoreError::Refused("producer ids are exhausted".into()))?;
        let put = Op::Put {
            key: key.clone(),
            value: end.to_string().into_bytes(),
            lease: None,
        };
        if store.txn(vec![when], vec![put]).await?.is_some() {
            return Ok(start..end);
        }
        // Another broker took one meanwhile: take the next.
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::LocalStore;

    fn settings() -> Settings {
        Settings {
            prefix: "/keel".into(),
            session_timeout: Duration::from_secs(6),
            leader_balance: None,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn brokers_taking_blocks_at_once_never_share_an_id() {
        let store = Arc::new(LocalStore::new());
        let mut takers = Vec::new();
        for broker in 0..4 {
            let store = Arc::clone(&store);
            takers.push(tokio::spawn(async move {
                let mut blocks = Vec::new();
                for _ in 0..25 {
                    blocks.push(
                        take_block(store.as_ref(), &settings(), broker * 10)
                            .await
                            .unwrap(),
                    );
                }
                blocks
            }));
        }
        let mut all: Vec<Range<i64>> = Vec::new();
        for t in takers {
            all.extend(t.await.unwrap());
        }
        all.sort_by_key(|r| r.start);
        assert_eq!(all.len(), 100);
        for pair in all.windows(2) {
            assert!(pair[0].end <= pair[1].start, "{pair:?} overlap");
        }
        assert!(all.iter().all(|r| r.end - r.start == BLOCK));
    }

    #[tokio::test]
    async fn a_floor_lifts_the_counter_and_a_lower_one_does_not_lower_it() {
        let store = LocalStore::new();
        assert_eq!(take_block(&store, &settings(), 0).await.unwrap(), 0..BLOCK);
        // A directory that handed out ids up to 5000 alone joins.
        assert_eq!(
            take_block(&store, &settings(), 5000).await.unwrap(),
            5000..5000 + BLOCK
        );
        assert_eq!(
            take_block(&store, &settings(), 0).await.unwrap(),
            6000..6000 + BLOCK
        );
    }
}
