//! A real HTTP client for the telemetry endpoint: urllib, and the Prometheus project's own
//! OpenMetrics parser for `/metrics`.

use serde_json::Value;

use super::python_json;

/// GETs each URL with urllib (a client nobody here wrote); for `/metrics` also parses the body
/// with `prometheus_client`'s OpenMetrics parser. Prints one JSON object per URL.
pub const HTTP_GET: &str = r#"
import json, sys, urllib.request, urllib.error
from prometheus_client.openmetrics.parser import text_string_to_metric_families
out = []
for url in sys.argv[1].split(","):
    try:
        r = urllib.request.urlopen(url, timeout=10)
        status, ctype, body = r.status, r.headers.get("Content-Type"), r.read().decode()
    except urllib.error.HTTPError as e:
        status, ctype, body = e.code, e.headers.get("Content-Type"), e.read().decode()
    item = {"url": url, "status": status, "content_type": ctype, "body": body}
    if url.endswith("/metrics"):
        fams = {}
        for f in text_string_to_metric_families(body):
            fams[f.name] = {"type": f.type, "samples": [[s.name, s.labels, s.value] for s in f.samples]}
        item["families"] = fams
    out.append(item)
print(json.dumps(out))
"#;

pub fn get(urls: &[String]) -> Vec<Value> {
    python_json(HTTP_GET, &urls.join(","), &[])
        .as_array()
        .unwrap()
        .clone()
}

/// The value of the sample `name{labels}` in a parsed `/metrics`.
pub fn sample(page: &Value, family: &str, name: &str, labels: &Value) -> Option<f64> {
    page["families"][family]["samples"]
        .as_array()?
        .iter()
        .find(|s| s[0] == name && &s[1] == labels)
        .and_then(|s| s[2].as_f64())
}

/// The value of `name{labels}` on the `/metrics` page of `base` (`http://127.0.0.1:PORT`).
pub fn metric(base: &str, family: &str, name: &str, labels: &Value) -> Option<f64> {
    let page = get(&[format!("{base}/metrics")]).remove(0);
    sample(&page, family, name, labels)
}

/// GET `base/path`: its status and body.
pub fn status(base: &str, path: &str) -> (u64, String) {
    let r = get(&[format!("{base}{path}")]).remove(0);
    (
        r["status"].as_u64().unwrap_or(0),
        r["body"].as_str().unwrap_or_default().to_string(),
    )
}
