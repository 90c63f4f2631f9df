//! What the proxy decides: call names, rules and their JSON form, the
//! per-rule counters and the log.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The name of a call to settle's API, from its method and path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Call {
    /// `POST /v1/operations/{key}/claim`
    Claim,
    /// `POST /v1/operations/{key}/heartbeat`
    Heartbeat,
    /// `POST /v1/operations/{key}/dispatch`
    Dispatch,
    /// `POST /v1/operations/{key}/settle`
    Settle,
    /// `POST /v1/operations/{key}/release`
    Release,
    /// `POST /v1/operations/{key}/reconcile`
    Reconcile,
    /// `GET /v1/operations/{key}`
    Get,
    /// `GET /v1/operations` (any query)
    List,
    /// `GET /v1/principals/{principal}`
    Principal,
    /// `POST /v1/principals/{principal}/revoke`
    Revoke,
    /// `POST /v1/batch`
    Batch,
    /// Anything else.
    Other,
}

impl Call {
    /// Every call, in declaration order.
    pub const ALL: [Call; 12] = [
        Call::Claim,
        Call::Heartbeat,
        Call::Dispatch,
        Call::Settle,
        Call::Release,
        Call::Reconcile,
        Call::Get,
        Call::List,
        Call::Principal,
        Call::Revoke,
        Call::Batch,
        Call::Other,
    ];

