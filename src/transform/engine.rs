//! One QuickJS runtime holding every UDF of a subscription, each loaded in a context of its own
//! (two UDFs may declare the same helper names, as they run apart on Pub/Sub).
//!
//! What UDF code can reach: ECMAScript's built-ins (QuickJS's full intrinsic set: `JSON`,
//! `Date`, `RegExp`, `Map`/`Set`, typed arrays, `Promise`, `Proxy`, `WeakRef`) plus `atob`/`btoa`.
//! No filesystem, network, timers, modules or host objects: rquickjs adds none of QuickJS's
//! `std`/`os` modules, no module loader is set (an `import` fails), and the one host global
//! QuickJS adds, `performance`, is removed. Pending promise jobs are never run.
//!
//! State between messages: each call gets fresh `message` and `metadata` objects; what the code
//! keeps in its own globals stays in that engine (one per worker thread) for the life of the run,
//! unless a call hits the time or memory limit, after which the engine is built afresh. Pub/Sub
//! runs UDFs on many instances and promises nothing about globals either: code must not rely on
//! them (docs/transforms.md).

use std::cell::Cell;
use std::rc::Rc;
use std::time::Instant;

use rquickjs::context::EvalOptions;
use rquickjs::{Context, Ctx, Error as JsError, Function, Object, Runtime, Type, Value};

use super::{CheckError, Outcome, TransformError, Udf, CALL_TIME_LIMIT, MEMORY_LIMIT, STACK_LIMIT};
use crate::message::{Attributes, Message};

/// The file name QuickJS gives the code of a UDF in stack traces (`udf:LINE:COL`).
const FILE: &str = "udf";

/// Every UDF of a subscription, loaded, on the thread that built it.
pub struct Engine {
    udfs: Vec<Udf>,
    /// `None` until built, and again after a call hit a limit.
    live: Option<Live>,
}

struct Live {
    /// Dropped after the contexts (field order).
    contexts: Vec<Context>,
    deadline: Rc<Cell<Option<Instant>>>,
    _rt: Runtime,
}

impl Engine {
    /// An engine for `udfs` (enabled ones, in order); every UDF is loaded now.
    pub fn new(udfs: &[Udf]) -> Result<Self, TransformError> {
        let mut e = Engine {
            udfs: udfs.to_vec(),
            live: None,
        };
        e.build()?;
        Ok(e)
    }

    /// Does `udf` compile, load and define its function?
    pub fn check(udf: &Udf) -> Result<(), CheckError> {
        let deadline = Rc::new(Cell::new(None));
        let rt = runtime(&deadline).map_err(|e| CheckError::Throws(e.to_string()))?;
        load(&rt, &deadline, udf).map(|_| ())
    }

    fn build(&mut self) -> Result<(), TransformError> {
        if self.live.is_none() {
            let deadline = Rc::new(Cell::new(None));
            let rt = runtime(&deadline).map_err(|e| TransformError::Engine(e.to_string()))?;
            let mut contexts = Vec::with_capacity(self.udfs.len());
            for udf in &self.udfs {
                let ctx = load(&rt, &deadline, udf)
                    .map_err(|e| TransformError::Engine(format!("{}: {e}", udf.function_name)))?;
                contexts.push(ctx);
            }
            self.live = Some(Live {
                contexts,
                deadline,
                _rt: rt,
            });
        }
        Ok(())
    }

    /// Run the UDFs in order on `m`: the first that returns `null` filters it; the first that
    /// fails fails it; otherwise each one's result is the next one's message.
    pub fn apply(&mut self, m: &Message) -> Outcome {
        if self.udfs.is_empty() {
            return Outcome::Keep(m.clone());
        }
        let first = &self.udfs[0].function_name;
        let data = match std::str::from_utf8(&m.data) {
            Ok(s) => s.to_string(),
            Err(e) => {
                return Outcome::Failed(TransformError::NotUtf8 {
                    function: first.clone(),
                    reason: e.to_string(),
                })
            }
        };
        if let Err(e) = self.build() {
            return Outcome::Failed(e);
        }
        let live = self.live.as_ref().expect("built above");
        let publish_time = chrono::DateTime::from_timestamp_micros(m.publish_time_micros)
            .unwrap_or_default()
            .format("%Y-%m-%dT%H:%M:%SZ")
            .to_string();
        let mut cur = Current {
            data,
            attributes: None,
        };
        let mut broken = false;
        let mut outcome = None;
        for (udf, ctx) in self.udfs.iter().zip(&live.contexts) {
            let step = ctx.with(|ctx| {
                call(
                    &ctx,
                    &live.deadline,
                    &udf.function_name,
                    m,
                    &publish_time,
                    &cur,
                )
            });
            match step {
                Step::Next(next) => {
                    cur.data = next.data;
                    if next.attributes.is_some() {
                        cur.attributes = next.attributes;
                    }
                }
                Step::Filtered => {
                    outcome = Some(Outcome::Filtered {
                        by: udf.function_name.clone(),
                    });
                    break;
                }
                Step::Failed { reason, limit } => {
                    broken = limit;
                    outcome = Some(Outcome::Failed(reason(udf.function_name.clone())));
                    break;
                }
            }
        }
        if broken {
            // Out of time or memory mid-call: start again from a fresh runtime.
            self.live = None;
        }
        outcome.unwrap_or_else(|| {
            let mut out = m.clone();
            out.data = bytes::Bytes::from(cur.data.into_bytes());
            if let Some(a) = cur.attributes {
                out.attributes = a;
            }
            Outcome::Keep(out)
        })
    }
}

