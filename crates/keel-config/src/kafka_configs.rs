//! The broker configs Apache Kafka defines, for the ones Keel does not use.
//!
//! Kafka accepts a change to any broker config it defines that its update
//! mode allows (read-only, per-broker, cluster-wide), and tools rely on
//! that: librdkafka's admin tests set `sasl.kerberos.min.time.before.relogin`.
//! Keel does the same for Kafka's keys it has no use for (*foreign* keys):
//! it checks them as Kafka does (update mode, value type), stores them with
//! the dynamic broker configs and describes them, saying in their
//! documentation that it does not act on them. Names Kafka does not have
//! stay refused, so that a typo cannot look applied.
//!
//! The table, `kafka_broker_configs.tsv`, is generated from Kafka's jars by
//! `bench/kafka/broker_configs.sh` (name, type, update mode, default).

use std::sync::LazyLock;

use crate::{broker_config_type, ConfigType};

/// How Kafka lets a broker config change at run time
/// (`DynamicBrokerConfig.dynamicConfigUpdateModes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateMode {
    /// Only in `server.properties`.
    ReadOnly,
    /// For one broker, not as the cluster default.
    PerBroker,
    /// For one broker or as the cluster default.
    ClusterWide,
}

/// One of Kafka's broker configs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KafkaBrokerConfig {
    pub name: &'static str,
    pub kind: ConfigType,
    pub mode: UpdateMode,
    /// Kafka's default, as Kafka prints it; `None` when it has none.
    pub default: Option<&'static str>,
}

/// What DescribeConfigs says of a foreign key (its `documentation`, v3+).
pub const NOT_ACTED_ON: &str = "Keel does not act on it: an Apache Kafka broker config Keel has no use for, \
     stored and described as Kafka does so that tools which set it work, and changing nothing in Keel.";

static TABLE: &str = include_str!("kafka_broker_configs.tsv");

/// Sorted by name, as the file is.
static CONFIGS: LazyLock<Vec<KafkaBrokerConfig>> = LazyLock::new(|| parse(TABLE));

/// The file is compiled in, so a malformed line is a build defect: it
/// panics, and a unit test reads the whole table.
fn parse(table: &'static str) -> Vec<KafkaBrokerConfig> {
    let mut configs: Vec<KafkaBrokerConfig> = table
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|line| {
            let fields: Vec<&'static str> = line.split('\t').collect();
            let [name, kind, mode, default] = fields[..] else {
                panic!("kafka_broker_configs.tsv: not 4 fields: {line}");
            };
            KafkaBrokerConfig {
                name,
                kind: kind_of(kind).unwrap_or_else(|| panic!("kafka_broker_configs.tsv: type {kind}")),
                mode: match mode {
                    "read-only" => UpdateMode::ReadOnly,
                    "per-broker" => UpdateMode::PerBroker,
                    "cluster-wide" => UpdateMode::ClusterWide,
                    other => panic!("kafka_broker_configs.tsv: update mode {other}"),
                },
                default: (default != "\\N").then_some(default),
            }
        })
        .collect();
    configs.sort_by_key(|c| c.name);
    configs
}

fn kind_of(name: &str) -> Option<ConfigType> {
    Some(match name {
        "BOOLEAN" => ConfigType::Boolean,
        "STRING" => ConfigType::String,
        "INT" => ConfigType::Int,
        "SHORT" => ConfigType::Short,
        "LONG" => ConfigType::Long,
        "DOUBLE" => ConfigType::Double,
        "LIST" => ConfigType::List,
        "CLASS" => ConfigType::Class,
        "PASSWORD" => ConfigType::Password,
        _ => return None,
    })
}

/// Kafka's definition of a broker config, whether Keel uses it or not.
pub fn kafka_broker_config(name: &str) -> Option<&'static KafkaBrokerConfig> {
    let configs = &*CONFIGS;
    configs
        .binary_search_by(|c| c.name.cmp(name))
        .ok()
        .map(|i| &configs[i])
}

/// A key Kafka defines and Keel does not use.
pub fn foreign(name: &str) -> Option<&'static KafkaBrokerConfig> {
    kafka_broker_config(name).filter(|_| broker_config_type(name).is_none())
}

impl KafkaBrokerConfig {
    /// Checks `value` as Kafka's `ConfigDef` parses its type, with Kafka's
    /// reason. Kafka's validators (ranges, lists of choices) are not
    /// repeated: Keel does not use the value.
    pub fn check(&self, value: &str) -> Result<(), String> {
        let v = value.trim();
        let number = |ok: bool, type_name: &str| match ok {
            true => Ok(()),
            false => Err(format!("Not a number of type {type_name}")),
        };
        match self.kind {
            ConfigType::Boolean if v.eq_ignore_ascii_case("true") || v.eq_ignore_ascii_case("false") => {
                Ok(())
            }
            ConfigType::Boolean => Err("Expected value to be either true or false".into()),
            ConfigType::Int => number(v.parse::<i32>().is_ok(), "INT"),
            ConfigType::Short => number(v.parse::<i16>().is_ok(), "SHORT"),
            ConfigType::Long => number(v.parse::<i64>().is_ok(), "LONG"),
            ConfigType::Double => number(v.parse::<f64>().is_ok(), "DOUBLE"),
            ConfigType::String | ConfigType::List | ConfigType::Class | ConfigType::Password => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_whole_table_reads_and_is_sorted() {
        let configs = &*CONFIGS;
        assert!(configs.len() > 300, "{} configs", configs.len());
        assert!(configs.windows(2).all(|w| w[0].name < w[1].name));
        let relogin = kafka_broker_config("sasl.kerberos.min.time.before.relogin").unwrap();
        assert_eq!(
            (relogin.kind, relogin.mode, relogin.default),
            (ConfigType::Long, UpdateMode::PerBroker, Some("60000"))
        );
        assert_eq!(
            kafka_broker_config("queued.max.requests").map(|c| c.mode),
            Some(UpdateMode::ReadOnly)
        );
        assert_eq!(kafka_broker_config("keel.tail.cache.bytes"), None);
    }

    #[test]
    fn keys_keel_uses_are_not_foreign() {
        assert!(foreign("log.retention.ms").is_none() && kafka_broker_config("log.retention.ms").is_some());
        assert!(foreign("num.io.threads").is_some());
        assert!(foreign("no.such.config").is_none());
    }

    #[test]
    fn values_are_checked_by_kafkas_type() {
        let relogin = kafka_broker_config("sasl.kerberos.min.time.before.relogin").unwrap();
        assert_eq!(relogin.check(" 60001 "), Ok(()));
        assert_eq!(relogin.check("abc"), Err("Not a number of type LONG".into()));
        let flag = kafka_broker_config("auto.create.topics.enable").unwrap();
        assert_eq!(flag.check("TRUE"), Ok(()));
        assert_eq!(
            flag.check("yes"),
            Err("Expected value to be either true or false".into())
        );
    }
}
