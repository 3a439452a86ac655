//! The native-histogram variants of the Prometheus rules and the Grafana dashboard of `docs/`,
//! generated from the classic ones (a test compares the committed files with what this makes;
//! `BLESS=1` writes them). Exported as base-2 exponential histograms, each histogram point is one
//! native histogram series under the name without `_bucket`, `_sum` and `_count`, so the classic
//! queries are rewritten (Prometheus 2.42 with `--enable-feature=native-histograms` runs all of
//! these functions on native histograms):
//!
//! - `H_bucket{…}` becomes `H{…}`, and `le` leaves every `by (…)`: `histogram_quantile` takes the
//!   aggregated native histograms as they are;
//! - `rate(H_sum{…}[r])` becomes `histogram_sum(rate(H{…}[r]))` (`increase` likewise), and
//!   `H_sum{…}` without a range `histogram_sum(H{…})`; `_count` the same with `histogram_count`;
//! - anything else on a histogram's series has no rewrite and fails the generation: a matcher on
//!   `le`, `le` in `on`/`ignoring`/`without`/`group_…`, a range of `_sum` or `_count` in another
//!   function.
//!
//! The dashboard's strings are rewritten one by one (JSON escapes undone first), and its uid and
//! title get a suffix so that both dashboards can be imported side by side. Called on: the
//! test's thread.

use std::path::Path;

pub const RULES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/prometheus/nccl-rules-native.yml");
pub const DASHBOARD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/grafana/nccl-dashboard-native.json");

/// The functions of a `_sum` or `_count` range that `histogram_sum`/`histogram_count` can wrap.
const RANGE_FUNCTIONS: [&str; 2] = ["rate", "increase"];

/// The native rules file made of the classic one, `histograms` naming the histograms' series
/// (without suffix).
pub fn rules(classic: &str, histograms: &[String]) -> Result<String, String> {
    let header = "# GENERATED from nccl-rules.yml for native histograms (the plugin with\n\
                  # OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION=base2_exponential_bucket_histogram,\n\
                  # Prometheus with --enable-feature=native-histograms): do not edit. tests/support/prom/native.rs\n\
                  # makes it; `BLESS=1 cargo test --test signals -- native_variants` rewrites it.\n";
    Ok(format!("{header}{}", rewrite(classic, histograms)?))
}

/// The native dashboard made of the classic one: every string rewritten, the uid and title
/// suffixed.
pub fn dashboard(classic: &str, histograms: &[String]) -> Result<String, String> {
    let mut out = String::with_capacity(classic.len());
    let mut rest = classic;
    while let Some(open) = rest.find('"') {
        out.push_str(&rest[..open]);
        let len = literal_len(&rest[open..]).ok_or("an unterminated JSON string")?;
        let literal = &rest[open..open + len];
        let text: String = serde_json::from_str(literal).map_err(|e| format!("{literal}: {e}"))?;
        let native = rewrite(&text, histograms)?;
        if native == text {
            out.push_str(literal);
        } else {
            out.push_str(&serde_json::to_string(&native).map_err(|e| e.to_string())?);
        }
        rest = &rest[open + len..];
    }
    out.push_str(rest);
    let dash: serde_json::Value = serde_json::from_str(classic).map_err(|e| e.to_string())?;
    for (key, suffix) in [("uid", "-native"), ("title", ", native histograms")] {
        let value = dash[key].as_str().ok_or(format!("no {key}"))?;
        let field = |v: &str| format!("\"{key}\": {}", serde_json::Value::from(v));
        let (old, new) = (field(value), field(&format!("{value}{suffix}")));
        if out.matches(&old).count() != 1 {
            return Err(format!("{old} is not once in the dashboard"));
        }
        out = out.replacen(&old, &new, 1);
    }
    Ok(out)
}

