//! Unit tests of the configuration: defaults, every parser through `from_lookup`, the warning
//! rules, the OTEL resolution chain and the CA files.
#![allow(clippy::unwrap_used)]

use super::*;
use crate::record::handle::MAX_LANE_SLOTS;

mod docs;
mod export;
mod friendly;
mod launcher;

fn load(vars: &[(&str, &str)]) -> (Config, Vec<String>) {
    Config::from_lookup(|name| vars.iter().find(|(n, _)| *n == name).map(|(_, v)| (*v).to_owned()))
}

/// Every row's example of a rejected value is rejected: one warning naming the variable, and the
/// default kept (the end-to-end lifecycle test sets them all at once).
#[test]
fn every_rows_rejected_example_is_rejected() {
    for (name, value) in rejected() {
        let (config, warnings) = load(&[(name, value)]);
        assert_eq!(config, Config::default(), "{name}={value:?}");
        assert_eq!(warnings.len(), 1, "{name}={value:?}: {warnings:?}");
        assert!(warnings[0].starts_with(&format!("{name}=")), "{warnings:?}");
    }
}

/// Asserts `value` for `name` is rejected with exactly one warning and the default kept.
fn assert_rejected(name: &str, value: &str, default_shown: &str) {
    let (config, warnings) = load(&[(name, value)]);
    assert_eq!(config, Config::default(), "{name}={value:?}");
    assert_eq!(warnings.len(), 1, "{name}={value:?}: {warnings:?}");
    let w = &warnings[0];
    assert!(w.starts_with(&format!("{name}='{}' is not ", value.trim())), "{w}");
    assert!(w.ends_with(&format!("; using default {default_shown}")), "{w}");
}

/// Every default, field by field (a new field needs no line here: the documentation test shows
/// its default).
#[test]
fn defaults() {
    let (c, warnings) = load(&[]);
    assert!(warnings.is_empty());
    assert_eq!(
        (
            c.enable,
            c.telemetry_enable,
            c.interval,
            c.hang_threshold,
            c.regression_mode
        ),
        (true, true, Duration::from_secs(5), Duration::from_secs(5), Mode::Avg)
    );
    assert_eq!(
        (
            c.event_mask,
            c.kernel_ch_every,
            c.v7_extensions,
            c.capacity,
            c.count_trigger
        ),
        (0x5E, None, None, 100_000, 15_000)
    );
    let e = &c.export;
    assert_eq!(
        (e.exporter, e.protocol, e.endpoint.as_str(), e.timeout),
        (
            Exporter::Otlp,
            Protocol::HttpProtobuf,
            "http://localhost:4318/v1/metrics",
            Duration::from_millis(3000)
        )
    );
    assert_eq!(
        (e.compression, e.temporality, e.histograms, e.certificate.as_ref()),
        (Compression::Gzip, Temporality::Cumulative, Histograms::Exponential, None)
    );
    assert_eq!((e.detail, e.left_out()), (Detail::Basic, vec!["transfer", "channel"]));
    assert_eq!(
        (e.file.as_str(), e.queue, e.cardinality_limit, e.service_name.as_str()),
        ("nccl-otel-%h-%p.jsonl", 8, 2000, "nccl")
    );
    assert!(e.headers.is_empty() && e.dropped.is_empty() && e.resource.is_empty());
}

#[test]
fn empty_and_blank_values_warn_once_and_keep_the_default() {
    for name in ALL {
        for value in ["", "   ", "\t"] {
            let (config, warnings) = load(&[(name, value)]);
            assert_eq!(config, Config::default(), "{name}={value:?}");
            // The default named is the one the configuration line shows.
            let described = Config::default().describe();
            let shown = described
                .split(&format!(" {name}="))
                .nth(1)
                .and_then(|v| v.split(' ').next());
            let expected = format!("{name}='' is empty; using default {}", shown.unwrap_or("?"));
            assert_eq!(warnings, [expected], "{name}={value:?}");
        }
    }
}