    /// The wire name (`"claim"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Call::Claim => "claim",
            Call::Heartbeat => "heartbeat",
            Call::Dispatch => "dispatch",
            Call::Settle => "settle",
            Call::Release => "release",
            Call::Reconcile => "reconcile",
            Call::Get => "get",
            Call::List => "list",
            Call::Principal => "principal",
            Call::Revoke => "revoke",
            Call::Batch => "batch",
            Call::Other => "other",
        }
    }

    /// The call named `name`, if any.
    pub fn from_name(name: &str) -> Option<Call> {
        Call::ALL.into_iter().find(|c| c.as_str() == name)
    }

    /// Classifies a request: its call and its key (the percent-decoded
    /// operation key, or the principal for `principal` and `revoke`).
    pub fn classify(method: &str, path: &str) -> (Call, Option<String>) {
        let path = path.split('?').next().unwrap_or_default();
        let segments: Vec<&str> = path.split('/').collect();
        let call = match (method, segments.as_slice()) {
            ("GET", ["", "v1", "operations"]) => Call::List,
            ("POST", ["", "v1", "batch"]) => Call::Batch,
            ("GET", ["", "v1", "operations", key]) if !key.is_empty() => {
                return (Call::Get, Some(percent_decode(key)));
            }
            ("GET", ["", "v1", "principals", p]) if !p.is_empty() => {
                return (Call::Principal, Some(percent_decode(p)));
            }
            ("POST", ["", "v1", "principals", p, "revoke"]) if !p.is_empty() => {
                return (Call::Revoke, Some(percent_decode(p)));
            }
            ("POST", ["", "v1", "operations", key, verb]) if !key.is_empty() => {
                match Call::from_name(verb) {
                    Some(
                        call @ (Call::Claim
                        | Call::Heartbeat
                        | Call::Dispatch
                        | Call::Settle
                        | Call::Release
                        | Call::Reconcile),
                    ) => return (call, Some(percent_decode(key))),
                    _ => Call::Other,
                }
            }
            _ => Call::Other,
        };
        (call, None)
    }
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Decodes `%XX` escapes; a malformed escape stays as it is, bytes that
/// are not UTF-8 become U+FFFD.
fn percent_decode(segment: &str) -> String {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && let (Some(&h), Some(&l)) = (bytes.get(i + 1), bytes.get(i + 2))
            && let (Some(h), Some(l)) = (hex(h), hex(l))
        {
            out.push((h * 16 + l) as u8);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What a rule does to the calls it fires on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Forward the request, read the whole answer, then close the client's
    /// connection without writing a byte of it (a lost answer).
    DropAnswer,
    /// Read the request, then close the client's connection without
    /// forwarding anything.
    CutBefore,
    /// Answer this status with a problem+json body, without forwarding;
    /// 429 and 503 carry `Retry-After: retry_after_s`.
    Status {
        /// The status, 400 to 599.
        status: u16,
        /// The `Retry-After` seconds of a 429 or 503.
        retry_after_s: u64,
    },
    /// Wait, then forward normally.
    Delay {
        /// How long to wait, in milliseconds.
        delay_ms: u64,
    },
}

/// A fault: which calls it matches, from which match on and how often it
/// fires, and what it does. Its JSON form is the control API's (README.md).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RuleWire", into = "RuleWire")]
pub struct Rule {
    /// The call it matches; `None` (`"*"`) matches every call.
    pub call: Option<Call>,
    /// The exact decoded key it matches; `None` matches any key.
    pub key: Option<String>,
    /// It fires from the nth matching call on (1-based), counted since the
    /// rules were set.
    pub nth: u64,
    /// On how many matching calls it fires; `None` on every one from the nth.
    pub times: Option<u64>,
    /// What it does.
    pub action: Action,
}

impl Rule {
    /// A rule firing `action` on the first call named `call` (`None`: any).
    pub fn new(call: impl Into<Option<Call>>, action: Action) -> Rule {
        Rule {
            call: call.into(),
            key: None,
            nth: 1,
            times: Some(1),
            action,
        }
    }

    /// Only calls on this (decoded) key match.
    #[must_use]
    pub fn key(mut self, key: impl Into<String>) -> Rule {
        self.key = Some(key.into());
        self
    }

    /// Fires from the nth matching call on.
    #[must_use]
    pub fn nth(mut self, nth: u64) -> Rule {
        self.nth = nth;
        self
    }

    /// Fires on `times` matching calls.
    #[must_use]
    pub fn times(mut self, times: u64) -> Rule {
        self.times = Some(times);
        self
    }

    /// Fires on every matching call from the nth on.
    #[must_use]
    pub fn always(mut self) -> Rule {
        self.times = None;
        self
    }

    fn matches(&self, call: Call, key: Option<&str>) -> bool {
        self.call.is_none_or(|c| c == call) && self.key.as_deref().is_none_or(|k| Some(k) == key)
    }
}

/// Why a rule's JSON was refused.
#[derive(Debug, thiserror::Error)]
pub enum RuleError {
    /// `call` is not a call name nor `"*"`.
    #[error("unknown call {0:?}")]
    UnknownCall(String),
    /// `nth` or `times` is zero.
    #[error("{0} must be at least 1")]
    Zero(&'static str),
    /// `times` is a string other than `"all"`.
    #[error("times must be a number, null or \"all\", not {0:?}")]
    BadTimes(String),
    /// A field the action needs is missing.
    #[error("action {action} needs {field}")]
    Missing {
        /// The action.
        action: &'static str,
        /// The missing field.
        field: &'static str,
    },
    /// A field given for an action it does not apply to.
    #[error("{field} does not apply to action {action}")]
    NotApplicable {
        /// The action.
        action: &'static str,
        /// The extra field.
        field: &'static str,
    },
    /// A status outside 400..=599.
    #[error("status must be within 400..=599, not {0}")]
    BadStatus(u16),
}

#[derive(Clone, Copy, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum ActionName {
    DropAnswer,
    CutBefore,
    Status,
    Delay,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleWire {
    call: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    key: Option<String>,
    #[serde(default = "one")]
    nth: u64,
    #[serde(
        default = "once",
        deserialize_with = "de_times",
        serialize_with = "ser_times"
    )]
    times: Option<u64>,
    action: ActionName,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    status: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    retry_after_s: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    delay_ms: Option<u64>,
}

fn one() -> u64 {
    1
}

fn once() -> Option<u64> {
    Some(1)
}

fn de_times<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Times {
        N(u64),
        S(String),
    }
    match Option::<Times>::deserialize(d)? {
        None => Ok(None),
        Some(Times::S(s)) if s == "all" => Ok(None),
        Some(Times::S(s)) => Err(serde::de::Error::custom(RuleError::BadTimes(s))),
        Some(Times::N(n)) => Ok(Some(n)),
    }
}

fn ser_times<S: Serializer>(times: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
    match times {
        Some(n) => s.serialize_u64(*n),
        None => s.serialize_str("all"),
    }
}

impl TryFrom<RuleWire> for Rule {
    type Error = RuleError;

