//! Whole numbers on the wire.
//!
//! JSON has one number type. Fences and generations are integers in the
//! I-JSON safe range `[0, 2^53 − 1]` (SPEC §2, RFC 7493), so every JSON
//! client (JavaScript included) reads them exactly; a larger value sent by
//! a client is refused with 422 naming the field. Integral floats (`7.0`)
//! are accepted where an integer is expected: JSON Schema counts them as
//! integers and some clients send them.

use std::fmt;

use serde::Deserializer;
use settle_core::InvalidInput;

/// `2^53 − 1`, the largest integer every JSON implementation reads exactly.
pub const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// Refuses `v` above [`MAX_SAFE_INTEGER`], naming `field`.
pub fn check_safe(field: &str, v: u64) -> Result<u64, InvalidInput> {
    if v > MAX_SAFE_INTEGER {
        return Err(InvalidInput::new(
            field,
            format!(
                "{v} is above 2^53-1 ({MAX_SAFE_INTEGER}), the largest integer every JSON \
                 client reads exactly"
            ),
        ));
    }
    Ok(v)
}

struct WholeVisitor;

impl serde::de::Visitor<'_> for WholeVisitor {
    type Value = u64;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a non-negative whole number")
    }
    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<u64, E> {
        Ok(v)
    }
    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<u64, E> {
        u64::try_from(v).map_err(|_| E::custom(format!("{v} is negative")))
    }
    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<u64, E> {
        // 2^64 is exactly representable; everything below it with no
        // fraction converts without loss of meaning.
        if v.fract() == 0.0 && (0.0..18_446_744_073_709_551_616.0).contains(&v) {
            Ok(v as u64)
        } else {
            Err(E::custom(format!("{v} is not a non-negative whole number")))
        }
    }
}

/// A whole number: an integer, or a float with no fractional part.
pub fn whole<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    d.deserialize_u64(WholeVisitor)
}

/// [`whole`] for optional fields (`null` is absent).
pub fn opt_whole<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    struct Opt;
    impl<'de> serde::de::Visitor<'de> for Opt {
        type Value = Option<u64>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a non-negative whole number or null")
        }
        fn visit_none<E: serde::de::Error>(self) -> Result<Option<u64>, E> {
            Ok(None)
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Option<u64>, E> {
            Ok(None)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Option<u64>, D::Error> {
            whole(d).map(Some)
        }
    }
    d.deserialize_option(Opt)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize)]
    struct W {
        #[serde(deserialize_with = "whole")]
        n: u64,
        #[serde(default, deserialize_with = "opt_whole")]
        o: Option<u64>,
    }

    #[test]
    fn whole_numbers_may_arrive_as_integral_floats() {
        let w: W = serde_json::from_str(r#"{"n": 7.0, "o": 3.0}"#).unwrap();
        assert_eq!((w.n, w.o), (7, Some(3)));
        let w: W = serde_json::from_str(r#"{"n": 7, "o": null}"#).unwrap();
        assert_eq!((w.n, w.o), (7, None));
        let w: W = serde_json::from_str(r#"{"n": 7}"#).unwrap();
        assert_eq!(w.o, None);
        for bad in [
            r#"{"n": 7.5}"#,
            r#"{"n": -1}"#,
            r#"{"n": "7"}"#,
            r#"{"n": 1, "o": -2.0}"#,
        ] {
            assert!(serde_json::from_str::<W>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_safe_range_ends_at_2_pow_53_minus_1() {
        assert_eq!(check_safe("fence", MAX_SAFE_INTEGER), Ok(MAX_SAFE_INTEGER));
        let e = check_safe("fence", MAX_SAFE_INTEGER + 1).unwrap_err();
        assert_eq!(e.field, "fence");
        assert!(e.reason.contains("2^53-1"), "{}", e.reason);
    }
}
