//! Who is exporting: the OTLP resource every request carries.
//! Called on: the telemetry thread (pipeline start), the exporter thread (file path).
#![forbid(unsafe_code)]

use opentelemetry::KeyValue;
use opentelemetry_sdk::Resource;

use crate::config;

/// The resource of every export: `service.name`, `service.instance.id` (`<host>:<pid>`, unique
/// per process at any one time, so that no two processes' series coincide), `host.name`,
/// `process.pid`, the SDK's `telemetry.sdk.*`, ours as `telemetry.distro.*`, the launcher
/// identity and `OTEL_RESOURCE_ATTRIBUTES` (which wins).
pub fn resource(config: &config::Export) -> Resource {
    let pid = std::process::id();
    let mut attributes = vec![
        KeyValue::new("service.instance.id", format!("{}:{pid}", host_name())),
        KeyValue::new("telemetry.sdk.name", "opentelemetry"),
        KeyValue::new("telemetry.sdk.language", "rust"),
        KeyValue::new("telemetry.distro.name", "nccl-profiler-otel"),
        KeyValue::new("telemetry.distro.version", env!("CARGO_PKG_VERSION")),
        KeyValue::new("host.name", host_name()),
        KeyValue::new("process.pid", i64::from(pid)),
    ];
    attributes.extend(config.resource.iter().map(|(k, v)| KeyValue::new(k.clone(), v.clone())));
    attributes.push(KeyValue::new("service.name", config.service_name.clone()));
    Resource::builder_empty().with_attributes(attributes).build()
}

/// The kernel's host name (`/proc/sys/kernel/hostname`), else `unknown`.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".to_owned())
}