#[test]
fn bools() {
    for (value, expected) in [
        ("1", true),
        ("0", false),
        ("true", true),
        ("FALSE", false),
        ("Yes", true),
        ("no", false),
        ("ON", true),
        (" off ", false),
    ] {
        for name in [ENABLE, TELEMETRY_ENABLE] {
            let (config, warnings) = load(&[(name, value)]);
            assert!(warnings.is_empty());
            let got = if name == ENABLE {
                config.enable
            } else {
                config.telemetry_enable
            };
            assert_eq!(got, expected, "{name}={value:?}");
        }
    }
    for value in ["2", "-1", "y", "enable", "truee", "nan"] {
        assert_rejected(ENABLE, value, "true");
        assert_rejected(TELEMETRY_ENABLE, value, "true");
    }
}

#[test]
fn interval() {
    for (value, expected) in [
        ("5", Duration::from_secs(5)),
        ("0.5", Duration::from_millis(500)),
        (".25", Duration::from_millis(250)),
        ("0.01", Duration::from_millis(10)),
        ("3600", Duration::from_secs(3600)),
        ("1e1", Duration::from_secs(10)),
    ] {
        let (config, warnings) = load(&[(TELEMETRY_INTERVAL_SEC, value)]);
        assert!(warnings.is_empty(), "{value}: {warnings:?}");
        assert_eq!(config.interval, expected, "{value}");
    }
    for value in [
        "0", "0.009", "-1", "3600.001", "1e9", "nan", "NaN", "inf", "-inf", "0x10", "5s", "abc", "1,5",
    ] {
        assert_rejected(TELEMETRY_INTERVAL_SEC, value, "5");
    }
}

#[test]
fn hang_threshold() {
    for (value, expected) in [("30", 30.0), ("0.1", 0.1), ("2.5", 2.5), ("86400", 86400.0)] {
        let (config, warnings) = load(&[(HANG_THRESHOLD_SEC, value)]);
        assert!(warnings.is_empty(), "{value}: {warnings:?}");
        assert_eq!(config.hang_threshold, Duration::from_secs_f64(expected), "{value}");
    }
    for value in ["0", "0.05", "-1", "86401", "nan", "inf", "30s"] {
        assert_rejected(HANG_THRESHOLD_SEC, value, "5");
    }
}

#[test]
fn regression_mode() {
    for (value, expected) in [("AVG", Mode::Avg), ("MIN", Mode::Min), ("min", Mode::Min)] {
        let (config, warnings) = load(&[(LINEAR_REGRESSION_MODE, value)]);
        assert!(warnings.is_empty());
        assert_eq!(config.regression_mode, expected);
    }
    for value in ["MAX", "0", "average"] {
        assert_rejected(LINEAR_REGRESSION_MODE, value, "AVG");
    }
}

#[test]
fn event_mask() {
    for (value, expected) in [
        ("30", 0x1E),
        ("0x65E", 0x65E),
        ("0X7fff", 0x7FFF),
        ("0", 0),
        ("16384", 0x4000),
        ("0x8000", 0x8000),
        ("65535", 0xFFFF),
    ] {
        let (config, warnings) = load(&[(EVENT_MASK, value)]);
        assert!(warnings.is_empty(), "{value}: {warnings:?}");
        assert_eq!(config.event_mask, expected, "{value}");
    }
    for value in [
        "0x10000",
        "65536",
        "-1",
        "+30",
        "0x",
        "0x-1",
        "1e3",
        "abc",
        "0xg",
        "4294967296",
        "99999999999999999999999",
        "nan",
        "inf",
        "3 0",
    ] {
        assert_rejected(EVENT_MASK, value, "0x5e");
    }
}

#[test]
fn v7_extensions() {
    for (value, expected) in [("auto", None), ("Auto", None), ("on", Some(true)), ("0", Some(false))] {
        let (config, warnings) = load(&[(V7_EXTENSIONS, value)]);
        assert!(warnings.is_empty(), "{value}: {warnings:?}");
        assert_eq!(config.v7_extensions, expected, "{value}");
    }
    for value in ["maybe", "2"] {
        assert_rejected(V7_EXTENSIONS, value, "auto");
    }
}

#[test]
fn kernel_ch_every() {
    for (value, expected) in [
        ("auto", None),
        ("AUTO", None),
        ("1", Some(1)),
        ("0x10", Some(16)),
        ("1000", Some(1000)),
    ] {
        let (config, warnings) = load(&[(KERNEL_CH_EVERY, value)]);
        assert!(warnings.is_empty(), "{value}: {warnings:?}");
        assert_eq!(config.kernel_ch_every, expected, "{value}");
    }
    for value in ["0", "1001", "-1", "half", "0.5"] {
        assert_rejected(KERNEL_CH_EVERY, value, "auto");
    }
}

