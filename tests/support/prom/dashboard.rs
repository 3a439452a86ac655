//! The Grafana dashboards of `docs/grafana` (the classic one and its native-histogram variant):
//! the JSON checked for what Grafana needs to import and draw it, and the queries, with the
//! template variables replaced, to run on a real Prometheus (`server`).

use std::collections::BTreeSet;

use serde_json::Value;

pub const PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/grafana/nccl-dashboard.json");

/// One panel: its title and its targets' queries.
pub struct Panel {
    pub title: String,
    pub queries: Vec<String>,
}

/// The dashboard's panels, after checking its JSON: a unique uid and title, the `datasource`,
/// `job`, `host` and `comm` variables, panels of known types with unique ids inside the 24-column grid,
/// each on the `${datasource}` variable with at least one target of a distinct `refId`, and
/// queries that use no variable beyond those and `$__rate_interval`, of the dashboard at `path`.
/// `vars` replaces the variables in the queries: (`$name`, value).
pub fn panels(path: &str, vars: &[(&str, &str)]) -> Result<Vec<Panel>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let dash: Value = serde_json::from_str(&text).map_err(|e| format!("{path}: {e}"))?;
    let field = |v: &Value, k: &str| v[k].as_str().map(str::to_owned).ok_or(format!("no {k} in {v}"));
    field(&dash, "uid")?;
    field(&dash, "title")?;
    let defined: BTreeSet<String> = dash["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v["name"].as_str().map(str::to_owned))
        .collect();
    for name in ["datasource", "job", "host", "comm"] {
        if !defined.contains(name) {
            return Err(format!("no template variable {name}"));
        }
    }
    let known: BTreeSet<String> = defined.iter().cloned().chain(["__rate_interval".to_owned()]).collect();
    let mut ids = BTreeSet::new();
    let mut panels = Vec::new();
    for p in dash["panels"].as_array().ok_or("no panels")? {
        let title = field(p, "title")?;
        let id = p["id"].as_u64().ok_or(format!("{title}: no id"))?;
        if !ids.insert(id) {
            return Err(format!("{title}: id {id} used twice"));
        }
        let grid = &p["gridPos"];
        let (x, w) = (grid["x"].as_u64(), grid["w"].as_u64());
        if !x.zip(w).is_some_and(|(x, w)| w > 0 && x + w <= 24) || grid["y"].as_u64().is_none() {
            return Err(format!("{title}: gridPos {grid} outside the 24-column grid"));
        }
        match field(p, "type")?.as_str() {
            "row" => continue,
            "timeseries" | "table" => {}
            other => return Err(format!("{title}: panel type {other}")),
        }
        if p["datasource"]["uid"] != "${datasource}" {
            return Err(format!("{title}: datasource {}", p["datasource"]));
        }
        let targets = p["targets"]
            .as_array()
            .filter(|t| !t.is_empty())
            .ok_or(format!("{title}: no targets"))?;
        let refs: BTreeSet<&str> = targets.iter().filter_map(|t| t["refId"].as_str()).collect();
        if refs.len() != targets.len() {
            return Err(format!("{title}: refIds missing or repeated"));
        }
        let mut queries = Vec::new();
        for t in targets {
            let mut expr = field(t, "expr")?;
            for var in variables(&expr) {
                if !known.contains(&var) {
                    return Err(format!("{title}: ${var} is not a variable of the dashboard"));
                }
            }
            for (name, value) in vars {
                expr = expr.replace(name, value);
            }
            queries.push(expr);
        }
        panels.push(Panel { title, queries });
    }
    Ok(panels)
}

/// The `$name` and `${name}` variables of a query.
fn variables(expr: &str) -> Vec<String> {
    expr.split('$')
        .skip(1)
        .map(|rest| {
            let rest = rest.strip_prefix('{').unwrap_or(rest);
            rest.chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect()
        })
        .collect()
}
