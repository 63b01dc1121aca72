//! Kubernetes resource quantities (`64Mi`, `1G`, `1.5Gi`, `128974848`, `129e6`),
//! converted to a whole number of bytes, rounded up as the API server does.

/// A quantity string that is not a valid byte count.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid quantity {0:?}: expected a number with an optional suffix (Ki, Mi, Gi, Ti, Pi, Ei, k, M, G, T, P, E or an exponent)")]
pub struct QuantityError(pub String);

/// Parses `q` into bytes. Negative values and values above `u64::MAX` are errors.
pub fn parse_bytes(q: &str) -> Result<u64, QuantityError> {
    parse_scaled(q, 0)
}

/// Parses `q` into thousandths (the API's `MilliValue`, rounded up):
/// `500m` → 500, `2` → 2000.
pub fn parse_milli(q: &str) -> Result<u64, QuantityError> {
    parse_scaled(q, 3)
}

/// `q` × 10^`exp10`, rounded up to a whole number.
fn parse_scaled(q: &str, exp10_extra: i32) -> Result<u64, QuantityError> {
    let err = || QuantityError(q.to_string());
    let s = q.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    let (mut mantissa, mut scale) = parse_decimal(number).ok_or_else(err)?;
    let (mul, exp10): (u128, i32) = match suffix {
        "" => (1, 0),
        "Ki" => (1 << 10, 0),
        "Mi" => (1 << 20, 0),
        "Gi" => (1 << 30, 0),
        "Ti" => (1 << 40, 0),
        "Pi" => (1 << 50, 0),
        "Ei" => (1 << 60, 0),
        "m" => (1, -3),
        "k" => (1, 3),
        "M" => (1, 6),
        "G" => (1, 9),
        "T" => (1, 12),
        "P" => (1, 15),
        "E" => (1, 18),
        e if e.starts_with(['e', 'E']) => (1, e[1..].parse::<i32>().map_err(|_| err())?),
        _ => return Err(err()),
    };
    mantissa = mantissa.checked_mul(mul).ok_or_else(err)?;
    scale -= exp10 + exp10_extra;
    // value = mantissa / 10^scale, rounded up.
    while scale < 0 {
        mantissa = mantissa.checked_mul(10).ok_or_else(err)?;
        scale += 1;
    }
    let div = 10u128
        .checked_pow(u32::try_from(scale).map_err(|_| err())?)
        .ok_or_else(err)?;
    let bytes = mantissa.div_ceil(div);
    u64::try_from(bytes).map_err(|_| err())
}

/// Parses an unsigned decimal into (digits, digits after the point).
fn parse_decimal(s: &str) -> Option<(u128, i32)> {
    let s = s.strip_prefix('+').unwrap_or(s);
    if s.is_empty() || s.starts_with('-') {
        return None;
    }
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    if !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit()) {
        return None;
    }
    let digits = format!("{int}{frac}");
    let m = digits.parse::<u128>().ok()?;
    Some((m, i32::try_from(frac.len()).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_suffixes() {
        assert_eq!(parse_bytes("0").unwrap(), 0);
        assert_eq!(parse_bytes("128974848").unwrap(), 128_974_848);
        assert_eq!(parse_bytes("64Mi").unwrap(), 64 << 20);
        assert_eq!(parse_bytes("1Gi").unwrap(), 1 << 30);
        assert_eq!(parse_bytes("1.5Gi").unwrap(), 3 << 29);
        assert_eq!(parse_bytes("1G").unwrap(), 1_000_000_000);
        assert_eq!(parse_bytes("129e6").unwrap(), 129_000_000);
        assert_eq!(parse_bytes("129E6").unwrap(), 129_000_000);
        assert_eq!(parse_bytes("100k").unwrap(), 100_000);
        assert_eq!(parse_bytes("1500m").unwrap(), 2);
        assert_eq!(parse_bytes(".5Ki").unwrap(), 512);
        assert_eq!(parse_bytes("1Ei").unwrap(), 1 << 60);
    }

    #[test]
    fn rejects_garbage() {
        for bad in [
            "",
            "-1",
            "1Qi",
            "Mi",
            "1.2.3",
            "1 Mi",
            "99999999999E",
            "1e999",
            "abc",
        ] {
            assert!(parse_bytes(bad).is_err(), "{bad}");
        }
    }
}
