//! gRPC surface: decode the request, run one [`Cache`] operation, encode the answer.

use std::sync::Arc;

use proto::cache::v1::cache_server::Cache as CacheRpc;
use proto::cache::v1::{
    AllocateRequest, AllocateResponse, AllocateStateRequest, AllocateStateResponse, AttachRequest, Attached,
    CommitRequest, CommitResponse, CommitStateRequest, CommitStateResponse, LookupRequest, LookupResponse,
    ReleaseRequest, ReleaseResponse, SessionEvent, StatsRequest, StatsResponse, session_event,
};
use tonic::{Request, Response, Status};

use crate::cache::{AttachParams, Cache};
use crate::lease::SessionStream;
use crate::table::MissReason;
use proto::cache::v1::MissReason as PbMissReason;

#[derive(Clone, Debug)]
pub struct CacheService {
    cache: Arc<Cache>,
}

impl CacheService {
    pub fn new(cache: Arc<Cache>) -> CacheService {
        CacheService { cache }
    }
}

#[tonic::async_trait]
impl CacheRpc for CacheService {
    type AttachStream = SessionStream;

    async fn attach(&self, request: Request<AttachRequest>) -> Result<Response<SessionStream>, Status> {
        let r = request.into_inner();
        let params = AttachParams {
            model_fingerprint: r.model_fingerprint,
            page_bytes: r.page_bytes,
            page_tokens: r.page_tokens,
            engine_name: r.engine_name,
        };
        let (lease, layout) = self.cache.attach(&params)?;
        let event = SessionEvent {
            kind: Some(session_event::Kind::Attached(Attached {
                session_id: lease.session_id(),
                layout: Some(layout),
            })),
        };
        Ok(Response::new(SessionStream::new(event, lease, self.cache.shutdown_signal())))
    }

    async fn lookup(&self, request: Request<LookupRequest>) -> Result<Response<LookupResponse>, Status> {
        let r = request.into_inner();
        if r.want_state && r.state_bytes == 0 {
            return Err(Status::invalid_argument("want_state needs state_bytes > 0"));
        }
        let want_state = r.want_state.then_some(r.state_bytes);
        let hit = self.cache.lookup_with_state(r.session_id, &r.cache_salt, &r.token_ids, want_state)?;
        let miss_reason = match hit.miss_reason {
            MissReason::None => PbMissReason::None,
            MissReason::NoMatch => PbMissReason::NoMatch,
            MissReason::Evicted => PbMissReason::Evicted,
            MissReason::SaltMismatch => PbMissReason::SaltMismatch,
            MissReason::NoStateSnapshot => PbMissReason::NoStateSnapshot,
        };
        let state = hit.state.unwrap_or_default();
        Ok(Response::new(LookupResponse {
            page_ids: hit.page_ids,
            cached_tokens: hit.cached_tokens as u32,
            full_page_tokens: hit.full_page_tokens as u32,
            partial_page_tokens: hit.partial_page_tokens as u32,
            miss_reason: miss_reason as i32,
            has_state: !state.page_ids.is_empty(),
            state_slot: state.slot,
            state_position: state.position as u32,
            state_page_ids: state.page_ids,
            state_bytes: state.state_bytes,
            kv_cached_tokens: hit.kv_cached_tokens as u32,
        }))
    }

    async fn allocate(&self, request: Request<AllocateRequest>) -> Result<Response<AllocateResponse>, Status> {
        let r = request.into_inner();
        let page_ids = self.cache.allocate(r.session_id, r.count)?;
        Ok(Response::new(AllocateResponse { page_ids }))
    }

    async fn commit(&self, request: Request<CommitRequest>) -> Result<Response<CommitResponse>, Status> {
        let r = request.into_inner();
        let committed_pages =
            self.cache.commit(r.session_id, &r.cache_salt, &r.token_ids, &r.page_ids, r.include_partial_tail)?;
        Ok(Response::new(CommitResponse { committed_pages }))
    }

    async fn release(&self, request: Request<ReleaseRequest>) -> Result<Response<ReleaseResponse>, Status> {
        let r = request.into_inner();
        self.cache.release_all(r.session_id, &r.page_ids, &r.state_slots)?;
        Ok(Response::new(ReleaseResponse {}))
    }

    async fn allocate_state(
        &self,
        request: Request<AllocateStateRequest>,
    ) -> Result<Response<AllocateStateResponse>, Status> {
        let r = request.into_inner();
        let a = self.cache.allocate_state(r.session_id, &r.cache_salt, &r.token_ids, r.state_bytes)?;
        Ok(Response::new(AllocateStateResponse {
            already_cached: a.already_cached,
            slot: a.slot,
            page_ids: a.page_ids,
        }))
    }

    async fn commit_state(
        &self,
        request: Request<CommitStateRequest>,
    ) -> Result<Response<CommitStateResponse>, Status> {
        let r = request.into_inner();
        let committed = self.cache.commit_state(r.session_id, r.slot)?;
        Ok(Response::new(CommitStateResponse { committed }))
    }

    async fn stats(&self, request: Request<StatsRequest>) -> Result<Response<StatsResponse>, Status> {
        let s = self.cache.stats();
        Ok(Response::new(StatsResponse {
            prompt_tokens_queried: s.counters.prompt_tokens_queried,
            tokens_hit_full_pages: s.counters.tokens_hit_full_pages,
            pages_total: s.pages_total,
            pages_free: s.pages_free,
            pages_cached: s.pages_cached,
            pages_pinned: s.pages_pinned,
            evictions: s.counters.evictions,
            sessions: s.sessions,
            lookups: s.counters.lookups,
            commits: s.counters.commits,
            tokens_hit_partial_pages: s.counters.tokens_hit_partial_pages,
            tokens_missed_no_match: s.counters.tokens_missed_no_match,
            tokens_missed_evicted: s.counters.tokens_missed_evicted,
            tokens_missed_salt_mismatch: s.counters.tokens_missed_salt_mismatch,
            tokens_missed_last_token: s.counters.tokens_missed_last_token,
            pages_used: s.pages_total - s.pages_free,
            pages_partial: s.pages_partial,
            partial_pages_committed: s.counters.partial_pages_committed,
            lookup_ns_total: s.counters.lookup_ns,
            commit_ns_total: s.counters.commit_ns,
            tokens_missed_no_state_snapshot: s.counters.tokens_missed_no_state,
            state_snapshots_stored: s.counters.states_committed,
            state_restores: s.counters.state_restores,
            state_evictions: s.counters.state_evictions,
            states_cached: s.states_cached,
            states_pinned: s.states_pinned,
            state_pages: s.state_pages,
            state_bytes_in_use: s.state_bytes,
            state_lookups: s.counters.state_lookups,
            prometheus_text: if request.get_ref().prometheus_text { crate::metrics::render() } else { String::new() },
        }))
    }
}