#[test]
fn capacity_and_trigger() {
    for (vars, capacity, trigger) in [
        (&[(WINDOW_CAPACITY, "1024")][..], 1024, 512),
        (&[(WINDOW_CAPACITY, "699048")][..], MAX_LANE_SLOTS, 15_000),
        (&[(WINDOW_CAPACITY, "0x8000")][..], 32_768, 15_000),
        (&[(WINDOW_CAPACITY, "0x4000")][..], 16_384, 8_192),
        (&[(WINDOW_COUNT_TRIGGER, "1")][..], 100_000, 1),
        (&[(WINDOW_COUNT_TRIGGER, "100000")][..], 100_000, 100_000),
        (
            &[(WINDOW_CAPACITY, "4096"), (WINDOW_COUNT_TRIGGER, "4096")][..],
            4096,
            4096,
        ),
    ] {
        let (config, warnings) = load(vars);
        assert!(warnings.is_empty(), "{vars:?}: {warnings:?}");
        assert_eq!((config.capacity, config.count_trigger), (capacity, trigger), "{vars:?}");
    }
    for value in [
        "1023",
        "699049",
        "0",
        "-5",
        "4294967296",
        "1e5",
        "100000.0",
        "nan",
        "0x",
    ] {
        assert_rejected(WINDOW_CAPACITY, value, "100000");
    }
    for value in ["0", "100001", "-1", "4294967296", "inf", "x"] {
        assert_rejected(WINDOW_COUNT_TRIGGER, value, "15000");
    }
}

#[test]
fn trigger_above_capacity_uses_half_the_capacity() {
    let (config, warnings) = load(&[(WINDOW_CAPACITY, "2048"), (WINDOW_COUNT_TRIGGER, "50000")]);
    assert_eq!((config.capacity, config.count_trigger), (2048, 1024));
    assert_eq!(
        warnings,
        [format!(
            "{WINDOW_COUNT_TRIGGER}='50000' is not an integer in 1..=2048 (the window \
             capacity); using default 1024"
        )]
    );
}

#[test]
fn one_warning_per_bad_variable() {
    let vars: Vec<(&str, &str)> = ALL.iter().map(|name| (*name, "%bogus")).collect();
    let (config, warnings) = load(&vars);
    assert_eq!(config, Config::default());
    assert_eq!(warnings.len(), ALL.len());
    for name in ALL {
        let prefix = format!("{name}='%bogus' is not ");
        assert!(warnings.iter().any(|w| w.starts_with(&prefix)), "{name}: {warnings:?}");
    }
}

#[test]
fn describe_round_trips() {
    let (config, _) = load(&[
        (ENABLE, "off"),
        (TELEMETRY_INTERVAL_SEC, "0.5"),
        (HANG_THRESHOLD_SEC, "2.5"),
        (LINEAR_REGRESSION_MODE, "MIN"),
        (EVENT_MASK, "0x65e"),
        (KERNEL_CH_EVERY, "4"),
        (WINDOW_CAPACITY, "4096"),
        (EXPORTER, "file"),
        (otel::ENDPOINT, "http://collector:4318/"),
        (otel::TIMEOUT, "250"),
        (EXPORT_FILE, "/tmp/x-%h-%p-%%.jsonl"),
        (EXPORT_QUEUE, "3"),
        (CARDINALITY_LIMIT, "16"),
        (DETAIL, "FULL"),
        (DROP_METRICS, "Channel, link"),
        (otel::HISTOGRAM_AGGREGATION, "explicit_bucket_histogram"),
        (otel::PROTOCOL, "http/json"),
        (otel::TEMPORALITY, "delta"),
        (otel::COMPRESSION, "none"),
        (otel::RESOURCE_ATTRIBUTES, "service.name=trainer"),
    ]);
    let line = config.describe();
    assert!(
        line.starts_with(&format!("nccl-profiler-otel {}: ", env!("CARGO_PKG_VERSION"))),
        "{line}"
    );
    assert!(line.contains(" NCCL_PROFILE_EVENT_MASK=0x65e "), "{line}");
    let (_, pairs) = line.split_once(": ").unwrap();
    let vars: Vec<(&str, &str)> = pairs.split(' ').map(|pair| pair.split_once('=').unwrap()).collect();
    assert_eq!(vars.len(), ALL.len() + 5);
    assert!(line.contains(" OTEL_EXPORTER_OTLP_METRICS_COMPRESSION=none "), "{line}");
    assert!(line.contains(" NCCL_PROFILER_OTEL_TELEMETRY_ENDPOINT=http://collector:4318/v1/metrics "));
    assert!(line.ends_with(" OTEL_SERVICE_NAME=trainer"), "{line}");
    assert_eq!(load(&vars), (config, Vec::new()));
}

