//! A real step loop on local pages, for the tests and benches that drive whole requests:
//! greedy or seeded requests admitted together, EOS ignored, each run to `tokens` tokens.

use std::sync::mpsc;

use engine_service::backend::Backend;
use engine_service::memory::store::PageStore;
use engine_service::sampling::{Sampler, SamplingParams};
use engine_service::scheduler::{Command, FinishReason, NewSequence, SeqEvent, StopRules};
use engine_service::speculative::SpecConfig;
use engine_service::step::{StepLimits, StepLoop};

/// Runs `prompts` together through a step loop on `b` (speculation per `spec`), sampling with
/// `params` (a seed is offset by the request's index); returns each request's tokens and the
/// number of token events it got (steps that emitted).
pub fn run_requests(
    b: Box<dyn Backend>,
    spec: Option<SpecConfig>,
    prompts: &[Vec<u32>],
    params: SamplingParams,
    tokens: usize,
    page_tokens: usize,
) -> Vec<(Vec<u32>, usize)> {
    let layout = b.kv_layout();
    let limits = StepLimits {
        max_batch_tokens: 512,
        max_running: 16,
        context_length: b.hparams().context_length,
        page_tokens,
        // Never reached: every request ignores EOS.
        eos_token_ids: vec![],
    };
    let (tx, rx) = mpsc::channel();
    let mut lp = StepLoop::new(b, PageStore::local(layout, 1024), limits, rx);
    if let Some(cfg) = spec {
        lp = lp.with_speculation(cfg);
    }
    let thread = std::thread::spawn(move || lp.run());
    let mut streams = Vec::new();
    for (i, prompt) in prompts.iter().enumerate() {
        let (etx, erx) = tokio::sync::mpsc::unbounded_channel();
        let new = NewSequence::new(
            format!("r{i}"),
            prompt.clone(),
            Sampler::new(SamplingParams { seed: params.seed.map(|s| s + i as u64), ..params }),
            StopRules { max_tokens: tokens, stop_token_ids: Vec::new(), ignore_eos: true },
            etx,
        );
        tx.send(Command::Admit(Box::new(new))).unwrap();
        streams.push(erx);
    }
    let out = streams
        .iter_mut()
        .map(|rx| {
            let (mut got, mut events) = (Vec::new(), 0);
            while let Some(ev) = rx.blocking_recv() {
                match ev {
                    SeqEvent::Tokens { ids, .. } => {
                        got.extend(ids);
                        events += 1;
                    }
                    SeqEvent::Finished { reason, .. } => {
                        assert_eq!(reason, FinishReason::Length);
                        break;
                    }
                    SeqEvent::Failed(s) => panic!("sequence failed: {s}"),
                }
            }
            (got, events)
        })
        .collect();
    drop(tx);
    thread.join().unwrap();
    out
}
