//! Group configs (KIP-848): `kafka-configs --entity-type groups`, a
//! consumer group's own `consumer.session.timeout.ms` and
//! `consumer.heartbeat.interval.ms` over the broker's
//! `group.consumer.session.timeout.ms` and
//! `group.consumer.heartbeat.interval.ms`.
//!
//! A change is checked as Kafka's `GroupConfig.validate` checks it (the
//! group's values over the broker's, within the broker's
//! `group.consumer.min.*`/`max.*` bounds, the session longer than the
//! heartbeat interval), written to `__keel_meta/group-configs.json` (a
//! temporary file, fsynced, renamed: the commit point), and then in force:
//! a member's next heartbeat takes them. Share groups' (KIP-932):
//! `share.record.lock.duration.ms`, `share.delivery.count.limit`,
//! `share.partition.max.record.locks`, `share.session.timeout.ms` and
//! `share.heartbeat.interval.ms` over the broker's `group.share.*`,
//! `share.auto.offset.reset` (`earliest`, `latest` or
//! `by_duration:<ISO-8601 duration>`) and
//! `share.isolation.level` and `share.renew.acknowledge.enable`, in
//! force for the next acquisition, acknowledgement, heartbeat or share
//! partition assigned. Kafka's assignment-interval, assignor-offload and
//! streams group configs are refused.
//!
//! In a cluster, group configs are the cluster's: kept in the coordination
//! store (`<prefix>/configs/groups/<group id>`, the group's JSON map), so
//! a change made at any broker is in force at the group's coordinator.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use keel_log::storage::{read_file, write_atomically, Storage};

use keel_config::{BrokerConfig, ConfigType};
use keel_coord::groups::consumer::GroupOverrides;

pub const SESSION_TIMEOUT_MS: &str = "consumer.session.timeout.ms";
pub const HEARTBEAT_INTERVAL_MS: &str = "consumer.heartbeat.interval.ms";

/// The group configs Keel has, each with the broker config that is its
/// default (and its synonym in DescribeConfigs), in Kafka's order.
pub const GROUP_CONFIGS: &[(&str, &str)] = &[
    (SESSION_TIMEOUT_MS, "group.consumer.session.timeout.ms"),
    (HEARTBEAT_INTERVAL_MS, "group.consumer.heartbeat.interval.ms"),
    (SHARE_LOCK_DURATION_MS, "group.share.record.lock.duration.ms"),
    (SHARE_DELIVERY_COUNT_LIMIT, "group.share.delivery.count.limit"),
    (SHARE_MAX_RECORD_LOCKS, "group.share.partition.max.record.locks"),
    (SHARE_SESSION_TIMEOUT_MS, "group.share.session.timeout.ms"),
    (SHARE_HEARTBEAT_INTERVAL_MS, "group.share.heartbeat.interval.ms"),
];

pub const SHARE_LOCK_DURATION_MS: &str = "share.record.lock.duration.ms";
pub const SHARE_DELIVERY_COUNT_LIMIT: &str = "share.delivery.count.limit";
pub const SHARE_MAX_RECORD_LOCKS: &str = "share.partition.max.record.locks";
pub const SHARE_AUTO_OFFSET_RESET: &str = "share.auto.offset.reset";
pub const SHARE_ISOLATION_LEVEL: &str = "share.isolation.level";
pub const SHARE_RENEW_ACKNOWLEDGE_ENABLE: &str = "share.renew.acknowledge.enable";
pub const SHARE_SESSION_TIMEOUT_MS: &str = "share.session.timeout.ms";
pub const SHARE_HEARTBEAT_INTERVAL_MS: &str = "share.heartbeat.interval.ms";

/// Share groups' configs that take one of a few values: name, type,
/// default (no broker config sets it), the values Keel takes
/// (`share.auto.offset.reset` also takes `by_duration:<ISO-8601
/// duration>`, see [`ShareReset`]).
pub const SHARE_CHOICE_CONFIGS: &[(&str, ConfigType, &str, &[&str])] = &[
    (
        SHARE_AUTO_OFFSET_RESET,
        ConfigType::String,
        "latest",
        &["earliest", "latest"],
    ),
    (
        SHARE_ISOLATION_LEVEL,
        ConfigType::String,
        "read_uncommitted",
        &["read_uncommitted", "read_committed"],
    ),
    (
        SHARE_RENEW_ACKNOWLEDGE_ENABLE,
        ConfigType::Boolean,
        "true",
        &["true", "false"],
    ),
];

