//! The client side of a SASL exchange, for a broker that authenticates to
//! another broker's inter-broker listener as Kafka's brokers do: its
//! mechanism is `sasl.mechanism.inter.broker.protocol`, its user and
//! password the `username` and `password` of the listener's
//! `listener.name.<listener>.<mechanism>.sasl.jaas.config`. No I/O: the
//! caller sends the tokens (SaslAuthenticate after a v1 SaslHandshake).

use rsasl::mechname::Mechname;
use rsasl::prelude::{MessageSent, SASLClient, SASLConfig, Session, State};

use super::{jaas, MECHANISMS, PLAIN};
use crate::{SettingError, Settings};

/// The login module SCRAM's client credentials are given under.
pub const SCRAM_LOGIN_MODULE: &str = "org.apache.kafka.common.security.scram.ScramLoginModule";

/// A user and password for one mechanism.
#[derive(Clone)]
pub struct Login {
    pub mechanism: &'static str,
    pub user: String,
    password: String,
}

impl std::fmt::Debug for Login {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Login")
            .field("mechanism", &self.mechanism)
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

/// The credentials `listener`'s JAAS config gives `mechanism`, checked as
/// Kafka checks a broker's: PLAIN's under `PlainLoginModule`, SCRAM's
/// under `ScramLoginModule`, both with `username` and `password`.
pub fn login(config: &impl Settings, listener: &str, mechanism: &str) -> Result<Login, SettingError> {
    let key = format!(
        "listener.name.{}.{}.sasl.jaas.config",
        listener.to_ascii_lowercase(),
        mechanism.to_ascii_lowercase()
    );
    let fail = |reason: String| SettingError::new(&key, reason);
    let Some(mechanism) = MECHANISMS.iter().copied().find(|m| *m == mechanism) else {
        return Err(SettingError::new(
            "sasl.mechanism.inter.broker.protocol",
            format!("Keel does not offer {mechanism}: use PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"),
        ));
    };
    let module = if mechanism == PLAIN {
        jaas::PLAIN_LOGIN_MODULE
    } else {
        SCRAM_LOGIN_MODULE
    };
    let text = config.set_value(&key).unwrap_or_default();
    if text.trim().is_empty() {
        return Err(fail(format!(
            "a broker authenticates to the inter-broker listener {listener} with {mechanism}: set it to \
             `{module} required username=\"<user>\" password=\"<password>\";`"
        )));
    }
    let entry = jaas::parse(text.trim()).map_err(fail)?;
    if entry.module != module {
        return Err(fail(format!("{mechanism}'s login module is {module}")));
    }
    let option = |name: &str| {
        entry
            .options
            .get(name)
            .filter(|v| !v.is_empty())
            .cloned()
            .ok_or_else(|| fail(format!("the broker's own {name} is not set")))
    };
    Ok(Login {
        mechanism,
        user: option("username")?,
        password: option("password")?,
    })
}

/// What to do after the server's token.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Send this token next.
    Send(Vec<u8>),
    /// The exchange is over and the server proved itself where the
    /// mechanism can (SCRAM's signature).
    Done,
}

/// One exchange in progress.
pub struct Exchange {
    session: Session,
    /// The mechanism has nothing more to read (PLAIN after its one token).
    finished: bool,
}

impl Login {
    /// Starts an exchange: it and the first token to send.
    pub fn start(&self) -> Result<(Exchange, Vec<u8>), String> {
        let config = SASLConfig::with_credentials(None, self.user.clone(), self.password.clone())
            .map_err(|e| format!("SASL {}: {e}", self.mechanism))?;
        let name = Mechname::parse(self.mechanism.as_bytes()).map_err(|e| e.to_string())?;
        let mut session = SASLClient::new(config)
            .start_suggested(&[name])
            .map_err(|e| format!("SASL {}: {e}", self.mechanism))?;
        let mut first = Vec::new();
        let state = session
            .step(None, &mut first)
            .map_err(|e| format!("SASL {}: {e}", self.mechanism))?;
        let exchange = Exchange {
            session,
            finished: !state.is_running(),
        };
        Ok((exchange, first))
    }
}

impl Exchange {
    /// Takes the server's answer to the last token sent (after a success
    /// code: a failure ends the exchange in the caller).
    pub fn step(&mut self, token: &[u8]) -> Result<Step, String> {
        if self.finished {
            return Ok(Step::Done);
        }
        let mut out = Vec::new();
        let state = self
            .session
            .step(Some(token), &mut out)
            .map_err(|e| format!("the server's SASL token: {e}"))?;
        match state {
            State::Running => Ok(Step::Send(out)),
            State::Finished(MessageSent::Yes) => {
                self.finished = true;
                Ok(Step::Send(out))
            }
            State::Finished(MessageSent::No) => {
                self.finished = true;
                Ok(Step::Done)
            }
        }
    }
}