/// Compares `generated` with the file at `path`, or writes it there when `BLESS=1`.
pub fn check_or_bless(path: &str, generated: &str) -> Result<(), String> {
    if std::env::var("BLESS").is_ok_and(|v| v == "1") {
        return std::fs::write(path, generated).map_err(|e| format!("{path}: {e}"));
    }
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    if committed == generated {
        return Ok(());
    }
    let line = committed
        .lines()
        .zip(generated.lines())
        .position(|(a, b)| a != b)
        .unwrap_or(committed.lines().count().min(generated.lines().count()));
    let name = Path::new(path).file_name().unwrap_or_default().to_string_lossy();
    Err(format!(
        "{name} differs from what its classic file makes (from line {}): rerun with BLESS=1 to rewrite it",
        line + 1
    ))
}

/// PromQL (or a file holding it) over classic histograms, rewritten for native ones (the rules
/// of the module's doc).
pub fn rewrite(text: &str, histograms: &[String]) -> Result<String, String> {
    let histogram = |word| histogram(word, histograms);
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    while at < text.len() {
        let Some((word, end)) = word_at(text, at) else {
            let c = text[at..].chars().next().unwrap_or_default();
            out.push(c);
            at += c.len_utf8();
            continue;
        };
        let Some((base, suffix)) = histogram(word) else {
            out.push_str(word);
            at = end;
            continue;
        };
        let selected = selector_end(text, end)?;
        if suffix == "_bucket" {
            if matchers(&text[end..selected]).any(|m| m == "le") {
                return Err(format!("a matcher on le: {}", &text[at..selected]));
            }
            out.push_str(base);
            at = end;
            continue;
        }
        let wrap = if suffix == "_sum" {
            "histogram_sum"
        } else {
            "histogram_count"
        };
        if !text[..selected].ends_with(']') {
            out.push_str(&format!("{wrap}({base}{})", &text[end..selected]));
            at = selected;
            continue;
        }
        // A range: wrap the function call it is the argument of.
        let call = out.trim_end().strip_suffix('(').map(str::trim_end).unwrap_or_default();
        let function = RANGE_FUNCTIONS
            .iter()
            .find(|f| call.ends_with(*f) && !call[..call.len() - f.len()].ends_with(is_word))
            .ok_or(format!("{word}[…] is not the argument of {RANGE_FUNCTIONS:?}"))?;
        let close = selected + closing(&text[selected..])?;
        out.insert_str(call.len() - function.len(), &format!("{wrap}("));
        out.push_str(base);
        out.push_str(&text[end..=close]);
        out.push(')');
        at = close + 1;
    }
    let out = without_le(&out)?;
    let left = words(&out).find(|w| histogram(w).is_some()).map(str::to_owned);
    match left {
        Some(left) => Err(format!("{left} is left after the rewrite")),
        None => Ok(out),
    }
}

/// A histogram's series name split into the histogram's name (of `histograms`) and its suffix.
fn histogram<'a>(word: &'a str, histograms: &[String]) -> Option<(&'a str, &'static str)> {
    ["_bucket", "_sum", "_count"].into_iter().find_map(|suffix| {
        let base = word.strip_suffix(suffix)?;
        histograms.iter().any(|h| h == base).then_some((base, suffix))
    })
}

fn is_word(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// The identifier starting at `at` (not inside another) and where it ends.
fn word_at(text: &str, at: usize) -> Option<(&str, usize)> {
    if text[..at].ends_with(is_word) {
        return None;
    }
    let len = text[at..].find(|c: char| !is_word(c)).unwrap_or(text.len() - at);
    (len > 0).then(|| (&text[at..at + len], at + len))
}

/// Every identifier of `text`.
fn words(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !is_word(c)).filter(|w| !w.is_empty())
}

/// Where the selector whose name ends at `at` ends: past its `{…}` and its `[…]`, if any.
fn selector_end(text: &str, mut at: usize) -> Result<usize, String> {
    for (open, close) in [('{', '}'), ('[', ']')] {
        if text[at..].starts_with(open) {
            let len = text[at..]
                .find(close)
                .ok_or(format!("no {close} after {}", &text[at..]))?;
            at += len + 1;
        }
    }
    Ok(at)
}

