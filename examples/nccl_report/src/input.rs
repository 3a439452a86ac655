//! Reading OTLP-JSON lines from files, directories and standard input, plain or gzip; lines
//! that are not export requests are counted and skipped, and each file's are reported on
//! stderr. Single-threaded.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use crate::Request;

/// What the paths held.
#[derive(Default)]
pub struct Input {
    /// Every request read, in the order read.
    pub requests: Vec<Request>,
    /// Files read.
    pub files: usize,
    /// Lines that were not an export request.
    pub bad: usize,
    /// Paths that could not be read.
    pub unreadable: usize,
}

impl Input {
    /// Reads `path`: `-` standard input, a directory its files (by name, not its
    /// subdirectories or hidden files), else a file.
    pub fn path(&mut self, path: &str) {
        if path == "-" {
            return self.stream("standard input", Box::new(std::io::stdin().lock()));
        }
        let p = Path::new(path);
        if p.is_dir() {
            let listed = std::fs::read_dir(p).and_then(|d| d.map(|e| e.map(|e| e.path())).collect());
            let mut files: Vec<_> = match listed {
                Ok(files) => files,
                Err(e) => return self.unreadable(path, &e),
            };
            files.retain(|f| f.is_file() && !f.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.')));
            files.sort();
            for f in files {
                self.file(&f);
            }
        } else {
            self.file(p);
        }
    }

    fn file(&mut self, path: &Path) {
        match File::open(path) {
            Ok(f) => self.stream(&path.display().to_string(), Box::new(f)),
            Err(e) => self.unreadable(&path.display().to_string(), &e),
        }
    }

    fn unreadable(&mut self, name: &str, e: &std::io::Error) {
        eprintln!("nccl_report: {name}: cannot read: {e}");
        self.unreadable += 1;
    }

    /// Reads one stream's lines, decompressing it if it starts with gzip's magic number.
    fn stream(&mut self, name: &str, stream: Box<dyn Read + '_>) {
        self.files += 1;
        let mut reader = BufReader::new(stream);
        let gzip = reader.fill_buf().is_ok_and(|b| b.starts_with(&[0x1f, 0x8b]));
        let mut lines: Box<dyn BufRead + '_> = if gzip {
            Box::new(BufReader::new(flate2::bufread::MultiGzDecoder::new(reader)))
        } else {
            Box::new(reader)
        };
        let (mut number, mut bad, mut first_bad) = (0, 0, None);
        let mut line = Vec::new();
        loop {
            line.clear();
            match lines.read_until(b'\n', &mut line) {
                Ok(0) => break,
                Ok(_) => number += 1,
                Err(e) => {
                    eprintln!("nccl_report: {name}: cannot read past line {number}: {e}");
                    self.unreadable += 1;
                    break;
                }
            }
            if line.trim_ascii().is_empty() {
                continue;
            }
            match serde_json::from_slice::<Request>(&line) {
                Ok(request) => self.requests.push(request),
                Err(e) => {
                    bad += 1;
                    first_bad.get_or_insert((number, e));
                }
            }
        }
        if let Some((line, e)) = first_bad {
            eprintln!(
                "nccl_report: {name}: {bad} of {number} lines are not OTLP-JSON export \
                 requests, skipped (the first, line {line}: {e})"
            );
        }
        self.bad += bad;
    }
}
