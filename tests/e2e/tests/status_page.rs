//! The gateway's status page, loaded in headless Chromium (Debian's `chromium`) against the
//! real stack: after traffic, the numbers the page shows equal the services' own `/metrics`
//! pages; after more traffic they moved, and equal them again. A screenshot of the page is
//! kept as the test's artifact (`target/e2e-artifacts/status-page.png`).
//!
//! Without Chromium the test fails unless EDGE_ALLOW_SKIP=1, which reports it skipped by name.

use std::path::{Path, PathBuf};
use std::process::Command;

use e2e::{Stack, chat, explain_request, http_get, http_status, metric};

fn chromium() -> Option<PathBuf> {
    ["chromium", "chromium-browser", "google-chrome"].iter().find_map(|name| {
        let out = Command::new("sh").arg("-c").arg(format!("command -v {name}")).output().ok()?;
        out.status.success().then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
    })
}

/// Chromium's flags for a headless run in a test (no sandbox: CI runs as root).
fn headless(browser: &Path, profile: &Path) -> Command {
    let mut cmd = Command::new(browser);
    cmd.args(["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars"])
        .arg(format!("--user-data-dir={}", profile.display()))
        // Long enough for the page's first poll (and the next) to land.
        .arg("--virtual-time-budget=5000");
    cmd
}

/// The page's DOM after its script ran.
fn rendered_dom(browser: &Path, profile: &Path, url: &str) -> String {
    let out = headless(browser, profile).arg("--dump-dom").arg(url).output().expect("run chromium");
    let dom = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        dom.contains("data-polls"),
        "the page never polled; chromium said:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    dom
}

/// The raw number the page keeps in `data-value` of the element with `id`.
fn shown(dom: &str, id: &str) -> f64 {
    let at = dom.find(&format!("id=\"{id}\"")).unwrap_or_else(|| panic!("no #{id} on the page"));
    let tag = &dom[dom[..at].rfind('<').unwrap()..at + dom[at..].find('>').unwrap()];
    let value = tag
        .split("data-value=\"")
        .nth(1)
        .and_then(|v| v.split('"').next())
        .unwrap_or_else(|| panic!("#{id} has no data-value: {tag}"));
    value.parse().unwrap_or_else(|_| panic!("#{id} shows {value:?}, not a number"))
}

/// (page element, Prometheus sample as rendered) pairs the page must agree on.
const SAME_AS_METRICS: &[(&str, &str)] = &[
    ("generated-total", "edge_engine_generated_tokens_total"),
    ("prompt-total", "edge_engine_prompt_tokens_total"),
    ("prefill-total", "edge_engine_prefill_tokens_total"),
    ("cached-total", "edge_engine_cached_prompt_tokens_total"),
    ("hit-full", "edge_cache_tokens_hit_total{kind=\"full_page\"}"),
    ("hit-partial", "edge_cache_tokens_hit_total{kind=\"partial_page\"}"),
    ("miss-no_match", "edge_cache_tokens_missed_total{reason=\"no_match\"}"),
    ("miss-last_token", "edge_cache_tokens_missed_total{reason=\"last_token\"}"),
    ("pages-used", "edge_cache_pages_used"),
    ("pages-free", "edge_cache_pages_free"),
    ("pages-cached", "edge_cache_pages_cached"),
    ("evictions", "edge_cache_evictions_total"),
];

async fn traffic(stack: &Stack, topics: &[&str]) {
    for topic in topics {
        let (status, body) = chat(stack, &explain_request(topic, 16)).await;
        assert_eq!(status, 200, "{body}");
    }
}

fn metrics_pages(stack: &Stack) -> String {
    let pages =
        [format!("{}/metrics", stack.base_url), stack.engine_metrics_url.clone(), stack.cache_metrics_url.clone()];
    pages.iter().map(|url| http_get(url).unwrap_or_else(|e| panic!("{url}: {e}"))).collect::<Vec<_>>().join("\n")
}

fn assert_page_matches_metrics(dom: &str, stack: &Stack, when: &str) -> Vec<f64> {
    let page = metrics_pages(stack);
    let mut values = Vec::new();
    for (id, sample) in SAME_AS_METRICS {
        let on_page = shown(dom, id);
        assert_eq!(on_page, metric(&page, sample), "{when}: #{id} vs {sample}");
        values.push(on_page);
    }
    // Requests: the page sums every status and endpoint of the gateway's counter.
    let requests: f64 = page
        .lines()
        .filter(|l| l.starts_with("edge_gateway_requests_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(shown(dom, "requests-total"), requests, "{when}: #requests-total");
    values.push(requests);
    values
}

#[tokio::test(flavor = "multi_thread")]
async fn the_status_page_shows_what_the_metrics_say_and_moves_with_traffic() {
    let Some(browser) = chromium() else {
        e2e::skip_or_fail(
            "the_status_page_shows_what_the_metrics_say_and_moves_with_traffic: chromium not found (apt-get install chromium)",
        );
        return;
    };
    let stack = Stack::start();
    let status_url = format!("{}/status", stack.base_url);
    assert_eq!(http_status(&status_url).unwrap(), 200);
    assert_eq!(http_status(&format!("{}/", stack.base_url)).unwrap(), 200, "the root serves the page too");
    let profile = stack.log_dir().join("chromium-profile");

    // A repeated prefix: cache hits of both kinds, and speculation.
    traffic(&stack, &["caches", "caches", "pages"]).await;
    let dom = rendered_dom(&browser, &profile, &status_url);
    let before = assert_page_matches_metrics(&dom, &stack, "after the first traffic");
    assert!(dom.contains("SmolLM2"), "the model's name is on the page");
    assert!(shown(&dom, "cached-total") > 0.0, "cache hits shown");

    traffic(&stack, &["metrics", "caches"]).await;
    let dom = rendered_dom(&browser, &profile, &status_url);
    let after = assert_page_matches_metrics(&dom, &stack, "after more traffic");
    for ((id, _), (a, b)) in SAME_AS_METRICS.iter().zip(before.iter().zip(&after)) {
        if ["generated-total", "prompt-total", "cached-total", "miss-last_token"].contains(id) {
            assert!(b > a, "#{id} moved with traffic: {a} -> {b}");
        }
    }
    assert!(after.last() > before.last(), "#requests-total moved");

    // The screenshot, kept for people to look at.
    let artifacts = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/e2e-artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();
    let shot = artifacts.join("status-page.png");
    let _ = std::fs::remove_file(&shot);
    let out = headless(&browser, &profile)
        .arg(format!("--screenshot={}", shot.display()))
        .arg("--window-size=1280,1100")
        .arg(&status_url)
        .output()
        .unwrap();
    let png = std::fs::read(&shot)
        .unwrap_or_else(|e| panic!("no screenshot ({e}); chromium said:\n{}", String::from_utf8_lossy(&out.stderr)));
    assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "a real screenshot ({} bytes)", png.len());
    eprintln!("status page screenshot: {}", shot.display());
}
