//! `messageTransforms` (docs/transforms.md): the REST list checked field by field, and the enabled
//! JavaScript UDFs it leaves, in order.
//!
//! `[{"javascriptUdf": {"functionName": F, "code": C}, "disabled": bool}]`; `enabled` is the
//! deprecated field `disabled` replaced (`enabled: false` skips the transform too). Rules: at most
//! [`MAX_TRANSFORMS`]; each a JavaScript UDF (an `aiInference` transform calls Vertex AI, which
//! subsink does not); `functionName` a JavaScript identifier, unique in the list; `code` at most
//! [`MAX_CODE_BYTES`], it compiles, and defines the function (a syntax error names its line and
//! column within `code`). Disabled transforms are checked too (Pub/Sub stores them), then skipped.

use std::collections::HashSet;

use serde_json::Value;

use crate::transform::{self, Udf, MAX_CODE_BYTES, MAX_TRANSFORMS};

/// The enabled UDFs of `list`, in order; `fail(field, rule)` for every broken rule.
pub fn check(list: &[Value], fail: &mut dyn FnMut(String, String)) -> Vec<Udf> {
    let mut out = Vec::new();
    if list.len() > MAX_TRANSFORMS {
        fail(
            "messageTransforms".into(),
            format!(
                "at most {MAX_TRANSFORMS} transforms per subscription, got {}",
                list.len()
            ),
        );
    }
    let mut names = HashSet::new();
    for (i, t) in list.iter().enumerate() {
        let at = format!("messageTransforms[{i}]");
        let Some(obj) = t.as_object() else {
            fail(at, "must be an object (a MessageTransform)".into());
            continue;
        };
        let (disabled, udf) = transform_fields(obj, &at, fail);
        let at = format!("{at}.javascriptUdf");
        let Some(udf) = udf else {
            if !obj.contains_key("aiInference") {
                fail(at, "required: {\"functionName\": …, \"code\": …}".into());
            }
            continue;
        };
        let Some(u) = udf.as_object() else {
            fail(
                at,
                "must be an object {\"functionName\": …, \"code\": …}".into(),
            );
            continue;
        };
        for k in u.keys() {
            if k != "functionName" && k != "code" {
                fail(
                    format!("{at}.{k}"),
                    "unknown field (a JavaScriptUDF has functionName and code)".into(),
                );
            }
        }
        let name = function_name(u.get("functionName"), &at, &mut names, fail);
        let code = udf_code(u.get("code"), &at, fail);
        let (Some(function_name), Some(code)) = (name, code) else {
            continue;
        };
        let udf = Udf {
            function_name,
            code,
        };
        if let Err(e) = transform::check(&udf) {
            fail(format!("{at}.code"), e.to_string());
            continue;
        }
        if !disabled {
            out.push(udf);
        }
    }
    out
}

/// A MessageTransform's fields (`at` names it): whether it is disabled, and its
/// `javascriptUdf`; the other fields are refused.
fn transform_fields<'a>(
    obj: &'a serde_json::Map<String, Value>,
    at: &str,
    fail: &mut dyn FnMut(String, String),
) -> (bool, Option<&'a Value>) {
    let mut disabled = false;
    let mut udf = None;
    for (k, v) in obj {
        let field = format!("{at}.{k}");
        match k.as_str() {
            "disabled" => match v.as_bool() {
                Some(b) => disabled |= b,
                None => fail(field, "must be true or false".into()),
            },
            "enabled" => match v.as_bool() {
                Some(b) => disabled |= !b,
                None => fail(field, "must be true or false".into()),
            },
            "javascriptUdf" => udf = Some(v),
            "aiInference" => fail(
                field,
                "AI inference transforms call Vertex AI; subsink runs JavaScript UDFs only".into(),
            ),
            _ => fail(
                field,
                "unknown field (a MessageTransform has javascriptUdf, disabled, enabled)".into(),
            ),
        }
    }
    (disabled, udf)
}

/// A JavaScript UDF's `functionName` (`at` names the UDF): a valid name, unique among
/// `names`.
fn function_name(
    v: Option<&Value>,
    at: &str,
    names: &mut HashSet<String>,
    fail: &mut dyn FnMut(String, String),
) -> Option<String> {
    match v {
        None => {
            fail(format!("{at}.functionName"), "required".into());
            None
        }
        Some(Value::String(s)) if transform::valid_function_name(s) => {
            if !names.insert(s.clone()) {
                fail(
                    format!("{at}.functionName"),
                    format!("{s:?} is already the name of another transform: function names must be unique"),
                );
            }
            Some(s.clone())
        }
        Some(Value::String(s)) => {
            fail(
                format!("{at}.functionName"),
                format!("{s:?} is not a JavaScript function name (letters, digits, _ and $, not starting with a digit, not a reserved word)"),
            );
            None
        }
        Some(_) => {
            fail(format!("{at}.functionName"), "must be a string".into());
            None
        }
    }
}

/// A JavaScript UDF's `code` (`at` names the UDF): a string of at most [`MAX_CODE_BYTES`].
fn udf_code(v: Option<&Value>, at: &str, fail: &mut dyn FnMut(String, String)) -> Option<String> {
    match v {
        None => {
            fail(format!("{at}.code"), "required".into());
            None
        }
        Some(Value::String(s)) if s.len() > MAX_CODE_BYTES => {
            fail(
                format!("{at}.code"),
                format!(
                    "must be at most {MAX_CODE_BYTES} bytes ({} KiB), got {}",
                    MAX_CODE_BYTES / 1024,
                    s.len()
                ),
            );
            None
        }
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => {
            fail(format!("{at}.code"), "must be a string".into());
            None
        }
    }
}

/// A `--message-transforms-file`: a JSON or YAML list of transforms (REST field names), as
/// gcloud takes it.
pub fn read_file(path: &std::path::Path) -> Result<Vec<Value>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("--message-transforms-file {}: {e}", path.display()))?;
    let v: Value = serde_yaml::from_str(&text).map_err(|e| {
        format!(
            "--message-transforms-file {}: not JSON or YAML: {e}",
            path.display()
        )
    })?;
    match v {
        Value::Array(list) => Ok(list),
        // gcloud also accepts one transform on its own.
        Value::Object(_) => Ok(vec![v]),
        _ => Err(format!(
            "--message-transforms-file {}: must be a list of transforms",
            path.display()
        )),
    }
}