/// Kafka's other group configs, which Keel refuses by name.
const NOT_IN_KEEL: &[&str] = &[
    "consumer.assignment.interval.ms",
    "share.assignment.interval.ms",
    "share.assignor.offload.enable",
    "streams.",
];

/// The file under the metadata dir.
const FILE: &str = "group-configs.json";

/// Every group's configs, as set (a group without any has no entry).
#[derive(Debug, Default)]
pub struct GroupConfigs {
    by_group: parking_lot::RwLock<BTreeMap<String, BTreeMap<String, String>>>,
    /// In a cluster, where they are kept instead of the file.
    shared: Option<std::sync::Arc<keel_cluster::Membership>>,
}

/// The kind of the cluster's configs groups' are.
const KIND: &str = "groups";

fn path(meta_dir: &Path) -> PathBuf {
    meta_dir.join(FILE)
}

impl GroupConfigs {
    /// The cluster's group configs, kept in its coordination store.
    pub fn shared(cluster: std::sync::Arc<keel_cluster::Membership>) -> GroupConfigs {
        GroupConfigs {
            by_group: Default::default(),
            shared: Some(cluster),
        }
    }

    /// The stored configs (none if the file is not there).
    pub fn load(storage: &dyn Storage, meta_dir: &Path) -> io::Result<GroupConfigs> {
        let path = path(meta_dir);
        let by_group = match read_file(storage, &path)? {
            None => BTreeMap::new(),
            Some(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                io::Error::new(io::ErrorKind::InvalidData, format!("{}: {e}", path.display()))
            })?,
        };
        Ok(GroupConfigs {
            by_group: parking_lot::RwLock::new(by_group),
            shared: None,
        })
    }

    /// Whether they are the cluster's.
    pub fn is_shared(&self) -> bool {
        self.shared.is_some()
    }

    /// What `group` sets.
    pub fn get(&self, group: &str) -> BTreeMap<String, String> {
        self.get_at(group).0
    }

    /// What `group` sets, and in a cluster the revision of its key (what a
    /// change of it compares against; `None`: there is none).
    pub fn get_at(&self, group: &str) -> (BTreeMap<String, String>, Option<i64>) {
        match &self.shared {
            Some(cluster) => match cluster.config(KIND, group) {
                Some((json, revision)) => (serde_json::from_slice(&json).unwrap_or_default(), Some(revision)),
                None => (BTreeMap::new(), None),
            },
            None => (self.by_group.read().get(group).cloned().unwrap_or_default(), None),
        }
    }

    /// The groups that set any config, by name.
    pub fn groups(&self) -> Vec<String> {
        match &self.shared {
            Some(cluster) => cluster
                .config_names(KIND)
                .into_iter()
                .filter(|g| !self.get(g).is_empty())
                .collect(),
            None => self.by_group.read().keys().cloned().collect(),
        }
    }

    /// `group`'s values of the configs its members follow.
    pub fn overrides(&self, group: &str) -> GroupOverrides {
        let set = self.get(group);
        if set.is_empty() {
            return GroupOverrides::default();
        }
        let value = |key: &str| set.get(key).and_then(|v| v.trim().parse().ok());
        GroupOverrides {
            session_timeout_ms: value(SESSION_TIMEOUT_MS),
            heartbeat_interval_ms: value(HEARTBEAT_INTERVAL_MS),
        }
    }

    /// `group`'s share settings: its own over the broker's `group.share.*`.
    pub fn share_limits(
        &self,
        group: &str,
        broker: keel_coord::share::partition::ShareLimits,
    ) -> keel_coord::share::partition::ShareLimits {
        share_limits_of(&self.get(group), broker)
    }

    /// What a ShareFetch or ShareAcknowledge needs of `group`'s configs,
    /// read once: its limits over the broker's, whether it reads
    /// committed records only, whether it may renew locks.
    pub fn share_settings(
        &self,
        group: &str,
        broker: keel_coord::share::partition::ShareLimits,
    ) -> ShareSettings {
        let set = self.get(group);
        ShareSettings {
            limits: share_limits_of(&set, broker),
            read_committed: set
                .get(SHARE_ISOLATION_LEVEL)
                .is_some_and(|v| v.trim() == "read_committed"),
            renew_enabled: set
                .get(SHARE_RENEW_ACKNOWLEDGE_ENABLE)
                .is_none_or(|v| !v.trim().eq_ignore_ascii_case("false")),
        }
    }

    /// `group`'s share membership settings: its own session timeout and
    /// heartbeat interval over the broker's `group.share.*`.
    pub fn share_group_config(
        &self,
        group: &str,
        broker: keel_coord::share::group::ShareGroupConfig,
    ) -> keel_coord::share::group::ShareGroupConfig {
        let set = self.get(group);
        let value = |key: &str| set.get(key).and_then(|v| v.trim().parse::<i32>().ok());
        keel_coord::share::group::ShareGroupConfig {
            session_timeout_ms: value(SHARE_SESSION_TIMEOUT_MS).unwrap_or(broker.session_timeout_ms),
            heartbeat_interval_ms: value(SHARE_HEARTBEAT_INTERVAL_MS).unwrap_or(broker.heartbeat_interval_ms),
            ..broker
        }
    }

    /// Where `group`'s new share partitions start
    /// (`share.auto.offset.reset`).
    pub fn share_reset(&self, group: &str) -> ShareReset {
        self.get(group)
            .get(SHARE_AUTO_OFFSET_RESET)
            .and_then(|v| ShareReset::parse(v))
            .unwrap_or(ShareReset::Latest)
    }

    /// Makes `next` (checked by [`check`]) `group`'s configs: persisted,
    /// then in force. The caller serializes changes (the broker's admin
    /// lock), so the file is written in the order the map changes.
    pub fn set(
        &self,
        storage: &dyn Storage,
        meta_dir: &Path,
        group: &str,
        next: BTreeMap<String, String>,
    ) -> io::Result<()> {
        let mut all = self.by_group.read().clone();
        if next.is_empty() {
            all.remove(group);
        } else {
            all.insert(group.to_string(), next);
        }
        let json = serde_json::to_vec_pretty(&all).map_err(io::Error::other)?;
        write_atomically(storage, &path(meta_dir), &json)?;
        *self.by_group.write() = all;
        Ok(())
    }

    /// Makes `next` `group`'s configs in the cluster (see
    /// [`GroupConfigs::shared`]) if they are still those of `revision`
    /// ([`GroupConfigs::get_at`]), and waits for this broker to see the
    /// outcome. Whether it landed (false: they changed meanwhile).
    pub async fn set_shared(
        &self,
        group: &str,
        next: &BTreeMap<String, String>,
        revision: Option<i64>,
    ) -> Result<bool, String> {
        let cluster = self
            .shared
            .as_ref()
            .ok_or("group configs are this broker's own")?;
        // None left is kept as `{}`, so the key's revision goes on rising.
        let value = serde_json::to_vec(next).expect("a map serializes");
        let landed = cluster
            .put_config(KIND, group, value, revision)
            .await
            .map_err(|e| format!("the cluster's group configs could not be changed: {e}"))?;
        let wait = cluster.settings().session_timeout;
        let seen = match landed {
            Some(at) => cluster.wait_for(at, wait).await,
            None => cluster.wait_for_config_change(KIND, group, revision, wait).await,
        };
        if !seen {
            return Err(format!(
                "this broker did not see the cluster's group configs within {wait:?}"
            ));
        }
        Ok(landed.is_some())
    }
}