/// The message between two UDFs: `attributes` `None` = still the original ones.
struct Current {
    data: String,
    attributes: Option<Attributes>,
}

type Reason = Box<dyn FnOnce(String) -> TransformError>;

enum Step {
    Next(Current),
    Filtered,
    Failed {
        reason: Reason,
        /// A limit (time, memory) stopped it: the runtime is rebuilt.
        limit: bool,
    },
}

fn shape(reason: impl Into<String>) -> Step {
    let reason = reason.into();
    Step::Failed {
        reason: Box::new(move |function| TransformError::Shape { function, reason }),
        limit: false,
    }
}

fn threw(reason: String, limit: bool) -> Step {
    Step::Failed {
        reason: Box::new(move |function| TransformError::Threw { function, reason }),
        limit,
    }
}

fn runtime(deadline: &Rc<Cell<Option<Instant>>>) -> rquickjs::Result<Runtime> {
    let rt = Runtime::new()?;
    rt.set_memory_limit(MEMORY_LIMIT);
    rt.set_max_stack_size(STACK_LIMIT);
    let d = deadline.clone();
    rt.set_interrupt_handler(Some(Box::new(move || {
        d.get().is_some_and(|t| Instant::now() >= t)
    })));
    Ok(rt)
}

/// Load `udf` in a fresh context of `rt`.
fn load(
    rt: &Runtime,
    deadline: &Rc<Cell<Option<Instant>>>,
    udf: &Udf,
) -> Result<Context, CheckError> {
    let ctx = Context::full(rt).map_err(|e| CheckError::Throws(e.to_string()))?;
    ctx.with(|ctx| {
        let globals = ctx.globals();
        let _ = globals.remove("performance");
        let mut opts = EvalOptions::default();
        opts.strict = false;
        opts.filename = Some(FILE.to_string());
        deadline.set(Some(Instant::now() + CALL_TIME_LIMIT));
        let r = ctx.eval_with_options::<(), _>(udf.code.as_str(), opts);
        deadline.set(None);
        match r {
            Ok(()) => {}
            Err(JsError::Exception) => {
                let e = ctx.catch();
                let (name, message, stack) = describe_parts(&e);
                if name.as_deref() == Some("SyntaxError") {
                    let (line, column) = position(stack.as_deref());
                    return Err(CheckError::Syntax {
                        message: message.unwrap_or_default(),
                        line,
                        column,
                    });
                }
                return Err(CheckError::Throws(describe(&e)));
            }
            Err(e) => return Err(CheckError::Throws(e.to_string())),
        }
        let f: Value = globals
            .get(udf.function_name.as_str())
            .map_err(|e| CheckError::Throws(e.to_string()))?;
        if !f.is_function() {
            return Err(CheckError::NoFunction(udf.function_name.clone()));
        }
        Ok(())
    })?;
    Ok(ctx)
}

/// `udf:LINE:COL` in a stack trace → (line, column).
fn position(stack: Option<&str>) -> (Option<u32>, Option<u32>) {
    let Some(stack) = stack else {
        return (None, None);
    };
    let pat = format!("{FILE}:");
    for (i, _) in stack.match_indices(&pat) {
        let rest = &stack[i + pat.len()..];
        let mut parts = rest.splitn(3, ':');
        let line = parts.next().and_then(|l| l.parse::<u32>().ok());
        let col = parts.next().and_then(|c| {
            let digits: String = c.chars().take_while(char::is_ascii_digit).collect();
            digits.parse::<u32>().ok()
        });
        if line.is_some() {
            return (line, col);
        }
    }
    (None, None)
}

/// (`name`, `message`, `stack`) of a thrown value, when it is an Error.
fn describe_parts(v: &Value) -> (Option<String>, Option<String>, Option<String>) {
    let Some(o) = v.as_object() else {
        return (None, None, None);
    };
    let get = |k: &str| -> Option<String> {
        o.get::<_, Value>(k)
            .ok()
            .and_then(|v| v.as_string().and_then(|s| s.to_string().ok()))
    };
    (get("name"), get("message"), get("stack"))
}