    fn try_from(w: RuleWire) -> Result<Rule, RuleError> {
        let call = match w.call.as_str() {
            "*" => None,
            name => Some(Call::from_name(name).ok_or(RuleError::UnknownCall(w.call.clone()))?),
        };
        if w.nth == 0 {
            return Err(RuleError::Zero("nth"));
        }
        if w.times == Some(0) {
            return Err(RuleError::Zero("times"));
        }
        let (name, action) = match w.action {
            ActionName::DropAnswer => ("drop_answer", Action::DropAnswer),
            ActionName::CutBefore => ("cut_before", Action::CutBefore),
            ActionName::Status => {
                let status = w.status.ok_or(RuleError::Missing {
                    action: "status",
                    field: "status",
                })?;
                if !(400..=599).contains(&status) {
                    return Err(RuleError::BadStatus(status));
                }
                (
                    "status",
                    Action::Status {
                        status,
                        retry_after_s: w.retry_after_s.unwrap_or(1),
                    },
                )
            }
            ActionName::Delay => {
                let delay_ms = w.delay_ms.ok_or(RuleError::Missing {
                    action: "delay",
                    field: "delay_ms",
                })?;
                ("delay", Action::Delay { delay_ms })
            }
        };
        let given = [
            ("status", w.status.is_some(), name == "status"),
            ("retry_after_s", w.retry_after_s.is_some(), name == "status"),
            ("delay_ms", w.delay_ms.is_some(), name == "delay"),
        ];
        if let Some((field, ..)) = given
            .into_iter()
            .find(|&(_, given, applies)| given && !applies)
        {
            return Err(RuleError::NotApplicable {
                action: name,
                field,
            });
        }
        Ok(Rule {
            call,
            key: w.key,
            nth: w.nth,
            times: w.times,
            action,
        })
    }
}

impl From<Rule> for RuleWire {
    fn from(r: Rule) -> RuleWire {
        let (action, status, retry_after_s, delay_ms) = match r.action {
            Action::DropAnswer => (ActionName::DropAnswer, None, None, None),
            Action::CutBefore => (ActionName::CutBefore, None, None, None),
            Action::Status {
                status,
                retry_after_s,
            } => (ActionName::Status, Some(status), Some(retry_after_s), None),
            Action::Delay { delay_ms } => (ActionName::Delay, None, None, Some(delay_ms)),
        };
        RuleWire {
            call: r.call.map_or("*", Call::as_str).to_owned(),
            key: r.key,
            nth: r.nth,
            times: r.times,
            action,
            status,
            retry_after_s,
            delay_ms,
        }
    }
}

/// What the proxy did with a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Taken {
    /// No rule fired: forwarded.
    Forwarded,
    /// Forwarded, answer dropped, connection closed.
    DropAnswer,
    /// Connection closed, nothing forwarded.
    CutBefore,
    /// Answered an injected status, nothing forwarded.
    Status,
    /// Delayed, then forwarded.
    Delay,
}

/// One call the proxy saw (control API calls are not logged).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoggedCall {
    /// Its name.
    pub call: Call,
    /// Its decoded key (the principal for `principal` and `revoke`).
    pub key: Option<String>,
    /// The request method.
    pub method: String,
    /// The request path as sent, without the query.
    pub path: String,
    /// The query as sent (after `?`), if any: a listing's filters.
    pub query: Option<String>,
    /// What the proxy did.
    pub action: Taken,
    /// What the upstream answered; `None` when not forwarded or no answer.
    pub upstream_status: Option<u16>,
}

/// Where a call's log entry is, to record the upstream's status later.
#[derive(Clone, Copy)]
pub(crate) struct Slot {
    generation: u64,
    index: usize,
}

/// The rules with their match counters, and the log.
#[derive(Default)]
pub(crate) struct State {
    rules: Vec<(Rule, u64)>,
    log: Vec<LoggedCall>,
    generation: u64,
}

impl State {
    /// Replaces the rules; counters and log start over.
    pub(crate) fn set_rules(&mut self, rules: Vec<Rule>) {
        self.rules = rules.into_iter().map(|r| (r, 0)).collect();
        self.log.clear();
        self.generation += 1;
    }

    pub(crate) fn rules(&self) -> Vec<Rule> {
        self.rules.iter().map(|(r, _)| r.clone()).collect()
    }

    pub(crate) fn log(&self) -> Vec<LoggedCall> {
        self.log.clone()
    }