/// A share group's settings a ShareFetch or ShareAcknowledge follows.
#[derive(Debug, Clone, Copy)]
pub struct ShareSettings {
    pub limits: keel_coord::share::partition::ShareLimits,
    /// `share.isolation.level` read_committed.
    pub read_committed: bool,
    /// `share.renew.acknowledge.enable` (true unless set false).
    pub renew_enabled: bool,
}

/// A group's share limits from its configs `set`, over the broker's.
fn share_limits_of(
    set: &BTreeMap<String, String>,
    broker: keel_coord::share::partition::ShareLimits,
) -> keel_coord::share::partition::ShareLimits {
    let value = |key: &str| set.get(key).and_then(|v| v.trim().parse::<i64>().ok());
    keel_coord::share::partition::ShareLimits {
        lock_ms: value(SHARE_LOCK_DURATION_MS).unwrap_or(broker.lock_ms),
        delivery_limit: value(SHARE_DELIVERY_COUNT_LIMIT)
            .and_then(|v| i16::try_from(v).ok())
            .unwrap_or(broker.delivery_limit),
        max_in_flight: value(SHARE_MAX_RECORD_LOCKS)
            .and_then(|v| usize::try_from(v).ok())
            .unwrap_or(broker.max_in_flight),
    }
}

/// Where a share group's new share partitions start:
/// `share.auto.offset.reset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShareReset {
    /// `latest`: at the log end.
    Latest,
    /// `earliest`: at the log start.
    Earliest,
    /// `by_duration:<ISO-8601 duration>`: at the first record at most
    /// this many ms old.
    ByDuration(i64),
}