/// A thrown value as text: `Name: message` for an Error, else its string form.
fn describe(v: &Value) -> String {
    let (name, message, _) = describe_parts(v);
    if let Some(m) = message {
        return match name {
            Some(n) => format!("{n}: {m}"),
            None => m,
        };
    }
    if let Some(s) = v.as_string().and_then(|s| s.to_string().ok()) {
        return format!("threw {s:?}");
    }
    format!("threw a value of type {}", v.type_name())
}

/// The function and its two arguments, fresh for this call.
fn arguments<'js>(
    ctx: &Ctx<'js>,
    name: &str,
    m: &Message,
    publish_time: &str,
    cur: &Current,
) -> rquickjs::Result<(Function<'js>, Object<'js>, Object<'js>)> {
    let msg = Object::new(ctx.clone())?;
    msg.set("data", cur.data.as_str())?;
    let attrs = Object::new(ctx.clone())?;
    match &cur.attributes {
        Some(a) => {
            for (k, v) in a.iter() {
                attrs.set(k, v)?;
            }
        }
        None => {
            for (k, v) in m.attributes.iter() {
                attrs.set(k, v)?;
            }
        }
    }
    msg.set("attributes", attrs)?;
    let meta = Object::new(ctx.clone())?;
    if !m.message_id.is_empty() {
        meta.set("message_id", m.message_id.as_str())?;
    }
    meta.set("publish_time", publish_time)?;
    if !m.ordering_key.is_empty() {
        meta.set("ordering_key", m.ordering_key.as_str())?;
    }
    let f: Function = ctx.globals().get(name)?;
    Ok((f, msg, meta))
}

fn call(
    ctx: &Ctx<'_>,
    deadline: &Cell<Option<Instant>>,
    name: &str,
    m: &Message,
    publish_time: &str,
    cur: &Current,
) -> Step {
    let built = arguments(ctx, name, m, publish_time, cur);
    let (f, msg, meta) = match built {
        Ok(b) => b,
        Err(e) => return caught(ctx, e),
    };
    deadline.set(Some(Instant::now() + CALL_TIME_LIMIT));
    let r: rquickjs::Result<Value> = f.call((msg, meta));
    let late = deadline.get().is_some_and(|t| Instant::now() >= t);
    deadline.set(None);
    let v = match r {
        Ok(v) => v,
        Err(e) if late => {
            let _ = ctx.catch();
            let _ = e;
            return threw(
                format!("ran longer than {} ms", CALL_TIME_LIMIT.as_millis()),
                true,
            );
        }
        Err(e) => return caught(ctx, e),
    };
    result(v)
}

/// An error from QuickJS: the pending exception, described.
fn caught(ctx: &Ctx<'_>, e: JsError) -> Step {
    if let JsError::Exception = e {
        let v = ctx.catch();
        let text = describe(&v);
        let limit = text.contains("out of memory") || text.contains("interrupted");
        return threw(text, limit);
    }
    let limit = matches!(e, JsError::Allocation);
    threw(e.to_string(), limit)
}

/// What the UDF returned: `null` filters; `{data: string, attributes?: {string: string}}`
/// replaces the message (no `attributes` key, or `undefined`, keeps the attributes it was
/// given; `{}` removes them all).
fn result(v: Value<'_>) -> Step {
    if v.is_null() {
        return Step::Filtered;
    }
    if v.type_of() != Type::Object {
        return shape(format!(
            "returned {} (expected null or an object with a string `data`)",
            v.type_name()
        ));
    }
    let o = v.as_object().expect("an object");
    let data: Value = match o.get("data") {
        Ok(d) => d,
        Err(e) => return shape(e.to_string()),
    };
    let Some(data) = data.as_string() else {
        return shape(format!("`data` is {}, not a string", data.type_name()));
    };
    let Ok(data) = data.to_string() else {
        return shape("`data` is not well-formed Unicode (a lone surrogate)");
    };
    let attrs: Value = match o.get("attributes") {
        Ok(a) => a,
        Err(e) => return shape(e.to_string()),
    };
    if attrs.is_undefined() {
        return Step::Next(Current {
            data,
            attributes: None,
        });
    }
    if attrs.type_of() != Type::Object {
        return shape(format!(
            "`attributes` is {}, not an object of strings",
            attrs.type_name()
        ));
    }
    let attrs = attrs.as_object().expect("an object");
    let mut out = Attributes::new();
    for kv in attrs.props::<String, Value>() {
        let (k, v) = match kv {
            Ok(kv) => kv,
            Err(e) => return shape(format!("`attributes`: {e}")),
        };
        let Some(s) = v.as_string() else {
            return shape(format!(
                "attribute {k:?} is {}, not a string",
                v.type_name()
            ));
        };
        let Ok(s) = s.to_string() else {
            return shape(format!(
                "attribute {k:?} is not well-formed Unicode (a lone surrogate)"
            ));
        };
        out.insert(k, s);
    }
    Step::Next(Current {
        data,
        attributes: Some(out),
    })
}
