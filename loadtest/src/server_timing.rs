//! Parsing of the `Server-Timing` response header (W3C Server Timing).
//!
//! `prepare;dur=1.25, infer;dur=3.5` → [("prepare", 1.25), ("infer", 3.5)]. Entries without a
//! `dur` parameter carry no duration and are skipped.

/// (metric name, duration in milliseconds) of every entry that has a duration.
pub fn parse(header: &str) -> Vec<(String, f64)> {
    header
        .split(',')
        .filter_map(|entry| {
            let mut params = entry.split(';').map(str::trim);
            let name = params.next().filter(|n| !n.is_empty())?;
            let dur = params.find_map(|p| {
                let (key, value) = p.split_once('=')?;
                if key.trim().eq_ignore_ascii_case("dur") {
                    value.trim().trim_matches('"').parse::<f64>().ok()
                } else {
                    None
                }
            })?;
            dur.is_finite().then(|| (name.to_string(), dur))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_and_durations() {
        assert_eq!(
            parse("prepare;dur=1.25, infer;dur=3.5"),
            vec![("prepare".to_string(), 1.25), ("infer".to_string(), 3.5)]
        );
        assert_eq!(
            parse(r#"queue;desc="wait";dur="0.5",cache,  infer ; dur = 2"#),
            vec![("queue".to_string(), 0.5), ("infer".to_string(), 2.0)]
        );
        assert!(parse("").is_empty());
        assert!(parse("x;dur=abc").is_empty());
    }
}
