//! The reader behind [`super::Config::from_lookup`]: one value at a time, with the rules every
//! variable follows (unset: the default, silently; blank, unparsable or out of range: the default
//! and exactly one warning naming the variable, the value and the default used; a list with
//! unknown words: the known words and one warning naming the others). Each warning also records
//! a [`Problem`], which the self-telemetry exports.
#![forbid(unsafe_code)]

use super::Config;
use super::parse::{has_scheme, parse_pairs, with_scheme};
use super::vars::{ENDPOINTS, LISTS, Var};

/// A configuration problem the self-telemetry exports (`nccl.profiler.config.problems`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// The environment variable.
    pub variable: String,
    /// What is wrong with its value.
    pub kind: ProblemKind,
}

/// What is wrong with a variable's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProblemKind {
    /// Set, but blank: the default is used.
    Empty,
    /// Does not parse or is out of range: the default is used.
    Invalid,
    /// A list with entries that are not understood: the others are used.
    UnknownWords,
}

impl ProblemKind {
    /// The value of the exported `nccl.reason` attribute.
    pub fn as_str(self) -> &'static str {
        match self {
            ProblemKind::Empty => "empty",
            ProblemKind::Invalid => "invalid",
            ProblemKind::UnknownWords => "unknown_words",
        }
    }
}

/// Collects the warnings while [`Config::from_lookup`] reads variables one by one.
pub(super) struct Reader<L> {
    /// Where values come from (the environment, or a test's table).
    pub(super) lookup: L,
    /// One line per rejected value, and the notes on values taken as something else (an endpoint
    /// without a scheme), in reading order.
    pub(super) warnings: Vec<String>,
    /// One per rejected value or list with unknown entries, in reading order.
    pub(super) problems: Vec<Problem>,
}

impl<L: Fn(&str) -> Option<String>> Reader<L> {
    /// One warning line and the problem it reports.
    fn problem(&mut self, name: &str, kind: ProblemKind, line: String) {
        self.warnings.push(line);
        self.problems.push(Problem {
            variable: name.to_owned(),
            kind,
        });
    }

    /// The value of `name`, trimmed; `None` when unset, or when blank (with a warning ending in
    /// `instead`, what is used in its place). An endpoint without a scheme gets `http://`.
    pub(super) fn value(&mut self, name: &str, instead: impl FnOnce() -> String) -> Option<String> {
        let raw = (self.lookup)(name)?;
        let value = raw.trim();
        if value.is_empty() {
            let line = format!("{name}='' is empty; {}", instead());
            self.problem(name, ProblemKind::Empty, line);
            return None;
        }
        if ENDPOINTS.contains(&name) {
            return Some(with_scheme(value));
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
        match parse(&value) {
            Ok(parsed) => {
                self.note_scheme(name, &show(&parsed));
                parsed
            }
            Err(valid) => {
                self.reject(name, &valid, &show(&default));
                default
            }
        }
    }

    /// Applies one row of [`VARS`](super::vars::VARS) to `config`, whose field holds the row's
    /// default: unset keeps it silently; blank, or the row's parser failing, keeps it with a
    /// warning; a list variable ([`LISTS`]) with known and unknown words takes the known ones,
    /// with a warning naming the others.
    pub(super) fn apply(&mut self, var: &Var, config: &mut Config) {
        let Some(value) = self.value(var.name, || format!("using default {}", (var.show)(config))) else {
            return;
        };
        let Err(valid) = (var.set)(config, &value) else {
            self.note_scheme(var.name, &(var.show)(config));
            return;
        };
        if let Some((_, words)) = LISTS.iter().find(|(name, _)| *name == var.name) {
            let entries = value.split(',').map(str::trim).filter(|w| !w.is_empty());
            let (known, unknown): (Vec<&str>, Vec<&str>) =
                entries.partition(|w| words.iter().any(|k| k.eq_ignore_ascii_case(w)));
            if !known.is_empty() && (var.set)(config, &known.join(",")).is_ok() {
                if unknown.is_empty() {
                    return; // only blank entries, as in a trailing comma
                }
                let line = format!(
                    "{}='{value}' has unknown words {} (known: {}); using {}",
                    var.name,
                    quoted(&unknown),
                    words.join(","),
                    (var.show)(config)
                );
                self.problem(var.name, ProblemKind::UnknownWords, line);
                return;
            }
        }
        self.reject(var.name, &valid, &(var.show)(config));
    }

    /// The warning for a rejected value: `name='value' is not valid; using default shown`; the
    /// value shown is the one set, before an endpoint gets its scheme.
    fn reject(&mut self, name: &str, valid: &str, shown: &str) {
        let value = (self.lookup)(name).unwrap_or_default();
        let line = format!("{name}='{}' is not {valid}; using default {shown}", value.trim());
        self.problem(name, ProblemKind::Invalid, line);
    }

    /// The note for an endpoint accepted without a scheme: what it is taken as.
    fn note_scheme(&mut self, name: &str, shown: &str) {
        if !ENDPOINTS.contains(&name) {
            return;
        }
        let value = (self.lookup)(name).unwrap_or_default();
        let value = value.trim();
        if !has_scheme(value) {
            self.warnings
                .push(format!("{name}='{value}' has no scheme, so http:// is assumed: {shown}"));
        }
    }

    /// A `k=v,…` list: its well-formed entries; bad entries give one warning without echoing
    /// them when `secret` (headers carry credentials).
    pub(super) fn read_pairs(&mut self, name: &str, secret: bool) -> Vec<(String, String)> {
        let Some(value) = self.value(name, || "ignoring it".to_owned()) else {
            return Vec::new();
        };
        let (pairs, bad) = parse_pairs(&value);
        if bad.is_empty() {
            return pairs;
        }
        let shown = if secret {
            format!("<{} bytes, not shown>", value.len())
        } else {
            format!("'{value}'")
        };
        let line = if pairs.is_empty() {
            format!(
                "{name}={shown} is not a comma-separated list of key=value pairs (values percent-encoded); \
                 ignoring it"
            )
        } else {
            let entries = if secret { format!("{} (not shown)", bad.len()) } else { quoted(&bad) };
            format!(
                "{name}={shown} has entries that are not key=value pairs (values percent-encoded): \
                 {entries}; ignoring them, using the other {}",
                pairs.len()
            )
        };
        let kind = if pairs.is_empty() { ProblemKind::Invalid } else { ProblemKind::UnknownWords };
        self.problem(name, kind, line);
        pairs
    }
}

/// `'a', 'b'` for a warning.
fn quoted(words: &[&str]) -> String {
    let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    quoted.join(", ")
}
