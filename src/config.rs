//! Every environment variable the plugin reads, parsed once per process into [`Config`].
//!
//! [`Config::from_lookup`] is pure: it takes a lookup function and returns the configuration plus
//! one warning per bad variable. [`Config::global`] applies it to the process environment the first
//! time it is called; [`Config::take_warnings`] hands its warnings out once, for logging through
//! NCCL. Called on: the NCCL app thread in `init` (the first call reads the environment), then any.
//!
//! Rules for every variable: unset, or empty after trimming whitespace, means the default, silently
//! (`VAR=` in a launcher script means "not set"). A value that does not parse or is out of range
//! gives the default and exactly one warning naming the variable, the value and the default used.
//! Nothing here panics. The table for operators is `docs/configuration.md`.
#![forbid(unsafe_code)]

use std::fmt::Write as _;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

use crate::handle::MAX_SLOTS;
use crate::regression::Mode;

/// Master switch: `false` makes `init` succeed with activation mask 0 (the plugin does nothing).
pub const ENABLE: &str = "NCCL_PROFILER_OTEL_ENABLE";
/// Whether the telemetry thread runs and exports.
pub const TELEMETRY_ENABLE: &str = "NCCL_PROFILER_OTEL_TELEMETRY_ENABLE";
/// Seconds between telemetry wake-ups (decimal allowed).
pub const TELEMETRY_INTERVAL_SEC: &str = "NCCL_PROFILER_OTEL_TELEMETRY_INTERVAL_SEC";
/// Which per-size transfer time the bandwidth/latency fit uses: `AVG` or `MIN`.
pub const LINEAR_REGRESSION_MODE: &str = "NCCL_PROFILER_LINEAR_REGRESSION_MODE";
/// Event bits (spec 2.2) stored into NCCL's activation mask.
pub const EVENT_MASK: &str = "NCCL_PROFILE_EVENT_MASK";
/// Record slots per window.
pub const WINDOW_CAPACITY: &str = "NCCL_PROFILER_OTEL_WINDOW_CAPACITY";
/// Records in a window that make the telemetry thread close it early.
pub const WINDOW_COUNT_TRIGGER: &str = "NCCL_PROFILER_OTEL_WINDOW_COUNT_TRIGGER";

/// Every variable read by [`Config::from_lookup`], in the order [`Config::describe`] prints them.
pub const ALL: [&str; 7] = [
    ENABLE,
    TELEMETRY_ENABLE,
    TELEMETRY_INTERVAL_SEC,
    LINEAR_REGRESSION_MODE,
    EVENT_MASK,
    WINDOW_CAPACITY,
    WINDOW_COUNT_TRIGGER,
];

/// Highest event bit NCCL defines (CeBatch, spec 2.2); masks with higher bits are rejected.
const MAX_EVENT_BIT: u32 = 14;

/// The effective configuration. Defaults: [`Config::default`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// [`ENABLE`], default `true`.
    pub enable: bool,
    /// [`TELEMETRY_ENABLE`], default `true`.
    pub telemetry_enable: bool,
    /// [`TELEMETRY_INTERVAL_SEC`], default 5 s, valid 0.01..=3600 s.
    pub interval: Duration,
    /// [`LINEAR_REGRESSION_MODE`], default [`Mode::Avg`].
    pub regression_mode: Mode,
    /// [`EVENT_MASK`], default Coll|P2p|ProxyOp|ProxyStep = 0x1E, bits 0..=14 only.
    pub event_mask: i32,
    /// [`WINDOW_CAPACITY`], default 100000, valid 1024..=[`MAX_SLOTS`].
    pub capacity: u32,
    /// [`WINDOW_COUNT_TRIGGER`], default min(50000, capacity/2), valid 1..=capacity.
    pub count_trigger: u32,
}

impl Default for Config {
    fn default() -> Self {
        Self::from_lookup(|_| None).0
    }
}

/// What [`Config::global`] loaded from the environment.
struct Loaded {
    config: Config,
    warnings: Mutex<Vec<String>>,
}

static GLOBAL: OnceLock<Loaded> = OnceLock::new();

