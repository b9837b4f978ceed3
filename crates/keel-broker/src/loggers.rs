//! Kafka's BROKER_LOGGER resource: the broker's loggers and their levels,
//! described with DescribeConfigs and changed at run time with
//! IncrementalAlterConfigs (`kafka-configs --entity-type broker-loggers`).
//! As in Kafka, changes last until the process stops.
//!
//! The process's log subscriber lives in the binary; the broker sees it
//! through [`Loggers`]. The checks on a change are Kafka's and live here.

use std::sync::Arc;

use keel_protocol::ResponseError;

/// Kafka's log levels (`LogLevelConfig.VALID_LOG_LEVELS`).
pub const LEVELS: [&str; 6] = ["FATAL", "ERROR", "WARN", "INFO", "DEBUG", "TRACE"];

/// The root logger: every logger without a level of its own takes its.
pub const ROOT: &str = "root";

/// The process's loggers, as the subscriber holds them.
pub trait Loggers: Send + Sync {
    /// Every logger with a level of its own and the root, as
    /// (name, Kafka level).
    fn levels(&self) -> Vec<(String, String)>;
    /// Whether a logger of that name exists (can take a level).
    fn exists(&self, name: &str) -> bool;
    /// Sets levels (`Some`) and removes them (`None`), all at once. The
    /// changes have passed [`check`].
    fn apply(&self, changes: &[(String, Option<String>)]);
}

/// Levels to set (`Some`) or remove (`None`), by logger.
pub type LevelChanges = Vec<(String, Option<String>)>;

/// One requested change: SET (0) with a level, DELETE (1).
pub struct LoggerChange {
    pub logger: String,
    pub op: i8,
    pub level: Option<String>,
}

/// Checks `changes` as Kafka does and returns them ready for
/// [`Loggers::apply`].
pub fn check(
    loggers: &Arc<dyn Loggers>,
    changes: &[LoggerChange],
) -> Result<LevelChanges, (ResponseError, String)> {
    let mut out: LevelChanges = Vec::with_capacity(changes.len());
    for c in changes {
        if out.iter().any(|(l, _)| *l == c.logger) {
            return Err((
                ResponseError::InvalidRequest,
                "Error due to duplicate config keys".into(),
            ));
        }
        if !loggers.exists(&c.logger) {
            return Err((
                ResponseError::InvalidConfig,
                format!("Logger {} does not exist!", c.logger),
            ));
        }
        match c.op {
            0 => {
                let level = c.level.clone().unwrap_or_default();
                if !LEVELS.contains(&level.as_str()) {
                    return Err((
                        ResponseError::InvalidConfig,
                        format!(
                            "Cannot set the log level of {} to {level} as it is not a supported log \
                             level. Valid log levels are {}",
                            c.logger,
                            LEVELS.join(", ")
                        ),
                    ));
                }
                out.push((c.logger.clone(), Some(level)));
            }
            1 if c.logger == ROOT => {
                return Err((
                    ResponseError::InvalidRequest,
                    "Removing the log level of the root logger is not allowed".into(),
                ))
            }
            1 => out.push((c.logger.clone(), None)),
            2 | 3 => {
                let op = if c.op == 2 { "APPEND" } else { "SUBTRACT" };
                return Err((
                    ResponseError::InvalidRequest,
                    format!("{op} operation is not allowed for the BROKER_LOGGER resource"),
                ));
            }
            other => {
                return Err((
                    ResponseError::InvalidRequest,
                    format!("unknown config operation {other} for {}", c.logger),
                ))
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed;

    impl Loggers for Fixed {
        fn levels(&self) -> Vec<(String, String)> {
            vec![(ROOT.into(), "INFO".into())]
        }
        fn exists(&self, name: &str) -> bool {
            name == ROOT || name.starts_with("keel")
        }
        fn apply(&self, _: &[(String, Option<String>)]) {}
    }

    fn change(logger: &str, op: i8, level: Option<&str>) -> LoggerChange {
        LoggerChange {
            logger: logger.into(),
            op,
            level: level.map(str::to_string),
        }
    }

    #[test]
    fn changes_are_checked_as_kafka_checks_them() {
        let l: Arc<dyn Loggers> = Arc::new(Fixed);
        assert_eq!(
            check(
                &l,
                &[
                    change("keel_broker", 0, Some("DEBUG")),
                    change("keel_log", 1, None)
                ]
            ),
            Ok(vec![
                ("keel_broker".into(), Some("DEBUG".into())),
                ("keel_log".into(), None)
            ])
        );
        let code = |r: Result<_, (ResponseError, String)>| r.unwrap_err().0;
        assert_eq!(
            code(check(&l, &[change("kafka.server", 0, Some("DEBUG"))])),
            ResponseError::InvalidConfig
        );
        assert_eq!(
            code(check(&l, &[change("keel_broker", 0, Some("debug"))])),
            ResponseError::InvalidConfig
        );
        assert_eq!(
            code(check(&l, &[change("keel_broker", 0, None)])),
            ResponseError::InvalidConfig
        );
        assert_eq!(
            code(check(&l, &[change(ROOT, 1, None)])),
            ResponseError::InvalidRequest
        );
        assert_eq!(
            code(check(&l, &[change("keel", 2, Some("INFO"))])),
            ResponseError::InvalidRequest
        );
        assert_eq!(
            code(check(
                &l,
                &[change("keel", 0, Some("INFO")), change("keel", 1, None)]
            )),
            ResponseError::InvalidRequest
        );
    }
}
