//! Parsers and printers of variable values: each parser accepts exactly the syntax
//! `docs/configuration.md` states and returns `None` otherwise; each printer shows a value in the
//! syntax its variable accepts. Pure, except [`read_ca_file`] (cargo feature `tls`).
#![forbid(unsafe_code)]

use std::ops::RangeInclusive;
use std::time::Duration;

#[cfg(feature = "tls")]
use super::CaFile;
use super::{Compression, Detail, Exporter, Histograms, METRIC_FAMILIES, Mode, Protocol, Temporality};

/// Highest event bit NCCL defines (CeBatch, spec 2.2); masks with higher bits are rejected.
const MAX_EVENT_BIT: u32 = 15;

/// What a boolean variable accepts.
pub(super) const BOOL: &str = "a boolean (1/0, true/false, yes/no, on/off)";

/// What an endpoint variable accepts.
pub(super) const URLS: &str = if cfg!(feature = "tls") {
    "an http:// or https:// URL"
} else {
    "an http:// URL (https needs the cargo feature tls)"
};

/// What a protocol variable accepts.
pub(super) const PROTOCOLS: &str = if cfg!(feature = "grpc") {
    "http/protobuf, http/json or grpc"
} else {
    "http/protobuf or http/json (grpc needs the cargo feature grpc)"
};

/// `parsed`, or `Err` saying what the value is not: `valid`.
pub(super) fn accepted<T>(parsed: Option<T>, valid: &str) -> Result<T, String> {
    parsed.ok_or_else(|| valid.to_owned())
}

/// [`parse_u32_in`], or `Err` naming the range.
pub(super) fn u32_in(s: &str, valid: RangeInclusive<u32>) -> Result<u32, String> {
    let (lo, hi) = (*valid.start(), *valid.end());
    parse_u32_in(s, valid).ok_or_else(|| format!("an integer in {lo}..={hi}"))
}

/// [`parse_secs_in`], or `Err` naming the range.
pub(super) fn secs_in(s: &str, valid: RangeInclusive<f64>) -> Result<Duration, String> {
    let (lo, hi) = (*valid.start(), *valid.end());
    parse_secs_in(s, valid).ok_or_else(|| format!("a number of seconds in {lo}..={hi}"))
}

/// [`parse_millis`], or `Err` naming the range.
pub(super) fn millis_in(s: &str, valid: RangeInclusive<u64>) -> Result<Duration, String> {
    let (lo, hi) = (*valid.start(), *valid.end());
    parse_millis(s, valid).ok_or_else(|| format!("an integer number of milliseconds in {lo}..={hi}"))
}

