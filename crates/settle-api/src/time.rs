//! Timestamps on the wire: RFC 3339, UTC, with milliseconds.

use std::fmt;
use std::time::UNIX_EPOCH;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use settle_core::Timestamp;
use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, SchemaFormat, Type};
use utoipa::openapi::{RefOr, Schema};

/// The last instant RFC 3339 can write, `9999-12-31T23:59:59.999Z`
/// (the core's bound; later instants are written as it).
const LAST_RFC3339_MS: u64 = 253_402_300_799_999;

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
        let mut buf = [0u8; 24];
        self.write_rfc3339(&mut buf).to_string()
    }
    /// [`Time::to_rfc3339`] into `buf`, without humantime's formatter or
    /// an allocation (every answer carries one or two timestamps).
    fn write_rfc3339(self, buf: &mut [u8; 24]) -> &str {
        let ms = self.0.min(LAST_RFC3339_MS);
        let (secs, milli) = (ms / 1000, ms % 1000);
        let (days, sod) = (secs / 86_400, secs % 86_400);
        // Days since 1970-01-01 to the civil date (H. Hinnant's
        // `civil_from_days`; every instant here is at or after the epoch).
        let z = days + 719_468;
        let era = z / 146_097;
        let doe = z % 146_097;
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = doy - (153 * mp + 2) / 5 + 1;
        let month = if mp < 10 { mp + 3 } else { mp - 9 };
        let year = yoe + era * 400 + u64::from(month <= 2);
        let mut put = |at: usize, v: u64, width: usize| {
            let mut v = v;
            for i in (at..at + width).rev() {
                buf[i] = b'0' + (v % 10) as u8;
                v /= 10;
            }
        };
        put(0, year, 4);
        put(5, month, 2);
        put(8, day, 2);
        put(11, sod / 3600, 2);
        put(14, sod / 60 % 60, 2);
        put(17, sod % 60, 2);
        put(20, milli, 3);
        for (i, c) in [
            (4, b'-'),
            (7, b'-'),
            (10, b'T'),
            (13, b':'),
            (16, b':'),
            (19, b'.'),
            (23, b'Z'),
        ] {
            buf[i] = c;
        }
        std::str::from_utf8(buf).expect("digits and separators are ASCII")
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
        let mut buf = [0u8; 24];
        s.serialize_str(self.write_rfc3339(&mut buf))
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

    /// The formatter here writes what the core's (humantime) writes.
    #[test]
    fn the_same_text_as_the_core() {
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut cases = vec![
            0,
            1,
            999,
            1000,
            86_399_999,
            86_400_000,
            951_782_400_000,   // 2000-02-29
            4_107_542_400_000, // 2100-03-01
            1_700_000_000_123,
            LAST_RFC3339_MS - 1,
            LAST_RFC3339_MS,
            LAST_RFC3339_MS + 1,
            u64::MAX,
        ];
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            cases.push(x % (LAST_RFC3339_MS + 1000));
        }
        for ms in cases {
            let core = Timestamp::from_millis(ms.min(LAST_RFC3339_MS)).to_rfc3339();
            assert_eq!(Time(ms).to_rfc3339(), core, "{ms}");
            assert_eq!(
                serde_json::to_string(&Time(ms)).unwrap(),
                format!("\"{core}\"")
            );
        }
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
