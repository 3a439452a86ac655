//! The Prometheus rules against the culprit vocabulary (`src/culprit.rs`): every alert and its
//! `for:`, every `nccl_wait` matcher and `nccl_where` value, and every threshold of every rule
//! (a number compared with, multiplied by, or the quantile of a `quantile` function; `> 0`, "any",
//! is none) are the vocabulary's, in both rules files. A rule that changes a threshold or a wait
//! set, or gains one, fails here until the vocabulary (and so `nccl_report`) says the same. The
//! docs' lists of `nccl.wait` values are the vocabulary's waits too.

use std::collections::BTreeSet;

use nccl_profiler_otel::culprit::*;

use crate::RULES;
use crate::support::prom::native;

/// One rule of a rules file: `record` or `alert` name, its expression, its `for:` in seconds.
#[derive(Debug)]
struct Rule {
    name: String,
    alert: bool,
    expr: String,
    held: u64,
}

/// The rules of a rules file (a plain reading of the layout `docs/prometheus/` uses).
fn rules(text: &str) -> Vec<Rule> {
    let mut out: Vec<Rule> = Vec::new();
    let mut block: Option<usize> = None;
    for line in text.lines() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if let Some(at) = block {
            if trimmed.is_empty() || indent > at {
                let rule = out.last_mut().expect("a rule");
                rule.expr += trimmed;
                rule.expr.push('\n');
                continue;
            }
            block = None;
        }
        if trimmed.starts_with('#') {
            continue;
        }
        let field = |key: &str| trimmed.strip_prefix(key).map(str::trim);
        if let Some(name) = field("- record:") {
            out.push(Rule {
                name: name.to_owned(),
                alert: false,
                expr: String::new(),
                held: 0,
            });
        } else if let Some(name) = field("- alert:") {
            out.push(Rule {
                name: name.to_owned(),
                alert: true,
                expr: String::new(),
                held: 0,
            });
        } else if let Some(expr) = field("expr:") {
            let rule = out.last_mut().expect("expr: outside a rule");
            match expr {
                "|" => block = Some(indent),
                _ => rule.expr = expr.to_owned(),
            }
        } else if let Some(held) = field("for:") {
            let secs = held.strip_suffix('s').and_then(|s| s.parse().ok());
            out.last_mut().expect("for: outside a rule").held = secs.unwrap_or_else(|| panic!("for: {held}"));
        }
    }
    out
}

/// An expression's tokens, without its strings, label matchers (`{…}`) and ranges (`[…]`).
fn tokens(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = expr.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' => while chars.next().is_some_and(|c| c != '"') {},
            '{' => while chars.next().is_some_and(|c| c != '}') {},
            '[' => while chars.next().is_some_and(|c| c != ']') {},
            c if c.is_whitespace() => {}
            c if c.is_ascii_alphanumeric() || c == '_' || c == ':' || c == '.' => {
                let mut word = String::from(c);
                while let Some(&n) = chars
                    .peek()
                    .filter(|n| n.is_ascii_alphanumeric() || matches!(n, '_' | ':' | '.'))
                {
                    word.push(n);
                    chars.next();
                }
                out.push(word);
            }
            c => {
                let mut op = String::from(c);
                if chars.peek() == Some(&'=') && matches!(c, '<' | '>' | '=' | '!') {
                    op.push('=');
                    chars.next();
                }
                out.push(op);
            }
        }
    }
    out
}

/// An expression's thresholds: (the comparison, `*` or `quantile`, the number), in order.
fn thresholds(expr: &str) -> Vec<(String, f64)> {
    let t = tokens(expr);
    let mut out = Vec::new();
    for (i, tok) in t.iter().enumerate() {
        let Ok(v) = tok.parse::<f64>() else { continue };
        let prev = i.checked_sub(1).map(|j| t[j].as_str());
        let next = t.get(i + 1).map(String::as_str);
        match (prev, next) {
            (Some(op @ ("<" | ">" | "<=" | ">=" | "==" | "!=")), _) if v != 0.0 => out.push((op.to_owned(), v)),
            (_, Some("*")) => out.push(("*".to_owned(), v)),
            (Some("("), Some(",")) if function(&t, i - 1).contains("quantile") => out.push(("quantile".to_owned(), v)),
            _ => {}
        }
    }
    out
}

