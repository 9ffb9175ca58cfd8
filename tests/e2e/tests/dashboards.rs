//! The monitoring files in deploy/ query what the services export.
//!
//! Every metric a query of the Grafana dashboard (deploy/grafana/edge-dashboard.json) names
//! is one the real stack renders after some traffic (histograms with `_bucket` series, as
//! `histogram_quantile` needs), every label a query groups by is on that metric, and
//! `promtool` (Debian's `prometheus` package) accepts the queries and the scrape config
//! (deploy/prometheus/prometheus.yml). Without promtool the test fails unless
//! EDGE_ALLOW_SKIP=1, which skips only the promtool part and says so by name.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use e2e::{Stack, chat, explain_request, http_get};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// Every `expr` in the dashboard, with the title of its panel.
fn dashboard_queries() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo().join("deploy/grafana/edge-dashboard.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("dashboard JSON");
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        let title = panel["title"].as_str().unwrap_or_default().to_string();
        for target in panel["targets"].as_array().expect("targets") {
            out.push((title.clone(), target["expr"].as_str().expect("expr").to_string()));
        }
    }
    assert!(out.len() >= 12, "the dashboard has its queries");
    out
}

/// The metric names a PromQL expression reads (our names all start with `edge_`).
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("edge_") {
        let name: String =
            rest[at..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':').collect();
        rest = &rest[at + name.len()..];
        names.push(name);
    }
    names
}

/// `(label, metric)` for each `by (label) (rate(metric` in the expression.
fn grouped_labels(expr: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find(" by (") {
        rest = &rest[at + 5..];
        let label: String = rest.chars().take_while(|c| *c != ')').collect();
        let metric = metric_names(rest).into_iter().next().expect("a metric after by (..)");
        out.push((label, metric));
    }
    out
}

/// Sample name -> the label names seen on it, over the Prometheus pages given.
fn rendered_series(pages: &[String]) -> BTreeMap<String, BTreeSet<String>> {
    let mut series: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in pages.iter().flat_map(|p| p.lines()).filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let labels = series.entry(line[..name_end].to_string()).or_default();
        if let Some(inner) = line[name_end..].strip_prefix('{').and_then(|l| l.split_once('}')).map(|(l, _)| l) {
            labels.extend(inner.split(',').filter_map(|kv| kv.split_once('=')).map(|(k, _)| k.trim().to_string()));
        }
    }
    series
}

#[tokio::test(flavor = "multi_thread")]
async fn the_dashboard_queries_only_metrics_the_services_export() {
    let queries = dashboard_queries();
    let stack = Stack::start();
    // Traffic that moves every panel's series: a repeated prefix (cache hits, full and
    // partial pages), speculation (on by default), and a request the gateway refuses.
    for i in 0..3 {
        let (status, body) = chat(&stack, &explain_request(if i == 2 { "metrics" } else { "caches" }, 24)).await;
        assert_eq!(status, 200, "{body}");
    }
    let (status, _) = chat(&stack, &serde_json::json!({"messages": []})).await;
    assert_eq!(status, 400);
    let pages: Vec<String> =
        [format!("{}/metrics", stack.base_url), stack.engine_metrics_url.clone(), stack.cache_metrics_url.clone()]
            .iter()
            .map(|url| http_get(url).unwrap_or_else(|e| panic!("{url}: {e}")))
            .collect();
    let series = rendered_series(&pages);

    let mut missing = Vec::new();
    for (title, expr) in &queries {
        for name in metric_names(expr) {
            if !series.contains_key(&name) {
                missing.push(format!("{title}: {name}"));
            }
        }
        for (label, metric) in grouped_labels(expr) {
            let labels = series.get(&metric).cloned().unwrap_or_default();
            if !labels.contains(&label) {
                missing.push(format!("{title}: label {label} on {metric} (has {labels:?})"));
            }
        }
    }
    // The status page reads the same pages; every series it names must be there too.
    let page = std::fs::read_to_string(repo().join("gateway/src/status/page.html")).unwrap();
    let page_names: BTreeSet<String> = metric_names(&page).into_iter().collect();
    assert!(page_names.len() >= 20, "the status page names its series: {page_names:?}");
    for name in page_names {
        // The page sums a histogram's `_sum`/`_count` and reads every other name as rendered.
        if !series.contains_key(&name) {
            missing.push(format!("status page: {name}"));
        }
    }
    assert!(missing.is_empty(), "queried but not exported:\n{}", missing.join("\n"));

    if !e2e::have_tool("promtool") {
        e2e::skip_or_fail(
            "the_dashboard_queries_only_metrics_the_services_export (promtool part): promtool not found (apt-get install prometheus)",
        );
        return;
    }
    // promtool parses PromQL in rule files: one recording rule per query.
    let dir = std::env::temp_dir().join(format!("edge-dashboards-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut rules = String::from("groups:\n  - name: edge_dashboard\n    rules:\n");
    for (i, (_, expr)) in queries.iter().enumerate() {
        // Grafana's `$__rate_interval` is its own; Prometheus reads a duration there.
        let expr = expr.replace("$__rate_interval", "1m");
        rules.push_str(&format!(
            "      - record: edge:dashboard_query_{i}\n        expr: {}\n",
            serde_json::json!(expr)
        ));
    }
    let rules_file = dir.join("dashboard-rules.yml");
    std::fs::write(&rules_file, rules).unwrap();
    for args in [
        vec!["check".to_string(), "rules".into(), rules_file.display().to_string()],
        vec![
            "check".to_string(),
            "config".into(),
            repo().join("deploy/prometheus/prometheus.yml").display().to_string(),
        ],
    ] {
        let out = Command::new("promtool").args(&args).output().unwrap();
        assert!(
            out.status.success(),
            "promtool {args:?}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
