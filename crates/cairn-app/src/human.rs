//! Human-readable numbers, sizes, durations and times.

/// `12.3M`, `4.5k`, `999`.
pub fn count(n: f64) -> String {
    if n >= 1e9 {
        format!("{:.2}G", n / 1e9)
    } else if n >= 1e6 {
        format!("{:.2}M", n / 1e6)
    } else if n >= 1e3 {
        format!("{:.1}k", n / 1e3)
    } else {
        format!("{n:.0}")
    }
}

/// `1.2 MiB`.
pub fn bytes(n: u64) -> String {
    let n = n as f64;
    if n >= 1024.0 * 1024.0 * 1024.0 {
        format!("{:.1} GiB", n / (1024.0 * 1024.0 * 1024.0))
    } else if n >= 1024.0 * 1024.0 {
        format!("{:.1} MiB", n / (1024.0 * 1024.0))
    } else if n >= 1024.0 {
        format!("{:.1} KiB", n / 1024.0)
    } else {
        format!("{n:.0} B")
    }
}

/// `850 ms`, `12.3 s`, `5 min 3 s`, `2 h 5 min`.
pub fn duration_ms(ms: u64) -> String {
    let secs = ms / 1000;
    if ms < 1000 {
        format!("{ms} ms")
    } else if secs < 60 {
        format!("{:.1} s", ms as f64 / 1000.0)
    } else if secs < 3600 {
        format!("{} min {} s", secs / 60, secs % 60)
    } else {
        format!("{} h {} min", secs / 3600, (secs % 3600) / 60)
    }
}

/// `2026-11-29 11:20:01` (UTC) from milliseconds since the Unix epoch.
pub fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let (y, m, d) = civil_date((secs / 86_400) as i64);
    let rem = secs % 86_400;
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// The proleptic Gregorian (year, month, day) of a day number (days since 1970-01-01,
/// negative before), by Howard Hinnant's `civil_from_days`.
pub fn civil_date(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    #[test]
    fn durations() {
        assert_eq!(super::duration_ms(850), "850 ms");
        assert_eq!(super::duration_ms(12_345), "12.3 s");
        assert_eq!(super::duration_ms(303_999), "5 min 3 s");
        assert_eq!(super::duration_ms(7_500_000), "2 h 5 min");
    }

    #[test]
    fn utc_formats_known_instants() {
        assert_eq!(super::utc(0), "1970-01-01 00:00:00");
        assert_eq!(super::utc(1_795_951_201_000), "2026-11-29 11:20:01");
        assert_eq!(super::utc(951_782_400_000), "2000-02-29 00:00:00");
    }
}
