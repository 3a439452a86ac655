//! `docs/configuration.md` against the rows it is rendered from: the table of our variables
//! ([`VARS`]), the table of the standard ones ([`STANDARD_DOCS`]), the launcher variables
//! ([`LAUNCHER`]) and the example configuration line. On drift the test fails and prints the
//! fresh text; with `BLESS=1` it writes it into the file instead.

use std::fmt::Write as _;

use super::super::vars::{Fallback, STANDARD_DOCS, VARS};
use super::super::*;

/// The document, from the crate root.
const PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/configuration.md");
/// The header row of our variables' table.
const OURS: &str = "| variable | meaning | default | valid values | on a bad value |";
/// The header row of the standard variables' table.
const STANDARD_TABLE: &str = "| variable | meaning | default | on a bad value |";
/// The header row of the launcher variables' table.
const LAUNCHER_TABLE: &str = "| variable | launcher | resource attribute |";
/// How the example configuration line starts, up to the version.
const EXAMPLE: &str = "NCCL_PROFILER_OTEL: nccl-profiler-otel ";

/// Text for a table cell: `|` escaped.
fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

/// The table of [`VARS`], each default as [`Config::default`] shows it.
fn ours() -> String {
    let defaults = Config::default();
    let mut table = format!("{OURS}\n|---|---|---|---|---|\n");
    for var in VARS {
        let on_bad = match var.fallback {
            Fallback::Value(_) => "one warning, the default",
            Fallback::Standard => "one warning, the next in the chain",
        };
        let default = format!("`{}`{}", (var.show)(&defaults), var.default_note);
        let (name, doc, valid) = (var.name, cell(var.doc), cell(var.valid));
        let _ = writeln!(table, "| `{name}` | {doc} | {} | {valid} | {on_bad} |", cell(&default));
    }
    table
}

/// The table of [`STANDARD_DOCS`].
fn standard() -> String {
    let mut table = format!("{STANDARD_TABLE}\n|---|---|---|---|\n");
    for row in STANDARD_DOCS {
        let names: Vec<String> = row.names.iter().map(|n| format!("`{n}`")).collect();
        let (doc, default, on_bad) = (cell(row.doc), cell(row.default), cell(row.on_bad));
        let _ = writeln!(table, "| {} | {doc} | {default} | {on_bad} |", names.join(", "));
    }
    table
}

/// The table of [`LAUNCHER`], in its order of precedence.
fn launcher() -> String {
    let mut table = format!("{LAUNCHER_TABLE}\n|---|---|---|\n");
    for row in &LAUNCHER {
        let _ = writeln!(table, "| `{}` | {} | `{}` |", row.name, row.launcher, row.attribute);
    }
    table
}

/// `doc` with the table under `header` (the header and every `|` line right after it) replaced
/// by `table`.
fn with_table(doc: &str, header: &str, table: &str) -> String {
    let start = doc.find(&format!("\n{header}\n")).expect("the table's header") + 1;
    let len: usize = doc[start..]
        .split_inclusive('\n')
        .take_while(|line| line.starts_with('|'))
        .map(str::len)
        .sum();
    format!("{}{table}{}", &doc[..start], &doc[start + len..])
}

/// `doc` with the example configuration line replaced by [`Config::default`]'s, keeping the
/// version it names (the line shows the variables, not the release).
fn with_example(doc: &str) -> String {
    let start = doc.find(&format!("\n{EXAMPLE}")).expect("the example line") + 1;
    let end = start + doc[start..].find('\n').expect("a line");
    let version_end = start + EXAMPLE.len() + doc[start + EXAMPLE.len()..end].find(": ").expect("a version");
    let described = Config::default().describe();
    let (_, pairs) = described.split_once(": ").expect("the version's colon");
    format!("{}: {pairs}{}", &doc[..version_end], &doc[end..])
}

#[test]
fn docs_match_the_rows() {
    let doc = std::fs::read_to_string(PATH).unwrap();
    let tables = with_table(&with_table(&doc, OURS, &ours()), STANDARD_TABLE, &standard());
    let fresh = with_example(&with_table(&tables, LAUNCHER_TABLE, &launcher()));
    if fresh == doc {
        return;
    }
    if std::env::var("BLESS").is_ok_and(|v| v == "1") {
        std::fs::write(PATH, fresh).unwrap();
        return;
    }
    panic!(
        "docs/configuration.md does not match the rows of src/config/vars.rs: rerun with BLESS=1 to rewrite \
         it, or paste\n\n{}\n{}\n{}\nNCCL_PROFILER_OTEL: {}\n",
        ours(),
        standard(),
        launcher(),
        Config::default().describe()
    );
}

#[test]
fn every_standard_variable_is_documented_once() {
    let documented: Vec<&str> = STANDARD_DOCS.iter().flat_map(|row| row.names.iter().copied()).collect();
    let read: Vec<&str> = STANDARD.iter().chain(&TLS_STANDARD).copied().collect();
    for name in &read {
        let rows = documented.iter().filter(|n| *n == name).count();
        assert_eq!(rows, 1, "{name} in {rows} rows of STANDARD_DOCS");
    }
    assert_eq!(documented.len(), read.len(), "STANDARD_DOCS names a variable not read");
}
