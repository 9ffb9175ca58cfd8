//! The engine's view of KV pages. A page holds the K and V of `page_tokens` consecutive
//! positions for every layer and KV head. Pages live in the cache-service's shared arena
//! (or, when running uncached, in a local pool); the engine only ever sees raw page
//! pointers that stay valid while the page is leased to it.

pub use engine_ops::kv::{KvDtype, KvLayout, KvPart, PagePtr};

pub use engine_cpu::pages::{LocalPagePool, PageTable, move_kv_position};

pub mod state;
pub mod store;
