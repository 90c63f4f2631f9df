//! Timestamps on the wire: RFC 3339, UTC, with milliseconds.

use std::fmt;
use std::time::UNIX_EPOCH;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use settle_core::Timestamp;
use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, SchemaFormat, Type};
use utoipa::openapi::{RefOr, Schema};

/// A point in time from the store's clock, in milliseconds since the Unix
/// epoch; on the wire an RFC 3339 string in UTC with milliseconds
/// (`2023-11-14T22:13:20.123Z`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Time(pub u64);

impl Time {
    /// Milliseconds since the Unix epoch.
    pub fn millis(self) -> u64 {
        self.0
    }
    /// The RFC 3339 text. RFC 3339 ends with year 9999: a later instant
    /// (only a damaged store, or a clock set absurdly far ahead, holds one)
    /// is written as `9999-12-31T23:59:59.999Z`, the end of time, so that
    /// every answer stays within its schema.
    pub fn to_rfc3339(self) -> String {
        Timestamp::from_millis(self.0).to_rfc3339()
    }
    /// Parses RFC 3339 (UTC, `Z`).
    pub fn parse(s: &str) -> Result<Time, humantime::TimestampError> {
        let t = humantime::parse_rfc3339(s)?;
        Ok(Time(
            t.duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
        ))
    }
}

impl From<Timestamp> for Time {
    fn from(t: Timestamp) -> Time {
        Time(t.millis())
    }
}
impl From<Time> for Timestamp {
    fn from(t: Time) -> Timestamp {
        Timestamp::from_millis(t.0)
    }
}

impl fmt::Debug for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&Timestamp::from_millis(self.0), f)
    }
}
impl fmt::Display for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&Timestamp::from_millis(self.0), f)
    }
}

impl Serialize for Time {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_rfc3339())
    }
}
impl<'de> Deserialize<'de> for Time {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Time, D::Error> {
        let s = String::deserialize(d)?;
        Time::parse(&s).map_err(serde::de::Error::custom)
    }
}

impl utoipa::PartialSchema for Time {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::DateTime)))
            .description(Some(
                "RFC 3339, UTC, with milliseconds (the store's clock).",
            ))
            .into()
    }
}
impl utoipa::ToSchema for Time {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_render_rfc3339_with_millis() {
        let t = Time(1_700_000_000_123);
        let s = serde_json::to_string(&t).unwrap();
        assert_eq!(s, "\"2023-11-14T22:13:20.123Z\"");
        assert_eq!(serde_json::from_str::<Time>(&s).unwrap(), t);
        assert!(serde_json::from_str::<Time>("\"yesterday\"").is_err());
    }

    /// Found by the `stored_record` fuzz target: a stored record holding
    /// an instant past year 9999 made serializing its record view panic
    /// (humantime refuses to format it, and `to_string` panics on that).
    #[test]
    fn instants_past_year_9999_render_as_the_end_of_time() {
        let end = "\"9999-12-31T23:59:59.999Z\"";
        for ms in [253_402_300_799_999, 253_402_300_800_000, u64::MAX] {
            assert_eq!(serde_json::to_string(&Time(ms)).unwrap(), end, "{ms}");
        }
        assert_eq!(
            format!("{:?}", Time(u64::MAX)),
            "18446744073709551615 ms after the epoch (past year 9999)"
        );
    }
}
