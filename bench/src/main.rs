//! `edge-bench`: run the MLPerf Edge Agentic replay (`replay`) or the BFCL accuracy phase
//! (`bfcl`) against one OpenAI-compatible endpoint, or two in turn (side by side, with ratios).
//!
//! Writes `<out>/<phase>-A.json` (and `-B.json`) with every per-turn record, plus
//! `<out>/<phase>-summary.md`, and prints the summary table.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand};

use bench::client::ChatClient;
use bench::dataset::Dataset;
use bench::report::{self, Row};
use bench::tokens::TokenCounter;
use bench::{bfcl, replay};

#[derive(Parser)]
#[command(name = "edge-bench", about = "MLPerf Edge Agentic replay + BFCL accuracy against OpenAI endpoints")]
struct Cli {
    #[command(subcommand)]
    phase: Phase,
}

#[derive(Subcommand)]
enum Phase {
    /// Performance phase: serial teacher-forced replay (spec 4).
    Replay(ReplayArgs),
    /// Accuracy phase: BFCL v4 single-turn, the 995 gated samples (spec 5).
    Bfcl(BfclArgs),
}

#[derive(Args, Clone)]
struct Common {
    /// API root, e.g. http://127.0.0.1:8090/v1. Give twice for a side-by-side run (A then B).
    #[arg(long, required = true, num_args = 1)]
    endpoint: Vec<String>,
    /// Model name per endpoint (default: the first id from GET /models).
    #[arg(long)]
    model: Vec<String>,
    #[arg(long, env = "OPENAI_API_KEY")]
    api_key: Option<String>,
    /// Output cap sent as max_completion_tokens (reference: 1024).
    #[arg(long, default_value_t = 1024)]
    max_completion_tokens: u32,
    /// Also send max_tokens with the same value (deviation from the reference body).
    #[arg(long)]
    send_max_tokens: bool,
    #[arg(long, default_value_t = 0.0)]
    temperature: f64,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Per-request timeout in seconds (reference: 600).
    #[arg(long, default_value_t = 600)]
    turn_timeout_s: u64,
    /// Directory for the JSON reports and the Markdown summary.
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
    /// No progress output (the bar is also off when stderr is not a terminal; then one plain
    /// line per request is printed instead).
    #[arg(long)]
    quiet: bool,
}

#[derive(Args)]
struct ReplayArgs {
    #[command(flatten)]
    common: Common,
    #[arg(long, default_value = bench::DEFAULT_DATASET)]
    dataset: PathBuf,
    /// Accept a dataset whose SHA-256 differs from the pinned one.
    #[arg(long)]
    no_sha_check: bool,
    /// Run only the first N conversations.
    #[arg(long)]
    conversations: Option<usize>,
    /// Run only the first M requests of each conversation.
    #[arg(long)]
    turns: Option<usize>,
    /// Skip requests whose estimated prompt exceeds this many tokens.
    #[arg(long)]
    max_prompt_tokens: Option<usize>,
    /// HF tokenizer.json for client-side OSL counting (else the server's usage is used).
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Do not ask for stream usage (stream_options.include_usage).
    #[arg(long)]
    no_usage: bool,
    /// Send "content": "" on recorded assistant tool-call rows (for llama-cpp-python's server,
    /// whose Jinja template needs it); the reference body omits the key.
    #[arg(long)]
    empty_content_on_tool_calls: bool,
    /// Replay this many conversations at once (each one turn at a time): a load test, not
    /// the reference run, which is serial.
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    /// Do not send the conversation's id as X-Session-ID (routing then sees only the prompt).
    #[arg(long)]
    no_session_id: bool,
}

#[derive(Args)]
struct BfclArgs {
    #[command(flatten)]
    common: Common,
    #[arg(long, default_value = bench::DEFAULT_BFCL_DIR)]
    data_dir: PathBuf,
    /// Comma-separated subsets (default: all 12 gated subsets).
    #[arg(long, value_delimiter = ',')]
    subsets: Vec<String>,
    /// Only the first N gated samples of each subset (a smoke run; not comparable to the gate).
    #[arg(long)]
    limit_per_subset: Option<usize>,
}

struct Target {
    label: &'static str,
    endpoint: String,
    model: String,
    client: ChatClient,
}

async fn targets(c: &Common) -> anyhow::Result<Vec<Target>> {
    if c.endpoint.len() > 2 {
        bail!("at most two endpoints (A and B)");
    }
    let mut out = Vec::new();
    for (i, ep) in c.endpoint.iter().enumerate() {
        let client = ChatClient::new(ep, c.api_key.clone(), Duration::from_secs(c.turn_timeout_s))?;
        let model = match c.model.get(i).or(c.model.first()) {
            Some(m) => m.clone(),
            None => client
                .first_model()
                .await
                .with_context(|| format!("GET {ep}/models"))?
                .unwrap_or_else(|| "default".into()),
        };
        out.push(Target { label: ["A", "B"][i], endpoint: ep.clone(), model, client });
    }
    Ok(out)
}

/// How replay progress is shown on stderr.
enum Progress {
    Bar(indicatif::ProgressBar),
    Lines,
    Off,
}

fn progress_bar(quiet: bool, label: &str) -> Progress {
    use std::io::IsTerminal;
    if quiet {
        return Progress::Off;
    }
    if !std::io::stderr().is_terminal() {
        return Progress::Lines;
    }
    let bar = indicatif::ProgressBar::new(0);
    let style = indicatif::ProgressStyle::with_template(&format!(
        "{label} [{{elapsed_precise}}] {{bar:30.cyan/blue}} {{pos}}/{{len}} {{msg}}"
    ))
    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
    bar.set_style(style);
    Progress::Bar(bar)
}

