// Shared by the targets (included with `#[path]`): scratch files on tmpfs, one directory per
// fuzzing process, so the real `open` paths (mmap included) are what gets fuzzed; input
// splitting; the gateway's request limits. Each target uses some of it.
#![allow(dead_code)]

use std::path::PathBuf;

pub fn scratch_dir(target: &str) -> PathBuf {
    let base = if std::path::Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
    // libFuzzer ends a process with exit(), past every destructor: the directories of
    // processes that are gone are removed here instead, so runs do not pile them up in RAM.
    let prefix = format!("edge-fuzz-{target}-");
    for entry in std::fs::read_dir(&base).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix(&prefix).and_then(|p| p.parse::<u32>().ok()) else { continue };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
    let dir = base.join(format!("{prefix}{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// Splits `data` at the first occurrence of `sep` (the rest after it), or None.
pub fn split_once<'a>(data: &'a [u8], sep: &[u8]) -> Option<(&'a [u8], &'a [u8])> {
    data.windows(sep.len()).position(|w| w == sep).map(|i| (&data[..i], &data[i + sep.len()..]))
}

/// An engine's limits over an 8K context, as its `Info` publishes them.
pub fn gateway_limits() -> gateway::limits::Limits {
    gateway::limits::Limits {
        context_length: 8192,
        max_completion_tokens: 8191,
        max_top_logprobs: 20,
        max_stop_sequences: 16,
        max_speculation_depth: 63,
        max_speculation_top_k: 8,
        max_speculation_nodes: 64,
    }
}
