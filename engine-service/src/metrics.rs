//! Engine metric names (Prometheus via the `metrics` crate) and their descriptions.

use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};

pub const REQUESTS_TOTAL: &str = "edge_engine_requests_total";
pub const PROMPT_TOKENS_TOTAL: &str = "edge_engine_prompt_tokens_total";
pub const CACHED_PROMPT_TOKENS_TOTAL: &str = "edge_engine_cached_prompt_tokens_total";
pub const PREFILL_TOKENS_TOTAL: &str = "edge_engine_prefill_tokens_total";
pub const GENERATED_TOKENS_TOTAL: &str = "edge_engine_generated_tokens_total";
pub const STEP_SECONDS: &str = "edge_engine_step_seconds";
pub const STEP_TOKENS: &str = "edge_engine_step_tokens";
pub const RUNNING_SEQUENCES: &str = "edge_engine_running_sequences";
pub const WAITING_SEQUENCES: &str = "edge_engine_waiting_sequences";
pub const TIME_TO_FIRST_TOKEN_SECONDS: &str = "edge_engine_time_to_first_token_seconds";
pub const GRAMMAR_DRAFT_TOKENS_TOTAL: &str = "edge_engine_grammar_draft_tokens_total";
pub const GRAMMAR_FORBIDDEN_DRAFT_TOKENS_TOTAL: &str = "edge_engine_grammar_forbidden_draft_tokens_total";

pub fn describe() {
    describe_counter!(REQUESTS_TOTAL, "Finished sequences, by finish reason");
    describe_counter!(PROMPT_TOKENS_TOTAL, Unit::Count, "Prompt tokens of finished sequences");
    describe_counter!(CACHED_PROMPT_TOKENS_TOTAL, Unit::Count, "Prompt tokens served from the prefix cache");
    describe_counter!(PREFILL_TOKENS_TOTAL, Unit::Count, "Prompt tokens run through prefill");
    describe_counter!(GENERATED_TOKENS_TOTAL, Unit::Count, "Generated tokens");
    describe_histogram!(STEP_SECONDS, Unit::Seconds, "Wall time of one forward step");
    describe_histogram!(STEP_TOKENS, Unit::Count, "Tokens processed in one forward step");
    describe_gauge!(RUNNING_SEQUENCES, "Sequences in the running batch");
    describe_gauge!(WAITING_SEQUENCES, "Sequences waiting for admission");
    describe_histogram!(TIME_TO_FIRST_TOKEN_SECONDS, Unit::Seconds, "Arrival to first generated token");
    describe_counter!(
        GRAMMAR_DRAFT_TOKENS_TOTAL,
        Unit::Count,
        "Draft tokens verified below a node of a grammar-constrained sequence"
    );
    describe_counter!(
        GRAMMAR_FORBIDDEN_DRAFT_TOKENS_TOTAL,
        Unit::Count,
        "Of those, drafts the grammar forbade (never accepted; the tree could have left them out)"
    );
}
