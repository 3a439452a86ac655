//! Unit tests of the forgiving rules: list variables with unknown words, endpoints without a
//! scheme, and the problems each warning records.

use super::super::reader::ProblemKind;
use super::super::*;
use super::load;

/// [`Config::read`]'s problems as (variable, kind).
fn problems(vars: &[(&str, &str)]) -> Vec<(String, ProblemKind)> {
    let (_, _, problems) = Config::read(|name| vars.iter().find(|(n, _)| *n == name).map(|(_, v)| (*v).to_owned()));
    problems.into_iter().map(|p| (p.variable, p.kind)).collect()
}

#[test]
fn a_list_applies_its_known_words_and_warns_about_the_others() {
    let (config, warnings) = load(&[(DROP_METRICS, "channels, Transfer,kernal")]);
    assert_eq!(config.export.dropped, ["transfer"]);
    assert_eq!(
        warnings,
        [format!(
            "{DROP_METRICS}='channels, Transfer,kernal' has unknown words 'channels', 'kernal' (known: \
             coll,p2p,transfer,link,channel,kernel,progress); using transfer"
        )]
    );
    assert_eq!(
        problems(&[(DROP_METRICS, "channels,transfer")]),
        [(DROP_METRICS.to_owned(), ProblemKind::UnknownWords)]
    );
    // Only blank entries besides known words: applied silently.
    assert_eq!(load(&[(DROP_METRICS, "channel,,")]), (load(&[(DROP_METRICS, "channel")]).0, vec![]));
    // No known word at all: the whole value is rejected.
    assert_eq!(problems(&[(DROP_METRICS, "channels")]), [(DROP_METRICS.to_owned(), ProblemKind::Invalid)]);
}

#[test]
fn key_value_lists_keep_their_good_entries() {
    let (config, warnings) = load(&[(otel::HEADERS, "a=1, secret-token ,b=%zz")]);
    assert_eq!(config.export.headers, [("a".to_owned(), "1".to_owned())]);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("2 (not shown); ignoring them"), "{warnings:?}");
    assert!(!warnings[0].contains("secret"), "{warnings:?}");
    assert_eq!(
        problems(&[(otel::HEADERS, "a=1,b")]),
        [(otel::HEADERS.to_owned(), ProblemKind::UnknownWords)]
    );
    let (config, warnings) = load(&[(otel::RESOURCE_ATTRIBUTES, "deployment=x,a b=c")]);
    assert!(config.export.resource.contains(&("deployment".to_owned(), "x".to_owned())));
    assert!(warnings[0].contains("'a b=c'"), "{warnings:?}");
}

#[test]
fn an_endpoint_without_a_scheme_is_http() {
    for (name, value, expected) in [
        (TELEMETRY_ENDPOINT, "127.0.0.1:14318", "http://127.0.0.1:14318/v1/metrics"),
        (otel::ENDPOINT, "collector:4318", "http://collector:4318/v1/metrics"),
        (otel::METRICS_ENDPOINT, "[::1]:9/custom", "http://[::1]:9/custom"),
    ] {
        let (config, warnings) = load(&[(name, value)]);
        assert_eq!(config.export.endpoint, expected);
        assert_eq!(
            warnings,
            [format!("{name}='{value}' has no scheme, so http:// is assumed: {expected}")]
        );
        assert!(problems(&[(name, value)]).is_empty(), "a note, not a problem");
    }
    // Still invalid with the scheme: the value as set is named, the default used.
    let (config, warnings) = load(&[(TELEMETRY_ENDPOINT, "localhost:x4318")]);
    assert_eq!(config, Config::default());
    assert!(warnings[0].starts_with(&format!("{TELEMETRY_ENDPOINT}='localhost:x4318' is not ")), "{warnings:?}");
    assert!(warnings[0].ends_with("using default http://localhost:4318/v1/metrics"), "{warnings:?}");
}

#[test]
fn every_warning_about_a_value_is_a_problem() {
    assert_eq!(
        problems(&[(WINDOW_CAPACITY, " "), (EXPORTER, "otlp2")]),
        [
            (WINDOW_CAPACITY.to_owned(), ProblemKind::Empty),
            (EXPORTER.to_owned(), ProblemKind::Invalid)
        ]
    );
    assert_eq!(ProblemKind::UnknownWords.as_str(), "unknown_words");
}
