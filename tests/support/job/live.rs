//! A real Prometheus fed live, as a collector feeds it: every OTLP request the benchmark's
//! receiver gets is translated and remote-written at once (`prom::remote_write`: the translation
//! a collector's `prometheusremotewrite` exporter applies), and Prometheus evaluates the
//! repository's rules on its own schedule. A poller reads the firing alerts every
//! [`POLL`] and keeps, per alert (its labels), when it was first and last seen firing.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::support::otlp_receiver::Receiver;
use crate::support::prom::remote_write;
use crate::support::prom::server::Server;

/// How often the alerts are read.
pub const POLL: Duration = Duration::from_secs(1);

/// An alert seen firing: its labels, when it was first and last seen.
#[derive(Clone, Debug)]
pub struct Firing {
    pub labels: BTreeMap<String, String>,
    pub first: Instant,
    pub last: Instant,
}

impl Firing {
    /// Label `name`, or "".
    pub fn label(&self, name: &str) -> &str {
        self.labels.get(name).map_or("", String::as_str)
    }
}

/// The receiver, the server and the two threads between them; stopped when dropped.
pub struct Live {
    pub receiver: Arc<Receiver>,
    pub server: Arc<Server>,
    firing: Arc<Mutex<Vec<Firing>>>,
    errors: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Live {
    /// Starts Prometheus with `rules` (native histograms, remote write) and the feed.
    pub fn start(rules: &Path) -> Result<Live, String> {
        let server = Arc::new(Server::remote_write(rules)?);
        let receiver = Arc::new(Receiver::start());
        let (firing, errors, stop) = (Arc::default(), Arc::default(), Arc::new(AtomicBool::new(false)));
        let mut live = Live {
            receiver,
            server,
            firing,
            errors,
            stop,
            threads: Vec::new(),
        };
        live.threads.push(live.feed());
        live.threads.push(live.poll());
        Ok(live)
    }

    /// Forwards what the receiver got, every 100 ms.
    fn feed(&self) -> JoinHandle<()> {
        let (rx, server, errors, stop) = (
            self.receiver.clone(),
            self.server.clone(),
            self.errors.clone(),
            self.stop.clone(),
        );
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                for req in rx.take() {
                    if let Err(e) = server.write(&remote_write::request(std::slice::from_ref(&req))) {
                        errors.lock().push(e);
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    }

    /// Reads the firing alerts every [`POLL`].
    fn poll(&self) -> JoinHandle<()> {
        let (server, firing, errors, stop) = (
            self.server.clone(),
            self.firing.clone(),
            self.errors.clone(),
            self.stop.clone(),
        );
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let now = Instant::now();
                match server.firing() {
                    Ok(alerts) => {
                        let mut seen = firing.lock();
                        for labels in alerts {
                            match seen.iter_mut().find(|f| f.labels == labels) {
                                Some(f) => f.last = now,
                                None => seen.push(Firing {
                                    labels,
                                    first: now,
                                    last: now,
                                }),
                            }
                        }
                    }
                    Err(e) => errors.lock().push(e),
                }
                std::thread::sleep(POLL);
            }
        })
    }

    /// Every alert of job `job` seen firing so far.
    pub fn firing(&self, job: &str) -> Vec<Firing> {
        self.firing
            .lock()
            .iter()
            .filter(|f| f.label("job") == job)
            .cloned()
            .collect()
    }

    /// Remote-write or API errors so far.
    pub fn errors(&self) -> Vec<String> {
        self.errors.lock().clone()
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