/// A boolean: 1/0, true/false, yes/no, on/off, any case.
pub(super) fn parse_bool(s: &str) -> Option<bool> {
    match s.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

/// Decimal seconds within `valid`; NaN and infinities fail the range check.
pub(super) fn parse_secs_in(s: &str, valid: RangeInclusive<f64>) -> Option<Duration> {
    let secs: f64 = s.parse().ok()?;
    valid.contains(&secs).then(|| Duration::from_secs_f64(secs))
}

/// A non-negative integer, decimal or `0x`-hex, digits only (no sign, no separators).
pub(super) fn parse_uint(s: &str) -> Option<u64> {
    let (digits, radix) = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => (hex, 16),
        None => (s, 10),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(digits, radix).ok()
}

/// A [`parse_uint`] integer within `valid`.
pub(super) fn parse_u32_in(s: &str, valid: RangeInclusive<u32>) -> Option<u32> {
    let value = u32::try_from(parse_uint(s)?).ok()?;
    valid.contains(&value).then_some(value)
}

/// An activation mask using only bits 0..=`MAX_EVENT_BIT`.
pub(super) fn parse_event_mask(s: &str) -> Option<i32> {
    let mask = parse_uint(s)?;
    if mask >> (MAX_EVENT_BIT + 1) != 0 {
        return None;
    }
    i32::try_from(mask).ok()
}

/// `auto` (any case, `None`) or a boolean.
pub(super) fn parse_auto_bool(s: &str) -> Option<Option<bool>> {
    if s.eq_ignore_ascii_case("auto") {
        return Some(None);
    }
    parse_bool(s).map(Some)
}

/// `auto` or the boolean's [`show_bool`].
pub(super) fn show_auto_bool(value: Option<bool>) -> String {
    value.map_or_else(|| "auto".into(), show_bool)
}

/// `auto` (any case) or an integer in 1..=1000: KernelCh for one part in N of the time.
pub(super) fn parse_every(s: &str) -> Option<Option<u32>> {
    if s.eq_ignore_ascii_case("auto") {
        return Some(None);
    }
    parse_u32_in(s, 1..=1000).map(Some)
}

/// `otlp`, `file`, `stdout` or `none`, any case.
pub(super) fn parse_exporter(s: &str) -> Option<Exporter> {
    match s.to_ascii_lowercase().as_str() {
        "otlp" => Some(Exporter::Otlp),
        "file" => Some(Exporter::File),
        "stdout" => Some(Exporter::Stdout),
        "none" => Some(Exporter::None),
        _ => None,
    }
}

/// `http/protobuf`, `http/json` or (cargo feature `grpc`) `grpc`, any case.
pub(super) fn parse_protocol(s: &str) -> Option<Protocol> {
    match s.to_ascii_lowercase().as_str() {
        "http/protobuf" => Some(Protocol::HttpProtobuf),
        "http/json" => Some(Protocol::HttpJson),
        "grpc" if cfg!(feature = "grpc") => Some(Protocol::Grpc),
        _ => None,
    }
}

/// `cumulative`, `delta` or `lowmemory`, any case.
pub(super) fn parse_temporality(s: &str) -> Option<Temporality> {
    match s.to_ascii_lowercase().as_str() {
        "cumulative" => Some(Temporality::Cumulative),
        "delta" => Some(Temporality::Delta),
        "lowmemory" => Some(Temporality::LowMemory),
        _ => None,
    }
}

/// An integer number of milliseconds within `valid`.
pub(super) fn parse_millis(s: &str, valid: RangeInclusive<u64>) -> Option<Duration> {
    let ms = parse_uint(s)?;
    valid.contains(&ms).then(|| Duration::from_millis(ms))
}

/// `explicit_bucket_histogram` or `base2_exponential_bucket_histogram`, any case.
pub(super) fn parse_histograms(s: &str) -> Option<Histograms> {
    match s.to_ascii_lowercase().as_str() {
        "explicit_bucket_histogram" => Some(Histograms::Explicit),
        "base2_exponential_bucket_histogram" => Some(Histograms::Exponential),
        _ => None,
    }
}

/// `basic` or `full`, any case.
pub(super) fn parse_detail(s: &str) -> Option<Detail> {
    match s.to_ascii_lowercase().as_str() {
        "basic" => Some(Detail::Basic),
        "full" => Some(Detail::Full),
        _ => None,
    }
}

/// A detail level as [`parse_detail`] reads it.
pub(super) fn show_detail(value: Detail) -> String {
    match value {
        Detail::Basic => "basic",
        Detail::Full => "full",
    }
    .to_owned()
}

/// Histograms as [`parse_histograms`] reads them.
pub(super) fn show_histograms(value: Histograms) -> String {
    match value {
        Histograms::Explicit => "explicit_bucket_histogram",
        Histograms::Exponential => "base2_exponential_bucket_histogram",
    }
    .to_owned()
}

/// `none`, or metric families of [`METRIC_FAMILIES`] separated by commas (any case, blanks
/// around them ignored), in the table's order without repeats.
pub(super) fn parse_families(s: &str) -> Option<Vec<&'static str>> {
    if s.eq_ignore_ascii_case("none") {
        return Some(Vec::new());
    }
    let named: Vec<String> = s.split(',').map(|f| f.trim().to_ascii_lowercase()).collect();
    if named.iter().any(|f| !METRIC_FAMILIES.contains(&f.as_str())) {
        return None;
    }
    Some(
        METRIC_FAMILIES
            .into_iter()
            .filter(|f| named.iter().any(|n| n == f))
            .collect(),
    )
}