/// The function whose argument list opens at token `open` (`f (`, or `f by (…) (`).
fn function(t: &[String], open: usize) -> &str {
    let mut k = open.saturating_sub(1);
    if t[k] == ")" {
        while k > 0 && t[k] != "(" {
            k -= 1;
        }
        k = k.saturating_sub(2);
    }
    &t[k]
}

/// The sets of waits an expression's `nccl_wait` matchers accept, in order.
fn wait_matchers(expr: &str) -> Vec<BTreeSet<String>> {
    expr.split("nccl_wait")
        .skip(1)
        .filter_map(|rest| {
            let value = |prefix: &str| rest.strip_prefix(prefix)?.split('"').next();
            match (value("=~\""), value("=\"")) {
                (Some(re), _) => Some(re.split('|').map(str::to_owned).collect()),
                (_, Some(name)) => Some(BTreeSet::from([name.to_owned()])),
                _ if rest.starts_with('"') || rest.starts_with(')') || rest.starts_with(',') => None,
                _ => panic!("a matcher on nccl_wait the vocabulary has no set for: nccl_wait{rest}"),
            }
        })
        .collect()
}

/// The constant `nccl_where` values an expression sets (`label_replace(…, "nccl_where", "X", "", "")`).
fn wheres(expr: &str) -> Vec<String> {
    expr.split("\"nccl_where\", \"")
        .skip(1)
        .filter_map(|rest| {
            rest.split('"')
                .next()
                .filter(|v| !v.starts_with('$'))
                .map(str::to_owned)
        })
        .collect()
}

fn names(blame: Blame) -> BTreeSet<String> {
    Wait::ALL
        .into_iter()
        .filter(|w| w.blame() == blame)
        .map(|w| w.as_str().to_owned())
        .collect()
}

