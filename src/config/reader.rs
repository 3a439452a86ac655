//! The reader behind [`super::Config::from_lookup`]: one value at a time, with the rules every
//! variable follows (unset: the default, silently; blank, unparsable or out of range: the default
//! and exactly one warning naming the variable, the value and the default used).
#![forbid(unsafe_code)]

use super::Config;
use super::parse::parse_pairs;
use super::vars::Var;

/// Collects the warnings while [`Config::from_lookup`] reads variables one by one.
pub(super) struct Reader<L> {
    /// Where values come from (the environment, or a test's table).
    pub(super) lookup: L,
    /// One line per rejected value, in reading order.
    pub(super) warnings: Vec<String>,
}

impl<L: Fn(&str) -> Option<String>> Reader<L> {
    /// The value of `name`, trimmed; `None` when unset, or when blank (with a warning ending in
    /// `instead`, what is used in its place).
    pub(super) fn value(&mut self, name: &str, instead: impl FnOnce() -> String) -> Option<String> {
        let raw = (self.lookup)(name)?;
        let value = raw.trim();
        if value.is_empty() {
            self.warnings.push(format!("{name}='' is empty; {}", instead()));
            return None;
        }
        Some(value.to_owned())
    }

    /// Reads `name`: unset gives `default` silently; blank, or `parse` failing, gives `default`
    /// and a warning (saying the value is not what `parse`'s `Err` says).
    pub(super) fn read<T: Copy>(
        &mut self,
        name: &str,
        default: T,
        parse: impl Fn(&str) -> Result<T, String>,
        show: fn(T) -> String,
    ) -> T {
        self.read_owned(name, default, parse, |v| show(*v))
    }

    /// [`Reader::read`] for non-`Copy` values.
    pub(super) fn read_owned<T>(
        &mut self,
        name: &str,
        default: T,
        parse: impl Fn(&str) -> Result<T, String>,
        show: impl Fn(&T) -> String,
    ) -> T {
        let Some(value) = self.value(name, || format!("using default {}", show(&default))) else {
            return default;
        };
        parse(&value).unwrap_or_else(|valid| {
            self.reject(name, &value, &valid, &show(&default));
            default
        })
    }

    /// Applies one row of [`VARS`](super::vars::VARS) to `config`, whose field holds the row's
    /// default: unset keeps it silently; blank, or the row's parser failing, keeps it with a
    /// warning.
    pub(super) fn apply(&mut self, var: &Var, config: &mut Config) {
        let Some(value) = self.value(var.name, || format!("using default {}", (var.show)(config))) else {
            return;
        };
        if let Err(valid) = (var.set)(config, &value) {
            self.reject(var.name, &value, &valid, &(var.show)(config));
        }
    }

    /// The warning for a rejected value: `name='value' is not valid; using default shown`.
    fn reject(&mut self, name: &str, value: &str, valid: &str, shown: &str) {
        self.warnings
            .push(format!("{name}='{value}' is not {valid}; using default {shown}"));
    }

    /// A `k=v,…` list; a bad one warns without echoing the value (headers carry credentials)
    /// and gives the empty list.
    pub(super) fn read_pairs(&mut self, name: &str, secret: bool) -> Vec<(String, String)> {
        let Some(value) = self.value(name, || "ignoring it".to_owned()) else {
            return Vec::new();
        };
        parse_pairs(&value).unwrap_or_else(|| {
            let shown = if secret {
                format!("<{} bytes, not shown>", value.len())
            } else {
                format!("'{value}'")
            };
            self.warnings.push(format!(
                "{name}={shown} is not a comma-separated list of key=value pairs (values \
                 percent-encoded); ignoring it"
            ));
            Vec::new()
        })
    }
}