/// Families as [`parse_families`] reads them.
pub(super) fn show_families(value: &[&'static str]) -> String {
    if value.is_empty() {
        "none".to_owned()
    } else {
        value.join(",")
    }
}

/// `gzip` or `none`, any case.
pub(super) fn parse_compression(s: &str) -> Option<Compression> {
    match s.to_ascii_lowercase().as_str() {
        "gzip" => Some(Compression::Gzip),
        "none" => Some(Compression::None),
        _ => None,
    }
}

/// Whether endpoint `value` names its scheme (`http://…`).
pub(super) fn has_scheme(value: &str) -> bool {
    value.contains("://")
}

/// `value` with `http://` in front when it has no scheme (`host:port` is `http://host:port`).
pub(super) fn with_scheme(value: &str) -> String {
    if has_scheme(value) {
        value.to_owned()
    } else {
        format!("http://{value}")
    }
}

/// An `http://` (or, with TLS, `https://`) URL with a host (a name, an IPv4 address or a
/// bracketed IPv6 address) and an optional numeric port; for
/// HTTP protocols, the path gets `/v1/metrics` unless it already ends with it. gRPC URLs are taken
/// as they are.
pub(super) fn parse_endpoint(s: &str, protocol: Protocol) -> Option<String> {
    let rest = s
        .strip_prefix("http://")
        .or_else(|| s.strip_prefix("https://").filter(|_| cfg!(feature = "tls")))?;
    if s.contains(|c: char| c.is_whitespace() || c.is_control()) {
        return None;
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let port = match authority.strip_prefix('[') {
        Some(v6) => {
            let (host, after) = v6.split_once(']')?;
            if host.is_empty() {
                return None;
            }
            match after {
                "" => None,
                p => Some(p.strip_prefix(':')?),
            }
        }
        None => {
            let (host, port) = match authority.split_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (authority, None),
            };
            if host.is_empty() || !host.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b)) {
                return None;
            }
            port
        }
    };
    if port.is_some_and(|p| p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) || p.parse::<u16>().is_err()) {
        return None;
    }
    Some(match protocol {
        Protocol::Grpc => s.to_owned(),
        Protocol::HttpProtobuf | Protocol::HttpJson => {
            let trimmed = s.trim_end_matches('/');
            if trimmed.ends_with("/v1/metrics") {
                trimmed.to_owned()
            } else {
                format!("{trimmed}/v1/metrics")
            }
        }
    })
}

/// The regular file at `path` when it holds PEM certificates that are all usable as trust anchors
/// (sections of other types are skipped), at least one.
#[cfg(feature = "tls")]
pub(super) fn read_ca_file(path: &str) -> Option<CaFile> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject as _;
    /// A bundle of every public root is about 220 KB.
    const MAX_CA_FILE: u64 = 1 << 20;
    // Checked before opening: a FIFO or a device such as /dev/stdin could block or never end.
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_file() || meta.len() > MAX_CA_FILE {
        return None;
    }
    let pem = std::fs::read(path).ok()?;
    let certs: Vec<CertificateDer> = CertificateDer::pem_slice_iter(&pem).collect::<Result<_, _>>().ok()?;
    let (added, ignored) = rustls::RootCertStore::empty().add_parsable_certificates(certs);
    (added > 0 && ignored == 0).then(|| CaFile {
        path: path.to_owned(),
        pem,
    })
}

/// A path pattern whose `%` sequences are `%h`, `%p`, `%r`, `%j` or `%%`.
pub(super) fn parse_file_pattern(s: &str) -> Option<String> {
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '%' && !matches!(chars.next(), Some('h' | 'p' | 'r' | 'j' | '%')) {
            return None;
        }
    }
    (!s.contains('\0')).then(|| s.to_owned())
}