#[test]
fn exporter_and_queue_and_limit() {
    for (value, expected) in [
        ("otlp", Exporter::Otlp),
        ("FILE", Exporter::File),
        ("stdout", Exporter::Stdout),
        (" none ", Exporter::None),
    ] {
        let (config, warnings) = load(&[(EXPORTER, value)]);
        assert!(warnings.is_empty());
        assert_eq!(config.export.exporter, expected);
    }
    for value in ["otel", "json", "0"] {
        assert_rejected(EXPORTER, value, "otlp");
    }
    for value in ["0", "1025", "-1", "x"] {
        assert_rejected(EXPORT_QUEUE, value, "8");
    }
    for value in ["0", "1000001", "1e3"] {
        assert_rejected(CARDINALITY_LIMIT, value, "2000");
    }
    let (config, _) = load(&[(EXPORT_QUEUE, "1"), (CARDINALITY_LIMIT, "0x10")]);
    assert_eq!((config.export.queue, config.export.cardinality_limit), (1, 16));
}

#[test]
fn endpoint_resolution_order() {
    let endpoint = |vars: &[(&str, &str)]| load(vars).0.export.endpoint;
    assert_eq!(endpoint(&[]), "http://localhost:4318/v1/metrics");
    assert_eq!(endpoint(&[(otel::ENDPOINT, "http://c:1")]), "http://c:1/v1/metrics");
    assert_eq!(
        endpoint(&[(otel::ENDPOINT, "http://c:1/base/")]),
        "http://c:1/base/v1/metrics"
    );
    assert_eq!(
        endpoint(&[
            (otel::ENDPOINT, "http://c:1"),
            (otel::METRICS_ENDPOINT, "http://m:2/custom")
        ]),
        "http://m:2/custom"
    );
    assert_eq!(
        endpoint(&[
            (otel::METRICS_ENDPOINT, "http://m:2/custom"),
            (TELEMETRY_ENDPOINT, "http://127.0.0.1:9")
        ]),
        "http://127.0.0.1:9/v1/metrics"
    );
    assert_eq!(
        endpoint(&[(TELEMETRY_ENDPOINT, "http://[::1]:4318/v1/metrics")]),
        "http://[::1]:4318/v1/metrics"
    );
    // A bad value of ours keeps what the standard variables say.
    let (config, warnings) = load(&[(otel::ENDPOINT, "http://c:1"), (TELEMETRY_ENDPOINT, "c:x")]);
    assert_eq!(config.export.endpoint, "http://c:1/v1/metrics");
    assert_eq!(warnings.len(), 1);
    assert!(
        warnings[0].ends_with("using default http://c:1/v1/metrics"),
        "{warnings:?}"
    );
    for value in [
        "localhost:x4318",
        "ftp://x",
        "http://",
        "http://:80",
        "http://h:x",
        "http://h:99999",
        "http://a b",
    ] {
        assert_rejected(TELEMETRY_ENDPOINT, value, "http://localhost:4318/v1/metrics");
    }
    if !cfg!(feature = "tls") {
        assert_rejected(TELEMETRY_ENDPOINT, "https://c:4318", "http://localhost:4318/v1/metrics");
    }
}

