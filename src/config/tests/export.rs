//! Unit tests of the export settings the fleet needs: the detail level, dropped metric families,
//! histogram aggregation, compression, the export interval and `OTEL_SDK_DISABLED`.

use super::super::*;
use super::{assert_rejected, load};

#[test]
fn dropped_families_and_histograms() {
    for (value, expected) in [
        ("none", vec![]),
        ("NONE", vec![]),
        ("channel", vec!["channel"]),
        (" link , Channel,link", vec!["link", "channel"]),
        ("progress,kernel,p2p,coll", vec!["coll", "p2p", "kernel", "progress"]),
        ("channel,Transfer", vec!["transfer", "channel"]),
    ] {
        let (config, warnings) = load(&[(DROP_METRICS, value)]);
        assert!(warnings.is_empty(), "{value}: {warnings:?}");
        assert_eq!(config.export.dropped, expected, "{value}");
    }
    for value in ["profiler", "channels", "transfers", "link;channel", "all", "none,x"] {
        assert_rejected(DROP_METRICS, value, "none");
    }
    for (value, expected) in [
        ("explicit_bucket_histogram", Histograms::Explicit),
        ("BASE2_EXPONENTIAL_BUCKET_HISTOGRAM", Histograms::Exponential),
    ] {
        assert_eq!(
            load(&[(otel::HISTOGRAM_AGGREGATION, value)]).0.export.histograms,
            expected
        );
    }
    assert_rejected(otel::HISTOGRAM_AGGREGATION, "exponential", "base2_exponential_bucket_histogram");
}

#[test]
fn detail_leaves_out_channels_and_transfers_unless_full() {
    for (vars, detail, left_out) in [
        (&[][..], Detail::Basic, vec!["transfer", "channel"]),
        (&[(DETAIL, "Full")][..], Detail::Full, vec![]),
        (&[(DETAIL, "basic"), (DROP_METRICS, "link")][..], Detail::Basic, vec!["transfer", "link", "channel"]),
        (&[(DETAIL, "full"), (DROP_METRICS, "channel")][..], Detail::Full, vec!["channel"]),
        (&[(DETAIL, "full"), (DROP_METRICS, "progress,p2p")][..], Detail::Full, vec!["p2p", "progress"]),
    ] {
        let (config, warnings) = load(vars);
        assert!(warnings.is_empty(), "{vars:?}: {warnings:?}");
        assert_eq!((config.export.detail, config.export.left_out()), (detail, left_out), "{vars:?}");
    }
    assert_rejected(DETAIL, "verbose", "basic");
}

#[test]
fn compression_interval_and_sdk_disabled() {
    for (vars, expected) in [
        (&[][..], Compression::Gzip),
        (&[(otel::COMPRESSION, "none")][..], Compression::None),
        (&[(otel::COMPRESSION, "GZIP")][..], Compression::Gzip),
        (
            &[(otel::COMPRESSION, "none"), (otel::METRICS_COMPRESSION, "gzip")][..],
            Compression::Gzip,
        ),
        (&[(otel::METRICS_COMPRESSION, "None")][..], Compression::None),
    ] {
        let (config, warnings) = load(vars);
        assert!(warnings.is_empty(), "{vars:?}: {warnings:?}");
        assert_eq!(config.export.compression, expected, "{vars:?}");
    }
    assert_rejected(otel::COMPRESSION, "zstd", "gzip");
    assert_rejected(otel::METRICS_COMPRESSION, "deflate", "gzip");

    let (config, warnings) = load(&[(otel::METRIC_EXPORT_INTERVAL, "250")]);
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(config.interval, Duration::from_millis(250));
    let (config, _) = load(&[(otel::METRIC_EXPORT_INTERVAL, "250"), (TELEMETRY_INTERVAL_SEC, "2")]);
    assert_eq!(config.interval, Duration::from_secs(2), "ours wins");
    for value in ["0", "9", "3600001", "1.5", "5s"] {
        assert_rejected(otel::METRIC_EXPORT_INTERVAL, value, "5000");
    }

    assert_eq!(load(&[(otel::SDK_DISABLED, "true")]).0.export.exporter, Exporter::None);
    assert_eq!(load(&[(otel::SDK_DISABLED, "false")]).0.export.exporter, Exporter::Otlp);
    let (config, _) = load(&[(otel::SDK_DISABLED, "true"), (EXPORTER, "file")]);
    assert_eq!(config.export.exporter, Exporter::File, "ours wins");
    assert_rejected(otel::SDK_DISABLED, "maybe", "false");
}
