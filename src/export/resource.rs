//! Who is exporting: the OTLP resource every request carries.
//! Called on: the telemetry thread (pipeline start), the exporter thread (file path).
#![forbid(unsafe_code)]

use opentelemetry::KeyValue;
use opentelemetry_sdk::Resource;

use super::catalogue::keys;
use crate::config;

/// The resource of every export: `service.name`, `service.instance.id`, `host.name`,
/// `process.pid`, the SDK's `telemetry.sdk.*`, ours as `telemetry.distro.*`, then the launcher
/// identity with `service.namespace` and `OTEL_RESOURCE_ATTRIBUTES` (which wins).
pub fn resource(config: &config::Export) -> Resource {
    let pid = std::process::id();
    let host = host_name();
    let mut attributes = vec![
        KeyValue::new(keys::SERVICE_INSTANCE_ID, instance_id(&host, pid, config)),
        KeyValue::new(keys::SDK_NAME, "opentelemetry"),
        KeyValue::new(keys::SDK_LANGUAGE, "rust"),
        KeyValue::new(keys::DISTRO_NAME, "nccl-profiler-otel"),
        KeyValue::new(keys::DISTRO_VERSION, env!("CARGO_PKG_VERSION")),
        KeyValue::new(keys::HOST_NAME, host),
        KeyValue::new(keys::PROCESS_PID, i64::from(pid)),
    ];
    attributes.extend(config.resource.iter().map(|(k, v)| KeyValue::new(k.clone(), v.clone())));
    attributes.push(KeyValue::new(keys::SERVICE_NAME, config.service_name.clone()));
    Resource::builder_empty().with_attributes(attributes).build()
}

/// `<host>:<pid>:<job.rank>`, or `<host>:<pid>` when the launcher gives no rank: unique per
/// process at any one time (the rank tells apart the processes of two PID namespaces on one host,
/// e.g. two containers), so that no two processes' series coincide.
fn instance_id(host: &str, pid: u32, config: &config::Export) -> String {
    match config.attribute(keys::JOB_RANK.as_str()) {
        Some(rank) => format!("{host}:{pid}:{rank}"),
        None => format!("{host}:{pid}"),
    }
}

/// The kernel's host name (`/proc/sys/kernel/hostname`), else `unknown`.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".to_owned())
}

#[cfg(test)]
mod tests {
    use opentelemetry::Key;

    use super::*;

    /// The resource's value of `key`, as a string.
    fn get(resource: &Resource, key: &'static str) -> Option<String> {
        resource.get(&Key::from_static_str(key)).map(|v| v.to_string())
    }

    /// A rank started by torchrun alone exports its job, rank and host, and an instance id that
    /// names the rank.
    #[test]
    fn launcher_identity_is_exported() {
        let vars = [("TORCHELASTIC_RUN_ID", "run-7"), ("RANK", "3"), ("WORLD_SIZE", "8")];
        let lookup = |name: &str| vars.iter().find(|(n, _)| *n == name).map(|(_, v)| (*v).to_owned());
        let config = config::Config::from_lookup(lookup).0;
        let r = resource(&config.export);
        let host = host_name();
        assert_eq!(get(&r, "service.name").as_deref(), Some("run-7"));
        assert_eq!(get(&r, "service.namespace").as_deref(), Some("run-7"));
        assert_eq!(get(&r, "job.rank").as_deref(), Some("3"));
        assert_eq!(get(&r, "host.name"), Some(host.clone()));
        let instance = format!("{host}:{}:3", std::process::id());
        assert_eq!(get(&r, "service.instance.id"), Some(instance));
        let plain = resource(&config::Config::default().export);
        assert_eq!(get(&plain, "service.name").as_deref(), Some("nccl"));
        let instance = format!("{host}:{}", std::process::id());
        assert_eq!(get(&plain, "service.instance.id"), Some(instance));
    }
}