#[test]
fn protocol_timeout_and_temporality() {
    let (config, warnings) = load(&[(otel::PROTOCOL, "http/json"), (otel::TIMEOUT, "100")]);
    assert!(warnings.is_empty());
    assert_eq!(config.export.protocol, Protocol::HttpJson);
    assert_eq!(config.export.timeout, Duration::from_millis(100));
    let (config, _) = load(&[
        (otel::PROTOCOL, "http/json"),
        (otel::METRICS_PROTOCOL, "http/protobuf"),
        (otel::TIMEOUT, "100"),
        (otel::METRICS_TIMEOUT, "200"),
    ]);
    assert_eq!(config.export.protocol, Protocol::HttpProtobuf);
    assert_eq!(config.export.timeout, Duration::from_millis(200));
    let (config, _) = load(&[(otel::METRICS_TIMEOUT, "200"), (TELEMETRY_BATCH_TIMEOUT_MS, "50")]);
    assert_eq!(config.export.timeout, Duration::from_millis(50));
    for value in ["0", "60001", "1.5", "abc"] {
        assert_rejected(TELEMETRY_BATCH_TIMEOUT_MS, value, "3000");
    }
    assert_rejected(otel::PROTOCOL, "http", "http/protobuf");
    let grpc = load(&[(otel::PROTOCOL, "grpc")]);
    if cfg!(feature = "grpc") {
        assert_eq!(grpc.0.export.protocol, Protocol::Grpc);
        assert_eq!(grpc.0.export.endpoint, "http://localhost:4317");
        let (config, _) = load(&[(otel::PROTOCOL, "grpc"), (TELEMETRY_ENDPOINT, "http://c:4317")]);
        assert_eq!(config.export.endpoint, "http://c:4317");
    } else {
        assert_eq!(grpc.1.len(), 1, "{:?}", grpc.1);
    }
    for (value, expected) in [
        ("cumulative", Temporality::Cumulative),
        ("Delta", Temporality::Delta),
        ("LOWMEMORY", Temporality::LowMemory),
    ] {
        assert_eq!(load(&[(otel::TEMPORALITY, value)]).0.export.temporality, expected);
    }
    assert_rejected(otel::TEMPORALITY, "deltas", "cumulative");
}

#[test]
fn headers_overlay_and_stay_secret() {
    let (config, warnings) = load(&[
        (otel::HEADERS, "authorization=Bearer%20abc, x-a = 1 ,"),
        (otel::METRICS_HEADERS, "x-a=2"),
    ]);
    assert!(warnings.is_empty());
    assert_eq!(
        config.export.headers,
        [
            ("authorization".into(), "Bearer abc".into()),
            ("x-a".into(), "2".into())
        ]
    );
    assert!(!config.describe().contains("abc"));
    let (config, warnings) = load(&[(otel::HEADERS, "secret-token-without-key")]);
    assert!(config.export.headers.is_empty());
    assert_eq!(warnings.len(), 1);
    assert!(!warnings[0].contains("secret"), "{warnings:?}");
    assert_eq!(load(&[(otel::HEADERS, "a=%zz")]).1.len(), 1);
}

#[test]
fn resource_and_service_name() {
    let (config, warnings) = load(&[(otel::RESOURCE_ATTRIBUTES, "team=ml,service.name=from-resource")]);
    assert!(warnings.is_empty());
    assert_eq!(config.export.service_name, "from-resource");
    assert_eq!(config.export.resource, [("team".into(), "ml".into())]);
    let (config, _) = load(&[
        (otel::RESOURCE_ATTRIBUTES, "service.name=from-resource"),
        (otel::SERVICE_NAME, "trainer"),
    ]);
    assert_eq!(config.export.service_name, "trainer");
    assert!(config.export.resource.is_empty());
    assert_eq!(load(&[(otel::RESOURCE_ATTRIBUTES, "novalue")]).1.len(), 1);
}

#[test]
fn file_pattern() {
    let (config, warnings) = load(&[(EXPORT_FILE, "/tmp/%h/%p-100%%.jsonl")]);
    assert!(warnings.is_empty());
    assert_eq!(config.export.file, "/tmp/%h/%p-100%%.jsonl");
    for value in ["a%d", "trailing%", "%H"] {
        assert_rejected(EXPORT_FILE, value, DEFAULT_EXPORT_FILE);
    }
}

