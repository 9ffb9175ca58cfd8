//! The accuracy phase: BFCL v4 single-turn (spec 5.2-5.6).
//!
//! Contract: `load(dir, subsets)` reads the gated samples listed in `selected_995_ids.tsv`
//! (optionally only some subsets) with their answers; `request_body` builds the request the
//! official harness sends (mlcommons/endpoints `BFCLv4`: messages as `{role, content}` with null
//! content as `""`, tools from bfcl-eval's `convert_to_tool` with `GORILLA_TO_OPENAPI`,
//! `tool_choice: auto`); `score_sample` scores a reply as the official scorer does (`extract`
//! for the reply, `checker` for bfcl-eval's AST check); `aggregate` gives the 5.6 figures and
//! the 0.97x gate. Missing replies count 0. `scripts/bench/bfcl_agreement.py` checks the
//! verdicts against bfcl-eval itself on all 995 samples (docs/bench.md).

pub mod checker;
pub mod convert;
pub mod extract;
pub mod pyexpr;
pub mod run;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use checker::Language;

/// Reference scores (Thor, llama.cpp Q4_K_M) and the gate factor (spec 5.6).
pub const REF_OVERALL: f64 = 86.23;
pub const REF_NORMALIZED: f64 = 87.96;
pub const GATE: f64 = 0.97;

pub const NON_LIVE: &[&str] =
    &["simple_python", "simple_java", "simple_javascript", "multiple", "parallel", "parallel_multiple"];
pub const LIVE: &[&str] = &["live_simple", "live_multiple", "live_parallel", "live_parallel_multiple"];
pub const HALLUCINATION: &[&str] = &["irrelevance", "live_irrelevance"];

#[derive(Debug, thiserror::Error)]
pub enum BfclError {
    #[error("reading {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{file} line {line}: {msg}")]
    Parse { file: String, line: usize, msg: String },
    #[error("unknown subset {0}")]
    Subset(String),
}

#[derive(Debug, Clone)]
pub struct Sample {
    pub id: String,
    pub subset: String,
    pub question: Vec<Value>,
    pub functions: Vec<Value>,
    /// `ground_truth`, empty for hallucination subsets.
    pub answer: Vec<Value>,
}

impl Sample {
    pub fn language(&self) -> Language {
        match self.subset.as_str() {
            "simple_java" => Language::Java,
            "simple_javascript" => Language::JavaScript,
            _ => Language::Python,
        }
    }

    pub fn is_hallucination(&self) -> bool {
        HALLUCINATION.contains(&self.subset.as_str())
    }
}

fn read(path: &Path) -> Result<String, BfclError> {
    std::fs::read_to_string(path).map_err(|source| BfclError::Io { path: path.display().to_string(), source })
}

fn jsonl(path: &Path) -> Result<Vec<Value>, BfclError> {
    read(path)?
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| BfclError::Parse {
                file: path.display().to_string(),
                line: i + 1,
                msg: e.to_string(),
            })
        })
        .collect()
}

/// The gated samples of `subsets` (all 12 when empty), in file order per subset.
pub fn load(dir: &Path, subsets: &[String]) -> Result<Vec<Sample>, BfclError> {
    let all: Vec<&str> = NON_LIVE.iter().chain(LIVE).chain(HALLUCINATION).copied().collect();
    for s in subsets {
        if !all.contains(&s.as_str()) {
            return Err(BfclError::Subset(s.clone()));
        }
    }
    let tsv = read(&dir.join("selected_995_ids.tsv"))?;
    let mut wanted: HashMap<String, Vec<String>> = HashMap::new();
    for line in tsv.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let mut cols = line.split('\t');
        if let (Some(id), Some(subset)) = (cols.next(), cols.next()) {
            wanted.entry(subset.to_string()).or_default().push(id.to_string());
        }
    }
    let mut out = Vec::new();
    for subset in all.iter().filter(|s| subsets.is_empty() || subsets.iter().any(|x| x == *s)) {
        let ids = wanted.get(*subset).cloned().unwrap_or_default();
        let questions = jsonl(&dir.join(format!("BFCL_v4_{subset}.json")))?;
        let answers: HashMap<String, Value> = if HALLUCINATION.contains(subset) {
            HashMap::new()
        } else {
            jsonl(&dir.join(format!("possible_answer/BFCL_v4_{subset}.json")))?
                .into_iter()
                .filter_map(|a| Some((a.get("id")?.as_str()?.to_string(), a.get("ground_truth")?.clone())))
                .collect()
        };
        let by_id: HashMap<&str, &Value> = questions.iter().filter_map(|q| Some((q.get("id")?.as_str()?, q))).collect();
        for id in ids {
            let q = by_id.get(id.as_str()).ok_or_else(|| BfclError::Parse {
                file: format!("BFCL_v4_{subset}.json"),
                line: 0,
                msg: format!("gated id {id} not found"),
            })?;
            // The harness flattens the turns (single-turn files hold one).
            let question: Vec<Value> = q
                .get("question")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_array)
                .flatten()
                .cloned()
                .collect();
            out.push(Sample {
                id: id.clone(),
                subset: subset.to_string(),
                question,
                functions: q.get("function").and_then(Value::as_array).cloned().unwrap_or_default(),
                answer: answers.get(&id).and_then(Value::as_array).cloned().unwrap_or_default(),
            });
        }
    }
    Ok(out)
}