impl Config {
    /// Parses every variable in [`ALL`] through `lookup`; returns the configuration and one warning
    /// per variable whose value was rejected:
    /// `VAR='value' is not <what>; using default <d>`.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> (Config, Vec<String>) {
        let mut r = Reader {
            lookup,
            warnings: Vec::new(),
        };
        let enable = r.read(ENABLE, true, BOOL, parse_bool, show_bool);
        let telemetry_enable = r.read(TELEMETRY_ENABLE, true, BOOL, parse_bool, show_bool);
        let interval = r.read(
            TELEMETRY_INTERVAL_SEC,
            Duration::from_secs(5),
            "a number of seconds in 0.01..=3600",
            parse_interval,
            show_secs,
        );
        let regression_mode = r.read(LINEAR_REGRESSION_MODE, Mode::Avg, "AVG or MIN", Mode::parse, show_mode);
        let event_mask = r.read(
            EVENT_MASK,
            0x1E,
            "an event mask using only bits 0..=14 (0..=0x7fff, decimal or 0x-hex)",
            parse_event_mask,
            show_mask,
        );
        let capacity = r.read(
            WINDOW_CAPACITY,
            100_000,
            &format!("an integer in 1024..={MAX_SLOTS}"),
            |s| parse_u32_in(s, 1024..=MAX_SLOTS),
            show_u32,
        );
        let count_trigger = r.read(
            WINDOW_COUNT_TRIGGER,
            50_000.min(capacity / 2),
            &format!("an integer in 1..={capacity} (the window capacity)"),
            |s| parse_u32_in(s, 1..=capacity),
            show_u32,
        );
        let config = Config {
            enable,
            telemetry_enable,
            interval,
            regression_mode,
            event_mask,
            capacity,
            count_trigger,
        };
        (config, r.warnings)
    }

    /// The configuration of this process, read from the environment on the first call.
    /// Called on: NCCL app thread (`init`), telemetry thread.
    pub fn global() -> &'static Config {
        &Self::loaded().config
    }

    /// The warnings produced while loading [`Config::global`]; the first call gets them, later
    /// calls get an empty `Vec`, so each bad variable is logged once per process.
    /// Called on: NCCL app thread.
    #[must_use]
    pub fn take_warnings() -> Vec<String> {
        let mut warnings = Self::loaded().warnings.lock().unwrap_or_else(PoisonError::into_inner);
        std::mem::take(&mut *warnings)
    }

    fn loaded() -> &'static Loaded {
        GLOBAL.get_or_init(|| {
            // Lossy: a non-UTF-8 value fails its parser and is reported, not taken as unset.
            let env = |name: &str| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned());
            let (config, warnings) = Self::from_lookup(env);
            Loaded {
                config,
                warnings: Mutex::new(warnings),
            }
        })
    }

    /// One line with the plugin version and every variable's effective value, in the syntax the
    /// variable accepts; logged at `init` on rank 0.
    #[must_use]
    pub fn describe(&self) -> String {
        let values = [
            show_bool(self.enable),
            show_bool(self.telemetry_enable),
            show_secs(self.interval),
            show_mode(self.regression_mode),
            show_mask(self.event_mask),
            show_u32(self.capacity),
            show_u32(self.count_trigger),
        ];
        let mut line = format!("nccl-profiler-otel {}:", env!("CARGO_PKG_VERSION"));
        for (name, value) in ALL.iter().zip(values) {
            let _ = write!(line, " {name}={value}"); // a String never fails
        }
        line
    }
}

/// Collects the warnings while [`Config::from_lookup`] reads variables one by one.
struct Reader<L> {
    lookup: L,
    warnings: Vec<String>,
}

impl<L: Fn(&str) -> Option<String>> Reader<L> {
    /// Reads `name`: unset or blank gives `default` silently; `parse` failing gives `default` and a
    /// warning saying the value is not `valid`.
    fn read<T: Copy>(
        &mut self,
        name: &str,
        default: T,
        valid: &str,
        parse: impl Fn(&str) -> Option<T>,
        show: fn(T) -> String,
    ) -> T {
        let Some(raw) = (self.lookup)(name) else {
            return default;
        };
        let value = raw.trim();
        if value.is_empty() {
            return default;
        }
        parse(value).unwrap_or_else(|| {
            let shown = show(default);
            self.warnings
                .push(format!("{name}='{value}' is not {valid}; using default {shown}"));
            default
        })
    }
}

const BOOL: &str = "a boolean (1/0, true/false, yes/no, on/off)";

