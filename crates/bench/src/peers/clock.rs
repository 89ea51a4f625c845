//! UTC wall-clock times as the run names them: the run's stamp (`20261128T092511Z`, its log
//! directory and default result file), the report's date and the progress lines' time of day.

use std::time::{SystemTime, UNIX_EPOCH};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Utc {
    pub year: i64,
    pub month: u32,
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
}

impl Utc {
    pub fn now() -> Utc {
        let secs = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        Utc::from_unix(i64::try_from(secs).unwrap_or(i64::MAX))
    }

    /// Seconds since 1970-01-01 00:00 UTC to a civil date and time (proleptic Gregorian).
    pub fn from_unix(secs: i64) -> Utc {
        let days = secs.div_euclid(86_400);
        let of_day = secs.rem_euclid(86_400);
        // Howard Hinnant's civil_from_days.
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = doy - (153 * mp + 2) / 5 + 1;
        let month = if mp < 10 { mp + 3 } else { mp - 9 };
        let year = yoe + era * 400 + i64::from(month <= 2);
        let small = |v: i64| u32::try_from(v).unwrap_or(0);
        Utc {
            year,
            month: small(month),
            day: small(day),
            hour: small(of_day / 3600),
            minute: small(of_day / 60 % 60),
            second: small(of_day % 60),
        }
    }

    /// `date -u +%Y%m%dT%H%M%SZ`
    pub fn stamp(&self) -> String {
        format!(
            "{:04}{:02}{:02}T{:02}{:02}{:02}Z",
            self.year, self.month, self.day, self.hour, self.minute, self.second
        )
    }

    /// `date -u +'%Y-%m-%d %H:%M UTC'`
    pub fn minute_utc(&self) -> String {
        format!("{:04}-{:02}-{:02} {:02}:{:02} UTC", self.year, self.month, self.day, self.hour, self.minute)
    }

    /// `date -u +%T`
    pub fn time_of_day(&self) -> String {
        format!("{:02}:{:02}:{:02}", self.hour, self.minute, self.second)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_times() {
        let epoch = Utc::from_unix(0);
        assert_eq!(epoch.stamp(), "19700101T000000Z");
        // 2026-11-28 09:25:11 UTC.
        let t = Utc::from_unix(1_795_857_911);
        assert_eq!(t.stamp(), "20261128T092511Z");
        assert_eq!(t.minute_utc(), "2026-11-28 09:25 UTC");
        assert_eq!(t.time_of_day(), "09:25:11");
        // A leap day and the day after.
        assert_eq!(Utc::from_unix(951_782_400).stamp(), "20000229T000000Z");
        assert_eq!(Utc::from_unix(951_868_799).stamp(), "20000229T235959Z");
        assert_eq!(Utc::from_unix(951_868_800).stamp(), "20000301T000000Z");
        assert_eq!(Utc::from_unix(1_704_067_199).stamp(), "20231231T235959Z");
    }
}
