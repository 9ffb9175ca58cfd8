//! Converts a tiktoken rank file to a `tokenizer.json` for the `tokenizers` crate.
//!
//! Usage: `cargo run --release -p engine-models --example tiktoken_to_json -- RANKS OUT
//! [--qwen3.5 | --pattern REGEX --specials FILE --nfc]`. `--qwen3.5` (the default) uses the
//! Qwen3.5/3.6 specials and split pattern; `--specials FILE` takes `id text` lines.

use std::path::PathBuf;

use anyhow::{Context, bail};
use engine_models::format::tiktoken::{QWEN3_5_PATTERN, TiktokenVocab, qwen3_5_special_tokens};

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let mut positional = Vec::new();
    let mut pattern = None;
    let mut specials_file = None;
    let mut nfc = false;
    let mut qwen = false;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--qwen3.5" => qwen = true,
            "--pattern" => pattern = Some(args.next().context("--pattern needs a value")?),
            "--specials" => specials_file = Some(args.next().context("--specials needs a file")?),
            "--nfc" => nfc = true,
            flag if flag.starts_with("--") => bail!("unknown flag {flag}"),
            _ => positional.push(PathBuf::from(arg)),
        }
    }
    let [ranks, out] = positional.as_slice() else {
        bail!("usage: tiktoken_to_json RANKS OUT [--qwen3.5 | --pattern REGEX --specials FILE --nfc]");
    };
    let custom = pattern.is_some() || specials_file.is_some();
    if qwen && custom {
        bail!("--qwen3.5 excludes --pattern/--specials");
    }
    let (specials, pattern, nfc) = if custom {
        let mut specials = Vec::new();
        if let Some(file) = specials_file {
            let text = std::fs::read_to_string(&file).with_context(|| format!("reading {file}"))?;
            for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
                let (id, token) =
                    line.trim().split_once(' ').with_context(|| format!("{file}:{}: expected `id text`", i + 1))?;
                specials.push((token.to_owned(), id.parse().with_context(|| format!("{file}:{}", i + 1))?));
            }
        }
        let pattern = pattern.context("--specials needs --pattern")?;
        (specials, pattern, nfc)
    } else {
        (qwen3_5_special_tokens(), QWEN3_5_PATTERN.to_owned(), true)
    };
    let vocab = TiktokenVocab::read(ranks)?;
    let tokenizer = vocab.tokenizer(&specials, &pattern, nfc)?;
    tokenizer.save(out, false).map_err(|e| anyhow::anyhow!("writing {}: {e}", out.display()))?;
    println!("{}: {} ranks + {} specials -> {}", ranks.display(), vocab.len(), specials.len(), out.display());
    Ok(())
}
