//! Attaching to a corrupted or foreign arena: an `ArenaLayout` (as an `Attached` message
//! carries it) and the arena file's bytes, then the engine's checks and mapping. A layout and
//! file that disagree must be an error; one that passes must describe pages inside the file.
//! Input: `layout proto \0\0FILE\0\0 file bytes`.
#![no_main]

#[path = "common.rs"]
mod common;

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use prost::Message;

static DIR: OnceLock<std::path::PathBuf> = OnceLock::new();

fuzz_target!(|data: &[u8]| {
    let Some((layout, file)) = common::split_once(data, b"\0\0FILE\0\0") else { return };
    let Ok(mut layout) = proto::cache::v1::ArenaLayout::decode(layout) else { return };
    // The path is the service's to choose; here it is always our scratch file.
    let path = DIR.get_or_init(|| common::scratch_dir("arena")).join("arena");
    std::fs::write(&path, file).unwrap();
    layout.path = path.display().to_string();
    let (page_bytes, page_tokens) = (layout.page_stride.min(1 << 20), layout.page_tokens);
    if let Ok(map) = cache_client::client::open_arena(&layout, page_bytes, page_tokens) {
        let end = layout.pages_offset + layout.page_stride * u64::from(layout.page_count);
        assert!(end <= map.len() as u64 && map.len() as u64 == file.len() as u64);
    }
});