impl ShareReset {
    /// The value's meaning, as Kafka reads it (case-sensitive names; a
    /// duration Java's `Duration.parse` takes, not negative).
    pub fn parse(value: &str) -> Option<ShareReset> {
        match value.trim() {
            "latest" => Some(ShareReset::Latest),
            "earliest" => Some(ShareReset::Earliest),
            v => v
                .strip_prefix("by_duration:")
                .and_then(iso_duration_ms)
                .map(ShareReset::ByDuration),
        }
    }
}

/// An ISO-8601 duration as Java's `Duration.parse` writes it,
/// `PnDTnHnMn.nS` (any part may be left out, but not all; letters in
/// either case), in ms; `None` if it is not one or is out of range.
/// Signs are not taken: Kafka refuses negative durations.
fn iso_duration_ms(text: &str) -> Option<i64> {
    let upper = text.to_ascii_uppercase();
    let rest = upper.strip_prefix('P')?;
    let (date, time) = match rest.split_once('T') {
        Some((d, t)) if !t.is_empty() => (d, Some(t)),
        Some(_) => return None,
        None => (rest, None),
    };
    let mut ms: i64 = 0;
    let mut parts = 0;
    if !date.is_empty() {
        let days = date.strip_suffix('D')?;
        ms = ms.checked_add(digits(days)?.checked_mul(86_400_000)?)?;
        parts += 1;
    }
    let mut time = time.unwrap_or("");
    for (unit, scale) in [('H', 3_600_000i64), ('M', 60_000)] {
        if let Some(at) = time.find(unit) {
            ms = ms.checked_add(digits(&time[..at])?.checked_mul(scale)?)?;
            time = &time[at + 1..];
            parts += 1;
        }
    }
    if !time.is_empty() {
        let seconds = time.strip_suffix('S')?;
        let (whole, fraction) = seconds.split_once('.').unwrap_or((seconds, ""));
        if fraction.len() > 9 || !fraction.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let millis = format!("{fraction:0<3}")[..3].parse::<i64>().ok()?;
        ms = ms
            .checked_add(digits(whole)?.checked_mul(1000)?)?
            .checked_add(millis)?;
        parts += 1;
    }
    (parts > 0).then_some(ms)
}