fn parse_bool(s: &str) -> Option<bool> {
    match s.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

/// Decimal seconds; NaN and infinities fail the range check.
fn parse_interval(s: &str) -> Option<Duration> {
    let secs: f64 = s.parse().ok()?;
    (0.01..=3600.0).contains(&secs).then(|| Duration::from_secs_f64(secs))
}

/// A non-negative integer, decimal or `0x`-hex, digits only (no sign, no separators).
fn parse_uint(s: &str) -> Option<u64> {
    let (digits, radix) = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => (hex, 16),
        None => (s, 10),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(digits, radix).ok()
}

fn parse_u32_in(s: &str, valid: std::ops::RangeInclusive<u32>) -> Option<u32> {
    let value = u32::try_from(parse_uint(s)?).ok()?;
    valid.contains(&value).then_some(value)
}

fn parse_event_mask(s: &str) -> Option<i32> {
    let mask = parse_uint(s)?;
    if mask >> (MAX_EVENT_BIT + 1) != 0 {
        return None;
    }
    i32::try_from(mask).ok()
}

fn show_bool(value: bool) -> String {
    value.to_string()
}

fn show_secs(value: Duration) -> String {
    value.as_secs_f64().to_string()
}

fn show_mode(value: Mode) -> String {
    value.as_str().to_owned()
}

fn show_mask(value: i32) -> String {
    format!("{value:#x}")
}

fn show_u32(value: u32) -> String {
    value.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(vars: &[(&str, &str)]) -> (Config, Vec<String>) {
        Config::from_lookup(|name| vars.iter().find(|(n, _)| *n == name).map(|(_, v)| (*v).to_owned()))
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

    #[test]
    fn defaults() {
        let (config, warnings) = load(&[]);
        assert!(warnings.is_empty());
        assert_eq!(
            config,
            Config {
                enable: true,
                telemetry_enable: true,
                interval: Duration::from_secs(5),
                regression_mode: Mode::Avg,
                event_mask: 0x1E,
                capacity: 100_000,
                count_trigger: 50_000,
            }
        );
    }

    #[test]
    fn unset_empty_and_blank_are_silent_defaults() {
        for name in ALL {
            for value in ["", "   ", "\t"] {
                let (config, warnings) = load(&[(name, value)]);
                assert_eq!(config, Config::default(), "{name}={value:?}");
                assert!(warnings.is_empty(), "{name}={value:?}: {warnings:?}");
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
        ] {
            let (config, warnings) = load(&[(EVENT_MASK, value)]);
            assert!(warnings.is_empty(), "{value}: {warnings:?}");
            assert_eq!(config.event_mask, expected, "{value}");
        }
        for value in [
            "0x8000",
            "32768",
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
            assert_rejected(EVENT_MASK, value, "0x1e");
        }
    }

    #[test]
    fn capacity_and_trigger() {
        for (vars, capacity, trigger) in [
            (&[(WINDOW_CAPACITY, "1024")][..], 1024, 512),
            (&[(WINDOW_CAPACITY, "2097151")][..], MAX_SLOTS, 50_000),
            (&[(WINDOW_CAPACITY, "0x10000")][..], 65_536, 32_768),
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
            "2097152",
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
            assert_rejected(WINDOW_COUNT_TRIGGER, value, "50000");
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
        let vars: Vec<(&str, &str)> = ALL.iter().map(|name| (*name, "bogus")).collect();
        let (config, warnings) = load(&vars);
        assert_eq!(config, Config::default());
        assert_eq!(warnings.len(), ALL.len());
        for (name, warning) in ALL.iter().zip(&warnings) {
            assert!(warning.starts_with(&format!("{name}='bogus' is not ")), "{warning}");
        }
    }

    #[test]
    fn describe_round_trips() {
        let (config, _) = load(&[
            (ENABLE, "off"),
            (TELEMETRY_INTERVAL_SEC, "0.5"),
            (LINEAR_REGRESSION_MODE, "MIN"),
            (EVENT_MASK, "0x65e"),
            (WINDOW_CAPACITY, "4096"),
        ]);
        let line = config.describe();
        assert!(
            line.starts_with(&format!("nccl-profiler-otel {}: ", env!("CARGO_PKG_VERSION"))),
            "{line}"
        );
        assert!(line.contains(" NCCL_PROFILE_EVENT_MASK=0x65e "), "{line}");
        let (_, pairs) = line.split_once(": ").unwrap();
        let vars: Vec<(&str, &str)> = pairs.split(' ').map(|pair| pair.split_once('=').unwrap()).collect();
        assert_eq!(vars.len(), ALL.len());
        assert_eq!(load(&vars), (config, Vec::new()));
    }

    #[test]
    fn global_is_loaded_once() {
        assert!(std::ptr::eq(Config::global(), Config::global()));
        let _ = Config::take_warnings();
        assert!(Config::take_warnings().is_empty());
    }
}