/// bfcl-eval's `GORILLA_TO_OPENAPI`. Names it lacks (JavaScript `Boolean`, Java `Set`) become
/// "string" at the top level, as `_cast_to_openai_type` does.
fn openapi_type(t: &str) -> Option<&'static str> {
    Some(match t {
        "integer" | "byte" | "short" | "long" | "Bigint" => "integer",
        "number" | "float" | "double" => "number",
        "string" | "any" | "char" | "Any" | "String" => "string",
        "boolean" | "bool" => "boolean",
        "array" | "list" | "tuple" | "ArrayList" | "Array" | "Queue" | "Stack" => "array",
        "dict" | "object" | "HashMap" | "Hashtable" => "object",
        _ => return None,
    })
}

/// An `items` type: bfcl-eval indexes the mapping (a KeyError for unknown names); we keep the
/// name unchanged there, which no gated sample reaches.
fn set_item_type(obj: &mut serde_json::Map<String, Value>) {
    if let Some(Value::String(t)) = obj.get("type")
        && let Some(mapped) = openapi_type(t)
    {
        obj.insert("type".into(), json!(mapped));
    }
}

/// bfcl-eval `_cast_to_openai_type` over a `properties` object, recursively.
fn cast_properties(props: &mut serde_json::Map<String, Value>) {
    for (_, p) in props.iter_mut() {
        let Some(obj) = p.as_object_mut() else { continue };
        let mapped = match obj.get("type").and_then(Value::as_str).map(str::to_string).as_deref() {
            None => "string",
            Some(ty) => {
                if ty == "float" {
                    obj.insert("format".into(), json!("float"));
                    let d = obj.get("description").and_then(Value::as_str).unwrap_or("").to_string();
                    obj.insert("description".into(), json!(format!("{d} This is a float type value.")));
                }
                openapi_type(ty).unwrap_or("string")
            }
        };
        obj.insert("type".into(), json!(mapped));
        if mapped == "array" || mapped == "object" {
            if let Some(Value::Object(inner)) = obj.get_mut("properties") {
                cast_properties(inner);
            } else if let Some(Value::Object(items)) = obj.get_mut("items") {
                set_item_type(items);
                match items.get("type").and_then(Value::as_str) {
                    Some("array") => {
                        if let Some(Value::Object(ii)) = items.get_mut("items") {
                            set_item_type(ii);
                        }
                    }
                    Some("object") => {
                        if let Some(Value::Object(ip)) = items.get_mut("properties") {
                            cast_properties(ip);
                        }
                    }
                    _ => {}
                }
            }
        }
    }
}