/// A run of ASCII digits, as a number.
fn digits(s: &str) -> Option<i64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Kafka's checks of a group's configs `next` (`GroupConfig.validate`)
/// under the broker's `config`, with Kafka's messages (INVALID_CONFIG).
pub fn check(config: &BrokerConfig, next: &BTreeMap<String, String>) -> Result<(), String> {
    for (key, value) in next {
        if GROUP_CONFIGS.iter().any(|(name, _)| name == key) {
            continue;
        }
        if key == SHARE_AUTO_OFFSET_RESET {
            if ShareReset::parse(value).is_none() {
                return Err(format!(
                    "Invalid value {value} for configuration {key}: The value must be either \
                     'earliest', 'latest' or of the format 'by_duration:<PnDTnHnMn.nS>'."
                ));
            }
            continue;
        }
        if let Some((_, kind, _, allowed)) = SHARE_CHOICE_CONFIGS.iter().find(|(name, ..)| name == key) {
            // Kafka reads BOOLEAN configs in any case.
            let v = match kind {
                ConfigType::Boolean => value.trim().to_ascii_lowercase(),
                _ => value.trim().to_string(),
            };
            if !allowed.contains(&v.as_str()) {
                return Err(format!(
                    "Invalid value {value} for configuration {key}: Keel takes {}",
                    allowed.join(" or ")
                ));
            }
            continue;
        }
        if NOT_IN_KEEL.iter().any(|p| key.starts_with(p)) {
            return Err(format!(
                "Group config {key} is Apache Kafka's, for what Keel does not have (streams groups, \
                 assignment intervals); \
                 Keel refuses it"
            ));
        }
        return Err(format!("Unknown group config name: {key}"));
    }
    let mut values = BTreeMap::new();
    for (name, broker_key) in GROUP_CONFIGS {
        let value = match next.get(*name) {
            Some(v) => v
                .trim()
                .parse::<i64>()
                .ok()
                .filter(|n| i32::try_from(*n).is_ok())
                .ok_or_else(|| {
                    format!("Invalid value {v} for configuration {name}: Not a number of type INT")
                })?,
            None => config.num(broker_key),
        };
        values.insert(*name, value);
    }
    let bounds = [
        (
            SHARE_LOCK_DURATION_MS,
            "group.share.min.record.lock.duration.ms",
            "group.share.max.record.lock.duration.ms",
        ),
        (
            SHARE_DELIVERY_COUNT_LIMIT,
            "group.share.min.delivery.count.limit",
            "group.share.max.delivery.count.limit",
        ),
        (
            HEARTBEAT_INTERVAL_MS,
            "group.consumer.min.heartbeat.interval.ms",
            "group.consumer.max.heartbeat.interval.ms",
        ),
        (
            SHARE_HEARTBEAT_INTERVAL_MS,
            "group.share.min.heartbeat.interval.ms",
            "group.share.max.heartbeat.interval.ms",
        ),
        (
            SHARE_SESSION_TIMEOUT_MS,
            "group.share.min.session.timeout.ms",
            "group.share.max.session.timeout.ms",
        ),
        (
            SESSION_TIMEOUT_MS,
            "group.consumer.min.session.timeout.ms",
            "group.consumer.max.session.timeout.ms",
        ),
    ];
    for (name, min, max) in bounds {
        if values[name] < config.num(min) {
            return Err(format!("{name} must be greater than or equal to {min}"));
        }
        if values[name] > config.num(max) {
            return Err(format!("{name} must be less than or equal to {max}"));
        }
    }
    if !(100..=10_000).contains(&values[SHARE_MAX_RECORD_LOCKS]) {
        return Err(format!("{SHARE_MAX_RECORD_LOCKS} must be between 100 and 10000"));
    }
    if values[SESSION_TIMEOUT_MS] <= values[HEARTBEAT_INTERVAL_MS] {
        return Err(format!(
            "{SESSION_TIMEOUT_MS} must be greater than {HEARTBEAT_INTERVAL_MS}"
        ));
    }
    if values[SHARE_SESSION_TIMEOUT_MS] <= values[SHARE_HEARTBEAT_INTERVAL_MS] {
        return Err(format!(
            "{SHARE_SESSION_TIMEOUT_MS} must be greater than {SHARE_HEARTBEAT_INTERVAL_MS}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn checks_follow_kafkas_order_and_messages() {
        let config = BrokerConfig::from_map(&BTreeMap::new()).unwrap();
        assert_eq!(check(&config, &set(&[(SESSION_TIMEOUT_MS, "50000")])), Ok(()));
        assert_eq!(check(&config, &BTreeMap::new()), Ok(()));
        let refused = |pairs: &[(&str, &str)]| check(&config, &set(pairs)).unwrap_err();
        assert_eq!(refused(&[("no.such", "1")]), "Unknown group config name: no.such");
        assert!(refused(&[("share.assignment.interval.ms", "1")]).contains("Keel refuses it"));
        assert_eq!(
            refused(&[(SHARE_SESSION_TIMEOUT_MS, "1")]),
            "share.session.timeout.ms must be greater than or equal to group.share.min.session.timeout.ms"
        );
        assert_eq!(
            refused(&[(SHARE_HEARTBEAT_INTERVAL_MS, "20000")]),
            "share.heartbeat.interval.ms must be less than or equal to group.share.max.heartbeat.interval.ms"
        );
        assert_eq!(
            check(
                &config,
                &set(&[
                    (SHARE_SESSION_TIMEOUT_MS, "50000"),
                    (SHARE_HEARTBEAT_INTERVAL_MS, "6000")
                ])
            ),
            Ok(())
        );
        assert_eq!(
            check(&config, &set(&[(SHARE_AUTO_OFFSET_RESET, "earliest")])),
            Ok(())
        );
        assert_eq!(
            check(&config, &set(&[(SHARE_AUTO_OFFSET_RESET, "by_duration:PT1H")])),
            Ok(())
        );
        for bad in [
            "by_duration",
            "by_duration:",
            "by_duration:-PT1H",
            "by_duration:PT",
            "Latest",
            "none",
        ] {
            assert!(
                refused(&[(SHARE_AUTO_OFFSET_RESET, bad)]).contains("'by_duration:<PnDTnHnMn.nS>'"),
                "{bad}"
            );
        }
        assert_eq!(
            refused(&[(SHARE_LOCK_DURATION_MS, "5000")]),
            "share.record.lock.duration.ms must be greater than or equal to group.share.min.record.lock.duration.ms"
        );
        assert_eq!(
            refused(&[(SHARE_DELIVERY_COUNT_LIMIT, "11")]),
            "share.delivery.count.limit must be less than or equal to group.share.max.delivery.count.limit"
        );
        assert!(refused(&[(SHARE_MAX_RECORD_LOCKS, "50")]).contains("between 100 and 10000"));
        assert_eq!(
            refused(&[(SESSION_TIMEOUT_MS, "soon")]),
            "Invalid value soon for configuration consumer.session.timeout.ms: Not a number of type INT"
        );
        assert_eq!(
            refused(&[(SESSION_TIMEOUT_MS, "1000")]),
            "consumer.session.timeout.ms must be greater than or equal to group.consumer.min.session.timeout.ms"
        );
        assert_eq!(
            refused(&[(HEARTBEAT_INTERVAL_MS, "50000"), (SESSION_TIMEOUT_MS, "1000")]),
            "consumer.heartbeat.interval.ms must be less than or equal to group.consumer.max.heartbeat.interval.ms"
        );
        let wide = BrokerConfig::from_map(&set(&[
            ("group.consumer.max.heartbeat.interval.ms", "60000"),
            ("group.consumer.session.timeout.ms", "50000"),
        ]))
        .unwrap();
        assert_eq!(
            check(&wide, &set(&[(HEARTBEAT_INTERVAL_MS, "50000")])).unwrap_err(),
            "consumer.session.timeout.ms must be greater than consumer.heartbeat.interval.ms"
        );
    }

    #[test]
    fn configs_are_stored_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let storage = keel_log::storage::DiskStorage::shared();
        let configs = GroupConfigs::load(storage.as_ref(), dir.path()).unwrap();
        assert_eq!(configs.overrides("g"), GroupOverrides::default());
        configs
            .set(
                storage.as_ref(),
                dir.path(),
                "g",
                set(&[(HEARTBEAT_INTERVAL_MS, "7000")]),
            )
            .unwrap();
        let again = GroupConfigs::load(storage.as_ref(), dir.path()).unwrap();
        assert_eq!(again.overrides("g").heartbeat_interval_ms, Some(7000));
        assert_eq!(again.groups(), vec!["g".to_string()]);
        again
            .set(storage.as_ref(), dir.path(), "g", BTreeMap::new())
            .unwrap();
        assert!(GroupConfigs::load(storage.as_ref(), dir.path())
            .unwrap()
            .groups()
            .is_empty());
    }

    /// `by_duration:` takes what Java's `Duration.parse` does (without
    /// signs), in ms.
    #[test]
    fn share_reset_durations_are_read_as_java_reads_them() {
        let ms = |v: &str| match ShareReset::parse(v) {
            Some(ShareReset::ByDuration(ms)) => Some(ms),
            _ => None,
        };
        assert_eq!(ms("by_duration:PT1H"), Some(3_600_000));
        assert_eq!(ms("by_duration:P1DT2H3M4.5S"), Some(93_784_500));
        assert_eq!(ms("by_duration:p2d"), Some(172_800_000));
        assert_eq!(ms("by_duration:PT0.001S"), Some(1));
        assert_eq!(ms("by_duration:PT90M"), Some(5_400_000));
        for bad in [
            "by_duration:P",
            "by_duration:PT",
            "by_duration:P1H",
            "by_duration:PT1H1D",
            "by_duration:PT1.S5",
        ] {
            assert_eq!(ShareReset::parse(bad), None, "{bad}");
        }
        assert_eq!(ShareReset::parse("earliest"), Some(ShareReset::Earliest));
        assert_eq!(
            ShareReset::parse("by_duration:P99999999999999D"),
            None,
            "out of range"
        );
    }
}