/// What a rule says: its thresholds, the sets of its `nccl_wait` matchers, its `nccl_where`
/// values.
#[derive(Clone, Debug, Default)]
struct Says {
    thresholds: Vec<(&'static str, f64)>,
    waits: Vec<BTreeSet<String>>,
    wheres: Vec<String>,
}

/// What each rule must say, from the vocabulary. Every rule not listed says nothing.
fn expected() -> Vec<(&'static str, Says)> {
    let limits = |t: &[(&'static str, f64)]| Says {
        thresholds: t.to_vec(),
        ..Says::default()
    };
    let waits = |w: &[BTreeSet<String>]| Says {
        waits: w.to_vec(),
        ..Says::default()
    };
    let one = |w: Wait| BTreeSet::from([w.as_str().to_owned()]);
    let (nic, ends, comms) = (NIC_LINKS as f64, SLOW_HOST_ENDS as f64, SLOW_HOST_COMMS as f64);
    let straggler = [
        (">", STRAGGLER_WAIT),
        (">", STRAGGLER_SHARE),
        ("*", STRAGGLER_FACTOR),
        ("quantile", MEDIAN),
        ("<", SLOW_LINK),
        ("<", SLOW_LINK),
        ("<", SLOW_NOW),
        ("<", SLOW_NOW),
    ];
    let hung_rank = Says {
        wheres: [CROSSED_WHERE, Wait::Network].map(|w| w.as_str().to_owned()).to_vec(),
        ..limits(&[(">=", nic)])
    };
    vec![
        ("nccl:export:live", limits(&[("<", LIVE_INTERVALS)])),
        ("nccl:hang:waits_on", waits(&[names(Blame::Peer)])),
        ("nccl:hang:self", waits(&[names(Blame::Itself)])),
        ("nccl:hang:on_network", waits(&[names(Blame::Link)])),
        ("nccl:hang:crossed", waits(&[one(CROSSED.0), one(CROSSED.1)])),
        ("nccl:culprit:hung_rank", hung_rank),
        ("nccl:culprit:hung_link", limits(&[(">=", nic), (">=", nic)])),
        ("NcclRankAbsent", limits(&[(">=", ABSENT_SECS), (">=", ABSENT_SECS)])),
        ("nccl:link_throughput:median15s", limits(&[("quantile", MEDIAN)])),
        ("nccl:link_throughput:ratio", limits(&[("quantile", FAST_LINKS)])),
        ("nccl:link_throughput:now_ratio", limits(&[("quantile", FAST_LINKS)])),
        ("nccl:host_comm:slow_link_ends", limits(&[("<", SLOW_LINK)])),
        (
            "nccl:culprit:slow_host",
            limits(&[(">", SLOW_HOST_SHARE), (">=", ends)]),
        ),
        ("nccl:culprit:slow_link", limits(&[("<", SLOW_LINK), (">=", comms)])),
        ("nccl:peer_wait:median15s", limits(&[("quantile", MEDIAN)])),
        ("nccl:culprit:straggler", limits(&straggler)),
    ]
}

/// Every difference between the rules file `text` and the vocabulary.
fn drift(text: &str) -> Vec<String> {
    let rules = rules(text);
    let mut problems = Vec::new();
    let alerts: Vec<(&str, u64)> = rules
        .iter()
        .filter(|r| r.alert)
        .map(|r| (r.name.as_str(), r.held))
        .collect();
    let named: Vec<(&str, u64)> = Alert::ALL.iter().map(|a| (a.name(), a.held_secs())).collect();
    if alerts != named {
        problems.push(format!("alerts and their for: {alerts:?}, the vocabulary's {named:?}"));
    }
    let expected = expected();
    for (name, _) in &expected {
        if !rules.iter().any(|r| r.name == *name) {
            problems.push(format!("{name}: no such rule"));
        }
    }
    let sorted = |mut v: Vec<(String, f64)>| {
        v.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
        v
    };
    for r in &rules {
        let want = expected
            .iter()
            .find(|e| e.0 == r.name)
            .map(|e| e.1.clone())
            .unwrap_or_default();
        let thresholds_ = want.thresholds.iter().map(|(op, v)| ((*op).to_owned(), *v)).collect();
        let have = thresholds(&r.expr);
        if sorted(have.clone()) != sorted(thresholds_) {
            problems.push(format!(
                "{}: thresholds {have:?}, the vocabulary's {:?}",
                r.name, want.thresholds
            ));
        }
        let have = wait_matchers(&r.expr);
        if have != want.waits {
            problems.push(format!(
                "{}: nccl_wait sets {have:?}, the vocabulary's {:?}",
                r.name, want.waits
            ));
        }
        let have = wheres(&r.expr);
        if have != want.wheres {
            problems.push(format!(
                "{}: nccl_where values {have:?}, the vocabulary's {:?}",
                r.name, want.wheres
            ));
        }
    }
    problems
}

#[test]
fn the_rules_say_what_the_vocabulary_says() {
    for path in [RULES, native::RULES] {
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert!(rules(&text).len() > expected().len(), "{path}: rules not read");
        let problems = drift(&text);
        assert!(
            problems.is_empty(),
            "{path} drifted from src/culprit.rs:\n{}",
            problems.join("\n")
        );
    }
}

/// The check sees a change: a threshold, a wait set, an alert's `for:`.
#[test]
fn a_changed_rule_is_drift() {
    let text = std::fs::read_to_string(RULES).unwrap();
    for (from, to) in [
        ("nccl:peer_wait:median15s > 0.002", "nccl:peer_wait:median15s > 0.001"),
        ("nccl_wait=~\"peer|recv\"", "nccl_wait=~\"peer|recv|gpu\""),
        ("nccl:hang:nic_links >= 2,", "nccl:hang:nic_links >= 3,"),
        ("        for: 5s\n", "        for: 10s\n"),
    ] {
        assert!(text.contains(from), "{from}");
        assert!(!drift(&text.replacen(from, to, 1)).is_empty(), "{from} → {to} not seen");
    }
}

/// docs/metrics.md's `nccl.wait` row and docs/operations.md's table of waits name exactly the
/// vocabulary's waits.
#[test]
fn the_docs_name_the_vocabulary_s_waits() {
    let read = |doc: &str| {
        let path = format!("{}/docs/{doc}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    };
    let listed: Vec<String> = Wait::ALL.iter().map(|w| format!("`{}`", w.as_str())).collect();
    let metrics = read("metrics.md");
    let row = metrics
        .lines()
        .find(|l| l.starts_with("| `nccl.wait` |"))
        .expect("the nccl.wait row");
    let names = listed.join(", ");
    let count = format!("| {} values |", Wait::ALL.len());
    assert!(
        row.contains(&names) && row.ends_with(&count),
        "docs/metrics.md: {row}\nmust list {names} {count}"
    );
    let operations = read("operations.md");
    let table: BTreeSet<&str> = operations
        .lines()
        .skip_while(|l| !l.starts_with("| `nccl.wait` | peer |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .filter_map(|l| l.split('|').nth(1).map(str::trim))
        .collect();
    let listed: BTreeSet<&str> = listed.iter().map(String::as_str).collect();
    assert_eq!(table, listed, "docs/operations.md's table of waits");
}
