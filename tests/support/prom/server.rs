//! A real Prometheus server over backfilled samples: `promtool tsdb create-blocks-from
//! openmetrics` writes the samples into a fresh data directory, `prometheus` serves it on a
//! loopback port and evaluates the rule files (every second) from its start. Queries go through
//! its HTTP API. Or a server with native histograms that receives its samples by remote write
//! (`remote_write`). Dropping the server stops it and removes the directory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use super::remote_write::WriteRequest;

/// One series of a query's result: its labels and value.
pub type Row = (BTreeMap<String, String>, f64);

pub struct Server {
    child: Child,
    dir: PathBuf,
    url: String,
}

impl Server {
    /// Backfills `openmetrics` and starts Prometheus on it with `rules`; `Err` says which step
    /// failed (with the tool's output), or that the tools are missing.
    pub fn start(openmetrics: &str, rules: &Path) -> Result<Server, String> {
        let dir = fresh_dir()?;
        let input = dir.join("samples.om");
        std::fs::write(&input, openmetrics).map_err(|e| e.to_string())?;
        let backfill = Command::new("promtool")
            .args(["tsdb", "create-blocks-from", "openmetrics"])
            .arg(&input)
            .arg(dir.join("data"))
            .output()
            .map_err(|e| format!("promtool: {e}"))?;
        if !backfill.status.success() {
            return Err(format!(
                "promtool tsdb create-blocks-from openmetrics {}: {}{}",
                input.display(),
                String::from_utf8_lossy(&backfill.stdout),
                String::from_utf8_lossy(&backfill.stderr)
            ));
        }
        Server::launch(dir, rules, &[])
    }

    /// Starts Prometheus on an empty data directory with `rules`, native histograms on and the
    /// remote-write receiver open ([`Server::write`]).
    pub fn remote_write(rules: &Path) -> Result<Server, String> {
        let flags = [
            "--enable-feature=native-histograms",
            "--web.enable-remote-write-receiver",
        ];
        Server::launch(fresh_dir()?, rules, &flags)
    }

    /// Sends `request` to the server's remote-write receiver.
    pub fn write(&self, request: &WriteRequest) -> Result<(), String> {
        super::remote_write::send(&format!("{}/api/v1/write", self.url), request)
    }

    /// Starts `prometheus` with `flags` on `dir`'s data directory, evaluating `rules`.
    fn launch(dir: PathBuf, rules: &Path, flags: &[&str]) -> Result<Server, String> {
        let config = dir.join("prometheus.yml");
        let yaml = format!(
            "global:\n  evaluation_interval: 1s\nrule_files:\n  - {}\n",
            rules.display()
        );
        std::fs::write(&config, yaml).map_err(|e| e.to_string())?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let log = std::fs::File::create(dir.join("prometheus.log")).map_err(|e| e.to_string())?;
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .args(flags)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("prometheus: {e}"))?;
        let server = Server {
            child,
            dir,
            url: format!("http://127.0.0.1:{port}"),
        };
        server.ready()?;
        Ok(server)
    }

    fn ready(&self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if reqwest::blocking::get(format!("{}/-/ready", self.url)).is_ok_and(|r| r.status().is_success()) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(format!("prometheus not ready in 30 s:\n{}", self.log()))
    }

    /// Prometheus' own log, for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }

    /// `GET /api/v1/<path>?<query>`: the `data` of a successful answer, else its error.
    fn api(&self, path: &str, query: &[(&str, String)]) -> Result<Value, String> {
        let query: Vec<String> = query.iter().map(|(k, v)| format!("{k}={}", encode(v))).collect();
        let url = format!("{}/api/v1/{path}?{}", self.url, query.join("&"));
        let body = reqwest::blocking::get(&url)
            .and_then(|r| r.text())
            .map_err(|e| format!("{url}: {e}"))?;
        let v: Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
        match v["status"].as_str() {
            Some("success") => Ok(v["data"].clone()),
            _ => Err(format!("{}: {}", v["errorType"], v["error"])),
        }
    }

    /// An instant query at `at` (now when `None`): its series.
    pub fn query(&self, expr: &str, at: Option<SystemTime>) -> Result<Vec<Row>, String> {
        let mut q = vec![("query", expr.to_owned())];
        if let Some(at) = at {
            let secs = at.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs_f64();
            q.push(("time", format!("{secs:.3}")));
        }
        let data = self.api("query", &q)?;
        let rows = data["result"].as_array().cloned().unwrap_or_default();
        Ok(rows
            .iter()
            .map(|r| {
                let labels = labels(&r["metric"]);
                let value = r["value"][1].as_str().and_then(|v| v.parse().ok()).unwrap_or(f64::NAN);
                (labels, value)
            })
            .collect())
    }

    /// Every rule Prometheus loaded: (name, query, health, last error).
    pub fn rules(&self) -> Result<Vec<(String, String, String, String)>, String> {
        let data = self.api("rules", &[])?;
        let groups = data["groups"].as_array().cloned().unwrap_or_default();
        let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
        Ok(groups
            .iter()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .map(|r| {
                (
                    text(&r["name"]),
                    text(&r["query"]),
                    text(&r["health"]),
                    text(&r["lastError"]),
                )
            })
            .collect())
    }

    /// The firing alerts (their `for` passed): their labels.
    #[allow(dead_code)] // the culprit benchmark's
    pub fn firing(&self) -> Result<Vec<BTreeMap<String, String>>, String> {
        let data = self.api("alerts", &[])?;
        let alerts = data["alerts"].as_array().cloned().unwrap_or_default();
        Ok(alerts
            .iter()
            .filter(|a| a["state"] == "firing")
            .map(|a| labels(&a["labels"]))
            .collect())
    }
}

/// Whether Prometheus and promtool are here; without them the server checks are skipped with a
/// message, unless `REQUIRE_PROMTOOL` is set (CI).
pub fn have_prometheus() -> bool {
    let found = ["prometheus", "promtool"].iter().all(|tool| {
        std::process::Command::new(tool)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    });
    assert!(
        found || std::env::var_os("REQUIRE_PROMTOOL").is_none(),
        "prometheus or promtool not found (apt-get install prometheus)"
    );
    if !found {
        eprintln!("prometheus not found: the dashboard's queries and the rules were not run on a server");
    }
    found
}

/// A fresh directory of this process for a server, with an empty `data` directory.
fn fresh_dir() -> Result<PathBuf, String> {
    let dir = std::env::temp_dir().join(format!("nccl-otel-prometheus-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("data")).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(dir)
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A JSON object of label names and values.
fn labels(v: &Value) -> BTreeMap<String, String> {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    v.as_object()
        .map(|m| m.iter().map(|(k, v)| (k.clone(), text(v))).collect())
        .unwrap_or_default()
}

/// `s` percent-encoded for a URL's query.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