fn write_json<T: serde::Serialize>(path: &std::path::Path, v: &T) -> anyhow::Result<()> {
    std::fs::write(path, serde_json::to_vec_pretty(v)?).with_context(|| format!("writing {}", path.display()))
}

fn summarize(out: &std::path::Path, phase: &str, header: &str, runs: &[(String, Vec<Row>)]) -> anyhow::Result<()> {
    let table = match runs {
        [(a, ra), (b, rb)] => report::side_by_side(phase, a, ra, b, rb),
        [(_, r)] => report::table(phase, r),
        _ => String::new(),
    };
    let md = format!("{header}\n{table}");
    std::fs::write(out.join(format!("{phase}-summary.md")), &md)?;
    println!("{md}");
    Ok(())
}

async fn run_replay(a: ReplayArgs) -> anyhow::Result<()> {
    let dataset = Dataset::load(&a.dataset, !a.no_sha_check)?;
    let counter = match &a.tokenizer {
        Some(p) => TokenCounter::from_file(p)?,
        None => TokenCounter::none(),
    };
    std::fs::create_dir_all(&a.common.out)?;
    let mut runs = Vec::new();
    let mut header = String::new();
    for t in targets(&a.common).await? {
        let opts = replay::ReplayOptions {
            model: t.model.clone(),
            max_completion_tokens: a.common.max_completion_tokens,
            send_max_tokens: a.common.send_max_tokens,
            temperature: a.common.temperature,
            seed: a.common.seed,
            include_usage: !a.no_usage,
            conversations: a.conversations,
            turns_per_conversation: a.turns,
            max_prompt_tokens: a.max_prompt_tokens,
            empty_content_on_tool_calls: a.empty_content_on_tool_calls,
            concurrency: a.concurrency,
            no_session_id: a.no_session_id,
        };
        if !a.common.quiet {
            eprintln!("replay {} on {} (model {})", t.label, t.endpoint, t.model);
        }
        let bar = progress_bar(a.common.quiet, t.label);
        let hook = |p: &replay::Progress| match &bar {
            Progress::Bar(b) => {
                b.set_length(p.selected as u64);
                b.set_position(p.done as u64);
                b.set_message(format!(
                    "conv {}/{} req {}/{} ctx {}{} TPS {:.1}",
                    p.conversation,
                    p.conversations,
                    p.request,
                    p.requests,
                    if p.context_is_estimate { "~" } else { "" },
                    p.context_tokens,
                    p.running_tps
                ));
            }
            Progress::Lines => eprintln!("{}", p.line()),
            Progress::Off => {}
        };
        let rep = replay::run_with_progress(&dataset, &t.client, &t.endpoint, &counter, &opts, &hook).await;
        if let Progress::Bar(b) = &bar {
            b.finish();
        }
        write_json(&a.common.out.join(format!("replay-{}.json", t.label)), &rep)?;
        for (name, svg) in bench::plot::replay_plots(&rep) {
            std::fs::write(a.common.out.join(format!("replay-{}-{name}", t.label)), svg)?;
        }
        for s in bench::plot::replay_series(&rep) {
            let path = a.common.out.join(format!("replay-{}-{}.png", t.label, s.name));
            // A chart that cannot be drawn must not lose the measured run.
            if let Err(e) = bench::png::write_png(&path, &s) {
                tracing::warn!(error = %e, "PNG chart not written");
            }
        }
        header.push_str(&format!(
            "- {}: {} model `{}`; {}; valid: {}\n",
            t.label, t.endpoint, t.model, rep.subset, rep.figures.valid
        ));
        runs.push((t.label.to_string(), report::replay_rows(&rep)));
        if t.label == "A" {
            header.push_str(&format!(
                "- dataset sha256 {}; OSL: {}; tokenizer: {}\n",
                rep.dataset_sha256, rep.osl_method, rep.tokenizer
            ));
        }
    }
    summarize(&a.common.out, "replay", &header, &runs)
}

async fn run_bfcl(a: BfclArgs) -> anyhow::Result<()> {
    let mut samples = bfcl::load(&a.data_dir, &a.subsets)?;
    if let Some(n) = a.limit_per_subset {
        let mut seen: std::collections::HashMap<String, usize> = Default::default();
        samples.retain(|s| {
            let c = seen.entry(s.subset.clone()).or_default();
            *c += 1;
            *c <= n
        });
    }
    std::fs::create_dir_all(&a.common.out)?;
    let mut runs = Vec::new();
    let mut header = format!("- {} samples from {}\n", samples.len(), a.data_dir.display());
    for t in targets(&a.common).await? {
        let opts = bfcl::BfclOptions {
            model: t.model.clone(),
            max_completion_tokens: a.common.max_completion_tokens,
            send_max_tokens: a.common.send_max_tokens,
            temperature: a.common.temperature,
            seed: a.common.seed,
        };
        eprintln!("bfcl {} on {} (model {})", t.label, t.endpoint, t.model);
        let rep = bfcl::run::run(&samples, &t.client, &t.endpoint, &opts).await;
        write_json(&a.common.out.join(format!("bfcl-{}.json", t.label)), &rep)?;
        header.push_str(&format!(
            "- {}: {} model `{}`; gate (overall >= {:.4}, normalized >= {:.4}, >= 995 samples): {}\n",
            t.label,
            t.endpoint,
            t.model,
            rep.aggregate.gate_overall,
            rep.aggregate.gate_normalized,
            if rep.aggregate.gate_passed { "PASS" } else { "FAIL" }
        ));
        runs.push((t.label.to_string(), bfcl::run::rows(&rep)));
    }
    summarize(&a.common.out, "bfcl", &header, &runs)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().phase {
        Phase::Replay(a) => run_replay(a).await,
        Phase::Bfcl(a) => run_bfcl(a).await,
    }
}