/// bfcl-eval `convert_to_tool(functions, GORILLA_TO_OPENAPI, OPENAI_COMPLETIONS)`.
pub fn to_tools(functions: &[Value]) -> Vec<Value> {
    functions
        .iter()
        .map(|f| {
            let mut f = f.clone();
            if let Some(obj) = f.as_object_mut() {
                if let Some(Value::String(n)) = obj.get("name") {
                    let n = n.replace('.', "_");
                    obj.insert("name".into(), json!(n));
                }
                if let Some(Value::Object(params)) = obj.get_mut("parameters") {
                    params.insert("type".into(), json!("object"));
                    if let Some(Value::Object(props)) = params.get_mut("properties") {
                        cast_properties(props);
                    }
                }
            }
            json!({"type": "function", "function": f})
        })
        .collect()
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BfclOptions {
    pub model: String,
    pub max_completion_tokens: u32,
    pub send_max_tokens: bool,
    pub temperature: f64,
    pub seed: u64,
}

/// The request body of spec 5.3.
pub fn request_body(s: &Sample, o: &BfclOptions) -> Value {
    let messages: Vec<Value> = s
        .question
        .iter()
        .map(|m| {
            // `{"role": m["role"], "content": m.get("content") or ""}`: falsy content is "".
            let content = match m.get("content") {
                None | Some(Value::Null) | Some(Value::Bool(false)) => json!(""),
                Some(Value::Number(n)) if n.as_f64() == Some(0.0) => json!(""),
                Some(Value::Array(a)) if a.is_empty() => json!(""),
                Some(Value::Object(o)) if o.is_empty() => json!(""),
                Some(c) => c.clone(),
            };
            json!({"role": m.get("role").cloned().unwrap_or(Value::Null), "content": content})
        })
        .collect();
    let mut b = json!({
        "model": o.model, "messages": messages, "tools": to_tools(&s.functions), "tool_choice": "auto",
        "stream": true, "max_completion_tokens": o.max_completion_tokens,
        "temperature": o.temperature, "seed": o.seed,
    });
    if o.send_max_tokens {
        b["max_tokens"] = json!(o.max_completion_tokens);
    }
    b
}

/// 0/1 score of one reply as the official scorer gives it, with the reason when it fails.
/// Hallucination subsets: 1 unless the scored text is a serialised `tool_calls` list (a
/// structured call, or text that looks like one). Other subsets: bfcl-eval's AST check of the
/// extracted calls.
pub fn score_sample(s: &Sample, reply: &crate::client::Reply) -> (f64, Option<String>) {
    let text = extract::scoring_output(reply);
    if s.is_hallucination() {
        return if extract::makes_tool_call(&text) {
            (0.0, Some("hallucination:tool_call".into()))
        } else {
            (1.0, None)
        };
    }
    let calls = match extract::calls(&text) {
        Ok(c) => c,
        Err(e) => return (0.0, Some(format!("harness_raises:{}", e.0))),
    };
    match checker::ast_check(&s.functions, &calls, &s.answer, s.language(), &s.subset) {
        Ok(()) => (1.0, None),
        Err(e) => (0.0, Some(e.to_string())),
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Aggregate {
    pub overall_accuracy: f64,
    pub normalized_single_turn_score: f64,
    pub category_scores: BTreeMap<String, f64>,
    pub subset_scores: BTreeMap<String, f64>,
    pub total_samples: usize,
    pub issued_samples: usize,
    pub gate_overall: f64,
    pub gate_normalized: f64,
    pub gate_passed: bool,
    /// Categories with no sample in this run (their score is not computed).
    pub missing_categories: Vec<String>,
}

fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// Spec 5.6 over `(subset, score)` pairs; `None` scores are missing replies (count 0).
pub fn aggregate(results: &[(String, Option<f64>)]) -> Aggregate {
    let mut per: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for (s, v) in results {
        per.entry(s.clone()).or_default().push(v.unwrap_or(0.0));
    }
    let subset = |name: &str| per.get(name).and_then(|v| mean(v));
    let mut cats: BTreeMap<String, f64> = BTreeMap::new();
    let mut missing = Vec::new();
    let simple: Vec<f64> =
        ["simple_python", "simple_java", "simple_javascript"].iter().filter_map(|s| subset(s)).collect();
    let mut nl: Vec<f64> = mean(&simple).into_iter().collect();
    nl.extend(["multiple", "parallel", "parallel_multiple"].iter().filter_map(|s| subset(s)));
    match mean(&nl) {
        Some(x) => {
            cats.insert("non_live".into(), x * 100.0);
        }
        None => missing.push("non_live".to_string()),
    }
    let live: Vec<f64> = LIVE.iter().filter_map(|s| per.get(*s)).flatten().copied().collect();
    match mean(&live) {
        Some(x) => {
            cats.insert("live".into(), x * 100.0);
        }
        None => missing.push("live".to_string()),
    }
    let hal: Vec<f64> = HALLUCINATION.iter().filter_map(|s| subset(s)).collect();
    match mean(&hal) {
        Some(x) => {
            cats.insert("hallucination".into(), x * 100.0);
        }
        None => missing.push("hallucination".to_string()),
    }
    let all: Vec<f64> = results.iter().map(|(_, v)| v.unwrap_or(0.0)).collect();
    let overall = round2(mean(&all).unwrap_or(0.0) * 100.0);
    let cat_vals: Vec<f64> = cats.values().copied().collect();
    let normalized = round2(mean(&cat_vals).unwrap_or(0.0));
    let gate_overall = REF_OVERALL * GATE;
    let gate_normalized = REF_NORMALIZED * GATE;
    Aggregate {
        overall_accuracy: overall,
        normalized_single_turn_score: normalized,
        category_scores: cats.into_iter().map(|(k, v)| (k, round2(v))).collect(),
        subset_scores: per.iter().map(|(k, v)| (k.clone(), round2(mean(v).unwrap_or(0.0) * 100.0))).collect(),
        total_samples: results.len(),
        issued_samples: results.iter().filter(|(_, v)| v.is_some()).count(),
        gate_overall,
        gate_normalized,
        gate_passed: overall >= gate_overall && normalized >= gate_normalized && results.len() >= 995,
        missing_categories: missing,
    }
}

#[cfg(test)]
mod tests;