/// The label names of a selector's `{…}` (with the rest, if any).
fn matchers(selector: &str) -> impl Iterator<Item = &str> {
    let inner = selector
        .strip_prefix('{')
        .and_then(|s| s.split('}').next())
        .unwrap_or("");
    inner
        .split(',')
        .map(|m| m.split(['=', '!']).next().unwrap_or("").trim())
}

/// The offset in `text` of the `)` that closes a `(` opened before it, skipping quoted strings.
fn closing(text: &str) -> Result<usize, String> {
    let (mut depth, mut quoted) = (1, false);
    for (i, c) in text.char_indices() {
        match c {
            '"' => quoted = !quoted,
            '(' if !quoted => depth += 1,
            ')' if !quoted => {
                depth -= 1;
                if depth == 0 {
                    return Ok(i);
                }
            }
            _ => {}
        }
    }
    Err(format!("no ) closes {text}"))
}

/// `text` with `le` dropped from every `by (…)`; `Err` if `le` is grouped on otherwise.
fn without_le(text: &str) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find('(') {
        let keyword = rest[..open].trim_end();
        let keyword = &keyword[keyword.rfind(|c: char| !is_word(c)).map_or(0, |i| i + 1)..];
        let close = rest[open..].find(')').map(|i| open + i);
        let list = close.map(|c| &rest[open + 1..c]);
        let grouping = ["by", "without", "on", "ignoring", "group_left", "group_right"].contains(&keyword);
        match list.filter(|l| grouping && l.split(',').any(|n| n.trim() == "le")) {
            Some(list) if keyword == "by" => {
                let names: Vec<&str> = list.split(',').map(str::trim).filter(|n| *n != "le").collect();
                out.push_str(&rest[..=open]);
                out.push_str(&names.join(", "));
                rest = &rest[open + 1 + list.len()..];
            }
            Some(list) => return Err(format!("le in {keyword} ({list})")),
            None => {
                out.push_str(&rest[..=open]);
                rest = &rest[open + 1..];
            }
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// The length of the JSON string literal `text` starts with (its quotes included).
fn literal_len(text: &str) -> Option<usize> {
    let mut escaped = false;
    for (i, c) in text.char_indices().skip(1) {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '"' => return Some(i + 1),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn native(q: &str) -> Result<String, String> {
        rewrite(q, &["h_seconds".to_owned()])
    }

    #[test]
    fn classic_queries_become_native() {
        let q = r#"histogram_quantile(0.5, sum by (le, f) (rate(h_seconds_bucket{job=~"a(b)"}[1m])))"#;
        assert_eq!(
            native(q).unwrap(),
            r#"histogram_quantile(0.5, sum by (f) (rate(h_seconds{job=~"a(b)"}[1m])))"#
        );
        let q = "sum by (f) (rate(h_seconds_sum[5m])) / sum(increase(h_seconds_count{a=\"b\"}[5m]))";
        assert_eq!(
            native(q).unwrap(),
            "sum by (f) (histogram_sum(rate(h_seconds[5m]))) / sum(histogram_count(increase(h_seconds{a=\"b\"}[5m])))"
        );
        assert_eq!(native("h_seconds_count > 0").unwrap(), "histogram_count(h_seconds) > 0");
        assert_eq!(native("xh_seconds_sum").unwrap(), "xh_seconds_sum");
    }

    #[test]
    fn what_has_no_rewrite_fails() {
        for q in [
            r#"h_seconds_bucket{le="0.1"}"#,
            "last_over_time(h_seconds_sum[5m])",
            "a * on (le) h_seconds_bucket",
        ] {
            assert!(native(q).is_err(), "{q}");
        }
    }
}
