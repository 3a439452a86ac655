//! The launcher's identity: the job this process belongs to and its place in it, read from the
//! variables of Slurm, torchrun, MPI and Kubernetes ([`LAUNCHER`]) as resource attributes, and the
//! `service.*` names derived from them when the user's `OTEL_*` variables leave them unset.
//! Called on: whichever thread loads the configuration first; no state.
#![forbid(unsafe_code)]

use super::attribute;
use super::vars::{DEFAULT_SERVICE_NAME, IN_KUBERNETES, KUBERNETES, LAUNCHER};

/// torchrun's run id when none was given (`--rdzv-id` unset): it names no job, so it is skipped.
const NO_RUN_ID: (&str, &str) = ("TORCHELASTIC_RUN_ID", "none");

/// The attributes of the launcher variables that are set: for each attribute the first row of
/// [`LAUNCHER`] whose value is non-empty after trimming, and `job.launcher`, the launcher of the
/// first such row (the one naming the job, when any does). Sorted by key.
pub(super) fn detect(lookup: impl Fn(&str) -> Option<String>) -> Vec<(String, String)> {
    let in_kubernetes = lookup(IN_KUBERNETES).is_some();
    let mut found: Vec<(String, String)> = Vec::new();
    let mut launcher = None;
    for row in &LAUNCHER {
        if (row.launcher == KUBERNETES && !in_kubernetes) || found.iter().any(|(k, _)| k == row.attribute) {
            continue;
        }
        let Some(value) = lookup(row.name) else { continue };
        let value = value.trim();
        if value.is_empty() || (row.name, value) == NO_RUN_ID {
            continue;
        }
        launcher.get_or_insert(row.launcher);
        found.push((row.attribute.to_owned(), value.to_owned()));
    }
    if let Some(launcher) = launcher {
        found.push(("job.launcher".to_owned(), launcher.to_owned()));
    }
    found.sort();
    found
}

/// Completes `resource` (sorted by key, the user's attributes already overlaid, `service.name`
/// taken out) with `service.namespace` = `job.id`, else `k8s.namespace.name`, when it has none,
/// so that two concurrent jobs of one name never mix; returns the `service.name` to use when the
/// user set none: `job.name`, else `job.id`, else `nccl-<job.launcher>`, else
/// [`DEFAULT_SERVICE_NAME`].
pub(super) fn complete(resource: &mut Vec<(String, String)>) -> String {
    let get = |resource: &[(String, String)], key: &str| attribute(resource, key).map(str::to_owned);
    if let Err(at) = resource.binary_search_by(|(k, _)| k.as_str().cmp("service.namespace")) {
        if let Some(namespace) = get(resource, "job.id").or_else(|| get(resource, "k8s.namespace.name")) {
            resource.insert(at, ("service.namespace".to_owned(), namespace));
        }
    }
    get(resource, "job.name")
        .or_else(|| get(resource, "job.id"))
        .or_else(|| get(resource, "job.launcher").map(|l| format!("{DEFAULT_SERVICE_NAME}-{l}")))
        .unwrap_or_else(|| DEFAULT_SERVICE_NAME.to_owned())
}
