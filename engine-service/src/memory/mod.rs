//! The engine's view of KV pages. A page holds the K and V of `page_tokens` consecutive
//! positions for every layer and KV head. Pages live in the cache-service's shared arena
//! (or, when running uncached, in a local pool). The step loop names pages by [`PageId`]
//! (space, index): space [`LOCAL_SPACE`] is the local pool, space `g` the arena of cache
//! session generation `g`. The backend is given each space's memory ([`HostPages`]) and maps
//! ids to addresses; nothing on this side of the op seam dereferences a KV page.

pub use engine_ops::kv::{KvDtype, KvLayout, KvPart, PageId};

pub use engine_cpu::pages::{HostPageBuffer, HostPages, LocalPagePool};

/// The page space of the engine's local pool (arena generations start at 1).
pub const LOCAL_SPACE: u32 = 0;

pub mod deadline;
pub mod lease;
pub mod mapped;
pub mod state;
pub mod store;

pub use mapped::MappedPool;