/// `k=v,k2=v2`: keys trimmed and non-empty, values trimmed and percent-decoded; empty entries
/// (`a=1,,b=2`, a trailing comma) are skipped. Returns the pairs (sorted by key, later duplicates
/// winning) and the entries that are not such a pair.
pub(super) fn parse_pairs(s: &str) -> (Vec<(String, String)>, Vec<&str>) {
    let (mut pairs, mut bad) = (Vec::new(), Vec::new());
    for entry in s.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        match parse_pair(entry) {
            Some(pair) => pairs.push(pair),
            None => bad.push(entry),
        }
    }
    (overlay(Vec::new(), pairs), bad)
}

/// One `k=v` entry of [`parse_pairs`].
fn parse_pair(entry: &str) -> Option<(String, String)> {
    let (key, value) = entry.split_once('=')?;
    let key = key.trim();
    if key.is_empty() || key.contains(char::is_whitespace) {
        return None;
    }
    Some((key.to_owned(), percent_decode(value.trim())?))
}

/// `%XX` escapes decoded; `None` for a bad escape or invalid UTF-8.
pub(super) fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if b == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// `base` with every key of `top` set to top's value (later duplicates in `top` win); sorted by key.
pub(super) fn overlay(base: Vec<(String, String)>, top: Vec<(String, String)>) -> Vec<(String, String)> {
    let map: std::collections::BTreeMap<String, String> = base.into_iter().chain(top).collect();
    map.into_iter().collect()
}

/// An exporter as [`parse_exporter`] reads it.
pub(super) fn show_exporter(value: Exporter) -> String {
    match value {
        Exporter::Otlp => "otlp",
        Exporter::File => "file",
        Exporter::Stdout => "stdout",
        Exporter::None => "none",
    }
    .to_owned()
}

/// A compression as [`parse_compression`] reads it.
pub(super) fn show_compression(value: Compression) -> String {
    match value {
        Compression::Gzip => "gzip",
        Compression::None => "none",
    }
    .to_owned()
}

/// A protocol as [`parse_protocol`] reads it.
pub(super) fn show_protocol(value: Protocol) -> String {
    match value {
        Protocol::HttpProtobuf => "http/protobuf",
        Protocol::HttpJson => "http/json",
        Protocol::Grpc => "grpc",
    }
    .to_owned()
}

/// A temporality as [`parse_temporality`] reads it.
pub(super) fn show_temporality(value: Temporality) -> String {
    match value {
        Temporality::Cumulative => "cumulative",
        Temporality::Delta => "delta",
        Temporality::LowMemory => "lowmemory",
    }
    .to_owned()
}

/// Whole milliseconds.
pub(super) fn show_millis(value: Duration) -> String {
    value.as_millis().to_string()
}

/// `true` or `false`.
pub(super) fn show_bool(value: bool) -> String {
    value.to_string()
}

/// Decimal seconds.
pub(super) fn show_secs(value: Duration) -> String {
    value.as_secs_f64().to_string()
}

/// `AVG` or `MIN`.
pub(super) fn show_mode(value: Mode) -> String {
    value.as_str().to_owned()
}

/// `0x`-hex.
pub(super) fn show_mask(value: i32) -> String {
    format!("{value:#x}")
}

/// `auto` or decimal.
pub(super) fn show_every(value: Option<u32>) -> String {
    value.map_or_else(|| "auto".into(), |n| n.to_string())
}

/// Decimal.
pub(super) fn show_u32(value: u32) -> String {
    value.to_string()
}

/// The CA file's path, or that the system roots are used.
#[cfg(feature = "tls")]
pub(super) fn show_ca_file(value: &Option<CaFile>) -> String {
    value
        .as_ref()
        .map_or_else(|| "(the system roots)".to_owned(), |c| c.path.clone())
}