    /// Counts the call against every rule it matches, logs it and returns
    /// the action of the first rule that fires.
    pub(crate) fn decide(
        &mut self,
        call: Call,
        key: Option<String>,
        method: &str,
        path: &str,
        query: Option<String>,
    ) -> (Option<Action>, Slot) {
        let mut chosen = None;
        for (rule, count) in &mut self.rules {
            if !rule.matches(call, key.as_deref()) {
                continue;
            }
            *count += 1;
            let fires = *count >= rule.nth && rule.times.is_none_or(|t| *count < rule.nth + t);
            if fires && chosen.is_none() {
                chosen = Some(rule.action.clone());
            }
        }
        let action = match chosen {
            None => Taken::Forwarded,
            Some(Action::DropAnswer) => Taken::DropAnswer,
            Some(Action::CutBefore) => Taken::CutBefore,
            Some(Action::Status { .. }) => Taken::Status,
            Some(Action::Delay { .. }) => Taken::Delay,
        };
        self.log.push(LoggedCall {
            call,
            key,
            method: method.to_owned(),
            path: path.to_owned(),
            query,
            action,
            upstream_status: None,
        });
        let slot = Slot {
            generation: self.generation,
            index: self.log.len() - 1,
        };
        (chosen, slot)
    }

    /// Records the upstream's status, unless the log was cleared since.
    pub(crate) fn answered(&mut self, slot: Slot, status: u16) {
        if slot.generation == self.generation
            && let Some(entry) = self.log.get_mut(slot.index)
        {
            entry.upstream_status = Some(status);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_settle_calls() {
        let c = |m, p| Call::classify(m, p);
        assert_eq!(
            c("POST", "/v1/operations/a%20b%2Fc/claim"),
            (Call::Claim, Some("a b/c".into()))
        );
        assert_eq!(
            c("POST", "/v1/operations/k/reconcile"),
            (Call::Reconcile, Some("k".into()))
        );
        assert_eq!(
            c("POST", "/v1/operations/k/frobnicate"),
            (Call::Other, None)
        );
        assert_eq!(c("GET", "/v1/operations/k"), (Call::Get, Some("k".into())));
        assert_eq!(
            c("GET", "/v1/operations?limit=5&state=open"),
            (Call::List, None)
        );
        assert_eq!(
            c("GET", "/v1/principals/p%3A1"),
            (Call::Principal, Some("p:1".into()))
        );
        assert_eq!(
            c("POST", "/v1/principals/p/revoke"),
            (Call::Revoke, Some("p".into()))
        );
        assert_eq!(c("POST", "/v1/batch"), (Call::Batch, None));
        assert_eq!(c("GET", "/v1/batch"), (Call::Other, None));
        assert_eq!(c("GET", "/healthz"), (Call::Other, None));
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
    }

    #[test]
    fn rule_json_round_trips_and_refuses_mistakes() {
        let r: Rule = serde_json::from_str(
            r#"{"call":"claim","times":"all","action":"status","status":503}"#,
        )
        .unwrap();
        assert_eq!(
            r,
            Rule::new(
                Call::Claim,
                Action::Status {
                    status: 503,
                    retry_after_s: 1
                }
            )
            .always()
        );
        let back: Rule = serde_json::from_value(serde_json::to_value(&r).unwrap()).unwrap();
        assert_eq!(back, r);
        let r: Rule =
            serde_json::from_str(r#"{"call":"*","times":null,"action":"cut_before"}"#).unwrap();
        assert_eq!((r.call, r.times, r.nth), (None, None, 1));
        for bad in [
            r#"{"call":"claim","action":"explode"}"#,
            r#"{"call":"claim","action":"drop_answer","colour":1}"#,
            r#"{"call":"clam","action":"drop_answer"}"#,
            r#"{"call":"claim","action":"status"}"#,
            r#"{"call":"claim","action":"delay"}"#,
            r#"{"call":"claim","action":"drop_answer","delay_ms":5}"#,
            r#"{"call":"claim","action":"drop_answer","nth":0}"#,
            r#"{"call":"claim","action":"drop_answer","times":"some"}"#,
            r#"{"action":"drop_answer"}"#,
        ] {
            assert!(serde_json::from_str::<Rule>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn rules_count_their_own_matches_and_the_first_firing_wins() {
        let mut s = State::default();
        s.set_rules(vec![
            Rule::new(Call::Claim, Action::CutBefore).nth(2),
            Rule::new(None, Action::DropAnswer).nth(2).times(2),
        ]);
        let mut decide = |call| s.decide(call, Some("k".into()), "POST", "/", None).0;
        assert_eq!(decide(Call::Claim), None);
        assert_eq!(decide(Call::Claim), Some(Action::CutBefore));
        assert_eq!(decide(Call::Settle), Some(Action::DropAnswer));
        assert_eq!(decide(Call::Claim), None);
    }
}