#[test]
#[cfg(not(feature = "tls"))]
fn certificate_is_ignored_without_tls() {
    let (config, warnings) = load(&[(otel::CERTIFICATE, "/nonexistent"), (otel::METRICS_CERTIFICATE, "")]);
    assert_eq!((config, warnings), (Config::default(), Vec::new()));
}

/// A file in the temporary directory holding `contents`; returns its path.
#[cfg(feature = "tls")]
fn scratch(name: &str, contents: &[u8]) -> String {
    let path = std::env::temp_dir().join(format!("nccl-otel-config-{}-{name}", std::process::id()));
    std::fs::write(&path, contents).unwrap();
    path.to_string_lossy().into_owned()
}

/// A self-signed CA certificate, PEM.
#[cfg(feature = "tls")]
fn ca_pem() -> String {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.self_signed(&key).unwrap().pem()
}

#[test]
#[cfg(feature = "tls")]
fn certificate_files() {
    let ca = ca_pem();
    let key = rcgen::KeyPair::generate().unwrap().serialize_pem();
    // A key section before the certificate is skipped.
    let good = scratch("good.pem", format!("{key}{ca}").as_bytes());
    let other = scratch("other.pem", ca_pem().as_bytes());
    let (config, warnings) = load(&[(otel::CERTIFICATE, &good)]);
    assert!(warnings.is_empty(), "{warnings:?}");
    let loaded = config.export.certificate.clone().expect("CA file");
    assert_eq!(
        (loaded.path.as_str(), loaded.pem.as_slice()),
        (good.as_str(), format!("{key}{ca}").as_bytes())
    );
    let line = config.describe();
    assert!(
        line.ends_with(&format!(" {}={good}", otel::METRICS_CERTIFICATE)),
        "{line}"
    );
    let (_, pairs) = line.split_once(": ").unwrap();
    let vars: Vec<(&str, &str)> = pairs.split(' ').map(|pair| pair.split_once('=').unwrap()).collect();
    assert_eq!(load(&vars), (config, Vec::new()));

    // The metrics variable wins; a bad one warns once and keeps the generic one.
    let path = |vars: &[(&str, &str)]| load(vars).0.export.certificate.map(|c| c.path);
    let both = [
        (otel::CERTIFICATE, other.as_str()),
        (otel::METRICS_CERTIFICATE, good.as_str()),
    ];
    assert_eq!(path(&both), Some(good.clone()));
    let (config, warnings) = load(&[(otel::CERTIFICATE, &other), (otel::METRICS_CERTIFICATE, "/nonexistent")]);
    assert_eq!(config.export.certificate.map(|c| c.path), Some(other.clone()));
    assert_eq!(
        warnings,
        [format!(
            "{}='/nonexistent' is not a readable file of PEM CA certificates (at most 1 MiB); using \
             default {other}",
            otel::METRICS_CERTIFICATE
        )]
    );

    let body = ca.lines().filter(|l| !l.starts_with("-----")).collect::<String>();
    let bad = [
        scratch("empty.pem", b""),
        scratch("key.pem", key.as_bytes()),
        scratch("text.pem", b"not a certificate\n"),
        scratch("base64.pem", ca.replacen(&body[..8], "!!!!!!!!", 1).as_bytes()),
        scratch(
            "der.pem",
            b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        ),
        scratch("huge.pem", &vec![b'\n'; (1 << 20) + 1]),
    ];
    let tmp = std::env::temp_dir().to_string_lossy().into_owned();
    let not_files = ["/nonexistent/ca.pem", tmp.as_str(), "/dev/null", "/dev/stdin"];
    for value in bad.iter().map(String::as_str).chain(not_files) {
        for name in TLS_STANDARD {
            assert_rejected(name, value, "(the system roots)");
        }
    }
    for name in TLS_STANDARD {
        let (config, warnings) = load(&[(name, " ")]);
        assert_eq!(config, Config::default());
        assert_eq!(
            warnings,
            [format!("{name}='' is empty; using default (the system roots)")]
        );
    }
    for file in bad.iter().chain([&good, &other]) {
        std::fs::remove_file(file).unwrap();
    }
}

#[test]
fn global_is_loaded_once() {
    assert!(std::ptr::eq(Config::global(), Config::global()));
    let _ = Config::take_warnings();
    assert!(Config::take_warnings().is_empty());
}
