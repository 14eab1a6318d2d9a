//! Chat templates: upstream's `utils/chat_template_utils.py` (`render_jinja_template` and its
//! sandboxed Jinja environment), `PreTrainedTokenizerBase.get_chat_template`, and where a
//! tokenizer keeps its templates (`chat_template.jinja`, `additional_chat_templates/*.jinja`,
//! or `tokenizer_config.json`'s `chat_template`).
//!
//! Templates render with minijinja set up as upstream's
//! `ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
//! extensions=[loopcontrols])`: Python's string and dict methods (`strip`, `split`,
//! `startswith`, `items`, `get`, ...), upstream's `tojson` (`json.dumps` with `ensure_ascii`,
//! `indent`, `separators` and `sort_keys`, no HTML escaping, Python's float spelling),
//! `raise_exception`, `strftime_now`, `dict(...)` and `namespace(...)`;
//! `{% generation %}` blocks render their body, as upstream's without assistant masks.
//! Values print as jinja2's `str()` (Python's spelling: `True`, `None`, `1e-06`,
//! `['a', 'b']`). What differs: a float made text inside an expression (`|string`, `~`)
//! keeps minijinja's spelling (`1e-6`); error messages (minijinja's kinds instead of jinja2's exceptions), and a few
//! rarely used string methods minijinja's Python compatibility lacks (`removeprefix`,
//! `rsplit`, `zfill`), which fail with an error naming the method.
//!
//! Conversations, tools and documents are JSON text, read keeping the order of each
//! object's keys (a template that prints a whole object with `tojson` shows them as Python,
//! which keeps insertion order, would).

use std::path::Path;

use indexmap::IndexMap;
use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Environment, ErrorKind, Value};
use serde_json::Map;

use tchtrain_python_json::{python_float_repr, python_str_repr};

use crate::{Error, Result};

/// The file `save_pretrained` writes the (default) chat template to.
pub const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";
/// The folder of the other named chat templates (`<name>.jinja`).
pub const ADDITIONAL_CHAT_TEMPLATES_DIR: &str = "additional_chat_templates";

/// Upstream's tag appended to the message continued by `continue_final_message`.
const CONTINUE_FINAL_MESSAGE_TAG: &str = "CONTINUE_FINAL_MESSAGE_TAG ";

/// Names a message's reasoning goes under; the first is the one templates read.
const REASONING_FIELDS: [&str; 3] = ["reasoning_content", "thinking", "reasoning"];

/// A tokenizer's chat template(s): upstream's `tokenizer.chat_template`, a string or a dict
/// of named templates (`default`, `tool_use`, ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChatTemplate {
    /// One template.
    Single(String),
    /// Named templates, in the order they were read.
    Named(Vec<(String, String)>),
}

fn template_error(detail: impl Into<String>) -> Error {
    Error::ChatTemplate {
        detail: detail.into(),
    }
}

fn io_error(path: &Path, source: std::io::Error) -> Error {
    Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl ChatTemplate {
    /// Upstream's loading: `chat_template.jinja` and `additional_chat_templates/*.jinja`
    /// when the folder has any of them (a lone `chat_template.jinja` is a single template;
    /// otherwise named, the file as `default`), else `tokenizer_config.json`'s
    /// `chat_template` (a string, or a list of `{name, template}`). The key is taken out of
    /// `config` either way (the template has one owner; `save_pretrained` writes the files).
    pub fn load(dir: &Path, config: &mut Map<String, serde_json::Value>) -> Result<Option<Self>> {
        let from_config = config.remove("chat_template");
        let file = dir.join(CHAT_TEMPLATE_FILE);
        let default = if file.is_file() {
            Some(std::fs::read_to_string(&file).map_err(|e| io_error(&file, e))?)
        } else {
            None
        };
        let extra_dir = dir.join(ADDITIONAL_CHAT_TEMPLATES_DIR);
        let mut extra = Vec::new();
        if extra_dir.is_dir() {
            let entries = std::fs::read_dir(&extra_dir).map_err(|e| io_error(&extra_dir, e))?;
            for entry in entries {
                let path = entry.map_err(|e| io_error(&extra_dir, e))?.path();
                let name = path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .and_then(|n| n.strip_suffix(".jinja"));
                if let Some(name) = name {
                    let text = std::fs::read_to_string(&path).map_err(|e| io_error(&path, e))?;
                    extra.push((name.to_string(), text));
                }
            }
            extra.sort();
        }
        if default.is_some() || !extra.is_empty() {
            return Ok(Some(match (default, extra.is_empty()) {
                (Some(t), true) => Self::Single(t),
                (default, _) => {
                    let mut named: Vec<(String, String)> = default
                        .map(|t| ("default".to_string(), t))
                        .into_iter()
                        .collect();
                    named.extend(extra);
                    Self::Named(named)
                }
            }));
        }
        Self::from_config(from_config, &dir.join(crate::TOKENIZER_CONFIG_FILE))
    }

    /// `tokenizer_config.json`'s `chat_template` value (`origin` names the file in errors):
    /// a string, or a list of `{name, template}`; `None` when absent or null.
    pub fn from_config(value: Option<serde_json::Value>, origin: &Path) -> Result<Option<Self>> {
        let bad = |what: &str| {
            template_error(format!(
                "{}: `chat_template` {what}; give a string, or a list of {{\"name\": ..., \"template\": ...}}",
                origin.display()
            ))
        };
        Ok(match value {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::String(t)) => Some(Self::Single(t)),
            Some(serde_json::Value::Array(items)) => {
                let mut named = Vec::with_capacity(items.len());
                for item in items {
                    let field = |k: &str| item.get(k).and_then(serde_json::Value::as_str);
                    match (field("name"), field("template")) {
                        (Some(n), Some(t)) => named.push((n.to_string(), t.to_string())),
                        _ => return Err(bad("has an entry without a name and a template")),
                    }
                }
                Some(Self::Named(named))
            }
            Some(_) => return Err(bad("is neither a string nor a list")),
        })
    }

    /// Upstream's `save_chat_templates` (`save_jinja_files=True`): the single or `default`
    /// template to `chat_template.jinja`, the others to `additional_chat_templates/`.
    pub fn save(&self, dir: &Path) -> Result<()> {
        let write =
            |path: &Path, text: &str| std::fs::write(path, text).map_err(|e| io_error(path, e));
        match self {
            Self::Single(t) => write(&dir.join(CHAT_TEMPLATE_FILE), t),
            Self::Named(named) => {
                for (name, text) in named {
                    // Upstream: "Invalid chat template name".
                    if name.is_empty() || name.contains(['/', '\\']) || name.starts_with('.') {
                        return Err(template_error(format!(
                            "invalid chat template name {name:?}: a name becomes a file name in additional_chat_templates/; use letters, digits, '-' or '_'"
                        )));
                    }
                    if name == "default" {
                        write(&dir.join(CHAT_TEMPLATE_FILE), text)?;
                    } else {
                        let folder = dir.join(ADDITIONAL_CHAT_TEMPLATES_DIR);
                        std::fs::create_dir_all(&folder).map_err(|e| io_error(&folder, e))?;
                        write(&folder.join(format!("{name}.jinja")), text)?;
                    }
                }
                Ok(())
            }
        }
    }

    /// Upstream's `get_chat_template(chat_template, tools)`: `chat_template` names one of
    /// the templates, or is a template's text itself; without it, a single template, else
    /// `tool_use` when tools are given and there is one, else `default`.
    pub fn select<'a>(&'a self, chat_template: Option<&'a str>, tools: bool) -> Result<&'a str> {
        match (self, chat_template) {
            (Self::Named(named), Some(name)) => Ok(named
                .iter()
                .find(|(n, _)| n == name)
                .map_or(name, |(_, t)| t.as_str())),
            (Self::Single(_), Some(text)) => Ok(text),
            (Self::Single(t), None) => Ok(t),
            (Self::Named(named), None) => {
                let find = |n: &str| named.iter().find(|(k, _)| k == n).map(|(_, t)| t.as_str());
                tools
                    .then(|| find("tool_use"))
                    .flatten()
                    .or_else(|| find("default"))
                    .ok_or_else(|| {
                        let names: Vec<&str> = named.iter().map(|(n, _)| n.as_str()).collect();
                        template_error(format!(
                            "this model has multiple chat templates with no default specified ({}); pass chat_template with one of their names",
                            names.join(", ")
                        ))
                    })
            }
        }
    }
}

/// Upstream's `apply_chat_template` arguments other than the conversation.
#[derive(Debug, Clone, Default)]
pub struct ChatTemplateOptions {
    /// `add_generation_prompt`: end with the header of a new assistant message.
    pub add_generation_prompt: bool,
    /// `continue_final_message`: `None` (upstream's `False`), or the field of the last
    /// message to leave open for the model to continue (`"content"` for upstream's
    /// `True`). Not with `add_generation_prompt`.
    pub continue_final_message: Option<String>,
    /// `tools`: JSON text of a list of tool schemas (`null` or absent: none).
    pub tools: Option<String>,
    /// `documents`: JSON text of a list of objects (`title`, `text`, ...).
    pub documents: Option<String>,
    /// `chat_template`: the name of one of the tokenizer's templates, or a template's text.
    pub chat_template: Option<String>,
    /// Other template variables (upstream's `**kwargs`, e.g. `enable_thinking`); they win
    /// over the special tokens of the same name.
    pub template_kwargs: Map<String, serde_json::Value>,
}

/// Reads JSON text into template values, keeping each object's key order.
fn parse_json(text: &str, what: &str) -> Result<Value> {
    serde_json::from_str::<Value>(text)
        .map_err(|e| template_error(format!("{what} is not valid JSON: {e}")))
}

fn map_of(pairs: Vec<(Value, Value)>) -> Value {
    Value::from_object(pairs.into_iter().collect::<IndexMap<Value, Value>>())
}

fn pairs_of(map: &Value) -> Result<Vec<(Value, Value)>> {
    let mut pairs = Vec::new();
    for key in map.try_iter().map_err(|e| template_error(e.to_string()))? {
        let value = map
            .get_item(&key)
            .map_err(|e| template_error(e.to_string()))?;
        pairs.push((key, value));
    }
    Ok(pairs)
}

fn get<'a>(pairs: &'a [(Value, Value)], key: &str) -> Option<&'a Value> {
    pairs
        .iter()
        .find(|(k, _)| k.as_str() == Some(key))
        .map(|(_, v)| v)
}

fn set(pairs: &mut Vec<(Value, Value)>, key: &str, value: Value) {
    match pairs.iter_mut().find(|(k, _)| k.as_str() == Some(key)) {
        Some(slot) => slot.1 = value,
        None => pairs.push((Value::from(key), value)),
    }
}

/// Upstream's `_alias_reasoning_fields`: a message with reasoning under any of its names
/// becomes `{"thinking": r, **message, "reasoning_content": r}`.
fn alias_reasoning(pairs: Vec<(Value, Value)>) -> Vec<(Value, Value)> {
    let reasoning = REASONING_FIELDS
        .iter()
        .find_map(|f| get(&pairs, f).filter(|v| !v.is_none()).cloned());
    let Some(r) = reasoning else {
        return pairs;
    };
    let mut out = vec![(Value::from("thinking"), r.clone())];
    for (k, v) in pairs {
        set(&mut out, k.as_str().unwrap_or_default(), v);
    }
    set(&mut out, "reasoning_content", r);
    out
}

/// `{% generation %}` / `{% endgeneration %}` (upstream's `AssistantTracker` extension)
/// rewritten as an always-true `if` with the same whitespace control, so that the body
/// renders exactly as upstream renders it when no assistant mask is asked for.
///
/// With `track` the blocks' bounds recorded as they render:
/// the opening tag becomes an `if` whose condition notes where the output stands, the closing
/// tag an always-false `if` whose condition notes where the body ended (the whitespace
/// control and the block-tag trimming stay those of the original tags).
fn rewrite_generation_tags(template: &str, track: bool) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        // The closing `%}` after the opening `{%` (`{%}` is not a tag).
        let Some(end) = tag[2..].find("%}").map(|e| e + 2) else {
            out.push_str(tag);
            return out;
        };
        let inner = &tag[2..end];
        let (open, body) = match inner.chars().next() {
            Some(c @ ('-' | '+')) => (c.to_string(), &inner[1..]),
            _ => (String::new(), inner),
        };
        let (body, close) = match body.strip_suffix('-') {
            Some(b) => (b, "-"),
            None => (body, ""),
        };
        match (body.trim(), track) {
            ("generation", false) => out.push_str(&format!("{{%{open} if true {close}%}}")),
            ("endgeneration", false) => out.push_str(&format!("{{%{open} endif {close}%}}")),
            ("generation", true) => {
                out.push_str(&format!("{{%{open} if {GENERATION_START}() {close}%}}"))
            }
            ("endgeneration", true) => out.push_str(&format!(
                "{{%{open} if {GENERATION_END}() %}}{{% endif %}}{{% endif {close}%}}"
            )),
            _ => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

/// `json.dumps`' options.
struct JsonStyle {
    ensure_ascii: bool,
    indent: Option<String>,
    item_separator: String,
    key_separator: String,
    sort_keys: bool,
}

fn json_string(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            // `ensure_ascii` escapes everything outside ' '..='~' (DEL included), as UTF-16.
            c if ensure_ascii && (c as u32) > 0x7e => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn json_newline(out: &mut String, style: &JsonStyle, depth: usize) {
    if let Some(indent) = &style.indent {
        out.push('\n');
        for _ in 0..depth {
            out.push_str(indent);
        }
    }
}

fn json_key(key: &Value) -> std::result::Result<String, minijinja::Error> {
    Ok(match key.kind() {
        ValueKind::String => key.as_str().unwrap_or_default().to_string(),
        ValueKind::Bool => if key.is_true() { "true" } else { "false" }.to_string(),
        ValueKind::None | ValueKind::Undefined => "null".into(),
        ValueKind::Number => match key.as_i64() {
            Some(i) => i.to_string(),
            None => python_float_repr(f64::try_from(key.clone())?),
        },
        _ => {
            return Err(minijinja::Error::new(
                ErrorKind::InvalidOperation,
                "keys must be str, int, float, bool or None",
            ));
        }
    })
}

fn json_dump(
    out: &mut String,
    value: &Value,
    style: &JsonStyle,
    depth: usize,
) -> std::result::Result<(), minijinja::Error> {
    match value.kind() {
        ValueKind::None | ValueKind::Undefined => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number if value.is_integer() => out.push_str(&value.to_string()),
        ValueKind::Number => out.push_str(&python_float_repr(f64::try_from(value.clone())?)),
        ValueKind::String => {
            json_string(out, value.as_str().unwrap_or_default(), style.ensure_ascii)
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_separator);
                }
                json_newline(out, style, depth + 1);
                json_dump(out, item, style, depth + 1)?;
            }
            json_newline(out, style, depth);
            out.push(']');
        }
        ValueKind::Map => {
            let mut pairs = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                pairs.push((json_key(&key)?, item));
            }
            if style.sort_keys {
                pairs.sort_by(|a, b| a.0.cmp(&b.0));
            }
            if pairs.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, (key, item)) in pairs.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_separator);
                }
                json_newline(out, style, depth + 1);
                json_string(out, key, style.ensure_ascii);
                out.push_str(&style.key_separator);
                json_dump(out, item, style, depth + 1)?;
            }
            json_newline(out, style, depth);
            out.push('}');
        }
        other => {
            return Err(minijinja::Error::new(
                ErrorKind::InvalidOperation,
                format!("Object of type {other} is not JSON serializable"),
            ));
        }
    }
    Ok(())
}

/// Upstream's `tojson` filter: `json.dumps(x, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`.
fn tojson(value: &Value, kwargs: Kwargs) -> std::result::Result<Value, minijinja::Error> {
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let indent: Option<Value> = kwargs.get("indent")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let indent = match indent.filter(|i| !i.is_none()) {
        None => None,
        Some(i) if i.kind() == ValueKind::String => {
            Some(i.as_str().unwrap_or_default().to_string())
        }
        Some(i) => Some(" ".repeat(usize::try_from(i)?)),
    };
    let (item_separator, key_separator) = match separators.filter(|s| !s.is_none()) {
        Some(s) => (
            s.get_item(&Value::from(0))?.to_string(),
            s.get_item(&Value::from(1))?.to_string(),
        ),
        None => (
            if indent.is_some() { "," } else { ", " }.to_string(),
            ": ".to_string(),
        ),
    };
    let style = JsonStyle {
        ensure_ascii: ensure_ascii.unwrap_or(false),
        indent,
        item_separator,
        key_separator,
        sort_keys: sort_keys.unwrap_or(false),
    };
    let mut out = String::new();
    json_dump(&mut out, value, &style, 0)?;
    Ok(Value::from(out))
}

/// Python's `repr` of a template value, as jinja2 prints a value nested in a list or dict
/// (`[1, 'a', 1e-06]`, `{'b': True, 'a': None}`); `None` for what it cannot spell.
fn py_repr(out: &mut String, value: &Value) -> Option<()> {
    match value.kind() {
        ValueKind::None | ValueKind::Undefined => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number if value.is_integer() => out.push_str(&value.to_string()),
        ValueKind::Number => out.push_str(&python_float_repr(f64::try_from(value.clone()).ok()?)),
        ValueKind::String => out.push_str(&python_str_repr(value.as_str()?)),
        ValueKind::Seq => {
            out.push('[');
            for (i, item) in value.try_iter().ok()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                py_repr(out, &item)?;
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            for (i, key) in value.try_iter().ok()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                py_repr(out, &key)?;
                out.push_str(": ");
                py_repr(out, &value.get_item(&key).ok()?)?;
            }
            out.push('}');
        }
        _ => return None,
    }
    Some(())
}

/// How `{{ value }}` prints, as jinja2's `str(value)`: text as it is, nothing for an
/// undefined value, Python's spelling for the rest (`True`, `None`, `1e-06`, `[1, 'a']`);
/// minijinja's own for what Python has no literal of (namespaces, functions).
fn python_formatter(
    out: &mut minijinja::Output<'_>,
    state: &mut minijinja::State<'_, '_>,
    value: &Value,
) -> std::result::Result<(), minijinja::Error> {
    let mut text = String::new();
    let spelled = match value.kind() {
        ValueKind::Undefined => Some(()),
        ValueKind::String => {
            text.push_str(value.as_str().unwrap_or_default());
            Some(())
        }
        _ => py_repr(&mut text, value),
    };
    match spelled {
        Some(()) => out
            .write_str(&text)
            .map_err(|e| minijinja::Error::new(ErrorKind::WriteFailure, e.to_string())),
        None => minijinja::escape_formatter(out, state, value),
    }
}

fn raise_exception(message: String) -> std::result::Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
}

/// Upstream's `strftime_now(format)`: `datetime.now().strftime(format)`, in the local time
/// zone (`TZ`, else the system's).
fn strftime_now(format: String) -> std::result::Result<Value, minijinja::Error> {
    let now = jiff::Zoned::now();
    let text = jiff::fmt::strtime::format(format.as_bytes(), &now).map_err(|e| {
        minijinja::Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now({format:?}): {e}"),
        )
    })?;
    Ok(Value::from(text))
}

fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    // Built from constants: the builder cannot fail.
    if let Ok(syntax) = minijinja::syntax::SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .build()
    {
        env.set_syntax(syntax);
    }
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.set_formatter(python_formatter);
    env.add_filter("tojson", tojson);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env
}

/// The functions the tracked `{% generation %}` tags call.
const GENERATION_START: &str = "__tchtrain_generation_start";
const GENERATION_END: &str = "__tchtrain_generation_end";

/// Whether a template has `{% generation %}` markers (upstream's
/// `re.search(r"\{\%-?\s*generation\s*-?\%\}", chat_template)`).
pub fn has_generation_markers(template: &str) -> bool {
    regex::Regex::new(r"\{%-?\s*generation\s*-?%\}")
        .map(|re| re.is_match(template))
        .unwrap_or(false)
}

/// The output written so far and the generation blocks' bounds (bytes), shared by the
/// writer and the tags' functions.
#[derive(Default)]
struct GenerationTracker {
    out: Vec<u8>,
    open: Option<usize>,
    spans: Vec<(usize, usize)>,
}

struct TrackedOutput(std::sync::Arc<std::sync::Mutex<GenerationTracker>>);

impl std::io::Write for TrackedOutput {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        lock_tracker(&self.0).out.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn lock_tracker(
    t: &std::sync::Mutex<GenerationTracker>,
) -> std::sync::MutexGuard<'_, GenerationTracker> {
    match t.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// Upstream's `render_jinja_template` for one conversation (JSON text of a list of
/// messages) with `special_tokens` (the tokenizer's named special tokens: `bos_token`,
/// `eos_token`, ...): the messages without their `null`-valued keys and with reasoning
/// aliased, `continue_final_message` tagged and cut, as upstream.
pub fn render_jinja_template(
    template: &str,
    conversation: &str,
    options: &ChatTemplateOptions,
    special_tokens: &[(String, String)],
) -> Result<String> {
    Ok(render(template, conversation, options, special_tokens, false)?.0)
}

/// [`render_jinja_template`] with `return_assistant_tokens_mask`'s bookkeeping (upstream's
/// `AssistantTracker`): the rendered text and the character span `(start, end)` of every
/// `{% generation %}` block's output, in order. The template must have the markers, and
/// `continue_final_message` is refused, as upstream.
pub fn render_jinja_template_with_generation_indices(
    template: &str,
    conversation: &str,
    options: &ChatTemplateOptions,
    special_tokens: &[(String, String)],
) -> Result<(String, Vec<(usize, usize)>)> {
    if !has_generation_markers(template) {
        return Err(template_error(
            "return_assistant_tokens_mask==True but chat template does not contain `{% generation %}` keyword. (upstream's message)",
        ));
    }
    if options.continue_final_message.is_some() {
        return Err(template_error(
            "continue_final_message is not compatible with return_assistant_tokens_mask. (upstream's message)",
        ));
    }
    render(template, conversation, options, special_tokens, true)
}

fn render(
    template: &str,
    conversation: &str,
    options: &ChatTemplateOptions,
    special_tokens: &[(String, String)],
    track: bool,
) -> Result<(String, Vec<(usize, usize)>)> {
    let chat = parse_json(conversation, "the conversation")?;
    if chat.kind() != ValueKind::Seq {
        return Err(template_error(
            "the conversation must be a JSON list of messages (objects with `role` and `content`)",
        ));
    }
    let messages: Vec<Value> = chat
        .try_iter()
        .map_err(|e| template_error(e.to_string()))?
        .collect();
    if messages.is_empty() {
        return Err(template_error(
            "cannot apply chat template to an empty conversation; provide at least one message",
        ));
    }
    if messages[0].kind() == ValueKind::Seq {
        return Err(template_error(
            "a batch of conversations: apply the template to one conversation at a time",
        ));
    }
    let mut chat = Vec::with_capacity(messages.len());
    for (i, message) in messages.iter().enumerate() {
        if message.kind() != ValueKind::Map {
            return Err(template_error(format!(
                "message {i} is not an object: chat messages are objects with `role` and `content`"
            )));
        }
        // Upstream drops the keys whose value is None (`content=None` from APIs).
        let pairs: Vec<(Value, Value)> = pairs_of(message)?
            .into_iter()
            .filter(|(_, v)| !v.is_none())
            .collect();
        chat.push(alias_reasoning(pairs));
    }
    let continued = match &options.continue_final_message {
        None => None,
        Some(_) if options.add_generation_prompt => {
            return Err(template_error(
                "continue_final_message and add_generation_prompt are not compatible: use continue_final_message to let the model continue the final message, add_generation_prompt to start a new assistant message",
            ));
        }
        Some(field) => Some(continue_final_message(&mut chat, field, template)?),
    };
    let tools = match &options.tools {
        Some(t) => parse_json(t, "tools")?,
        None => Value::from(()),
    };
    let documents = match &options.documents {
        Some(d) => parse_json(d, "documents")?,
        None => Value::from(()),
    };
    if documents.kind() == ValueKind::Seq {
        let all_objects = documents
            .try_iter()
            .map_err(|e| template_error(e.to_string()))?
            .all(|d| d.kind() == ValueKind::Map);
        if !all_objects {
            return Err(template_error(
                "documents should be a list of objects with `title` and `text` keys",
            ));
        }
    }
    let mut context: Vec<(Value, Value)> = vec![
        (
            Value::from("messages"),
            Value::from(chat.into_iter().map(map_of).collect::<Vec<_>>()),
        ),
        (Value::from("tools"), tools),
        (Value::from("documents"), documents),
        (
            Value::from("add_generation_prompt"),
            Value::from(options.add_generation_prompt),
        ),
    ];
    for (name, token) in special_tokens {
        set(&mut context, name, Value::from(token.as_str()));
    }
    for (name, value) in &options.template_kwargs {
        set(
            &mut context,
            name,
            Value::from(minijinja::value::Serde(value)),
        );
    }
    let mut env = environment();
    let tracker = std::sync::Arc::new(std::sync::Mutex::new(GenerationTracker::default()));
    if track {
        let t = std::sync::Arc::clone(&tracker);
        env.add_function(GENERATION_START, move || {
            let mut t = lock_tracker(&t);
            t.open = Some(t.out.len());
            true
        });
        let t = std::sync::Arc::clone(&tracker);
        env.add_function(GENERATION_END, move || {
            let mut t = lock_tracker(&t);
            if let Some(start) = t.open.take() {
                let end = t.out.len();
                t.spans.push((start, end));
            }
            false
        });
    }
    let source = rewrite_generation_tags(template, track);
    let compiled = env
        .template_from_str(&source)
        .map_err(|e| template_error(format!("the template does not compile: {e}")))?;
    let (rendered, spans) = if track {
        compiled
            .render_captured_to(
                map_of(context),
                TrackedOutput(std::sync::Arc::clone(&tracker)),
            )
            .map_err(|e| template_error(format!("rendering failed: {e}")))?;
        let t = std::mem::take(&mut *lock_tracker(&tracker));
        let text = String::from_utf8(t.out)
            .map_err(|e| template_error(format!("the rendered chat is not UTF-8: {e}")))?;
        // Character positions, as upstream's `len(str)`.
        let chars = |b: usize| text.get(..b).map_or(0, |p| p.chars().count());
        let spans = t.spans.iter().map(|&(s, e)| (chars(s), chars(e))).collect();
        (text, spans)
    } else {
        let rendered = compiled
            .render(map_of(context))
            .map_err(|e| template_error(format!("rendering failed: {e}")))?;
        (rendered, Vec::new())
    };
    Ok(match continued {
        None => (rendered, spans),
        Some(final_message) => (cut_at_continue_tag(rendered, &final_message)?, spans),
    })
}

/// Upstream's `continue_final_message` preparation: the tag appended to the final message's
/// `field` (every reasoning alias of it; in a list of content blocks, the last block with
/// `text`); returns the message's original text.
fn continue_final_message(
    chat: &mut [Vec<(Value, Value)>],
    field: &str,
    template: &str,
) -> Result<String> {
    let Some(last) = chat.last_mut() else {
        return Err(template_error(
            "continue_final_message is set but the conversation is empty",
        ));
    };
    let final_message = get(last, field).cloned().ok_or_else(|| {
        template_error(format!(
            "continue_final_message is set but the final message has no \"{field}\" to continue"
        ))
    })?;
    let fields: Vec<String> = if REASONING_FIELDS.contains(&field) {
        REASONING_FIELDS
            .iter()
            .filter(|f| get(last, f) == Some(&final_message))
            .map(|f| f.to_string())
            .collect()
    } else {
        vec![field.to_string()]
    };
    if !fields.iter().any(|f| template.contains(f.as_str())) {
        return Err(template_error(format!(
            "continue_final_message is set to \"{field}\" but this is not an accepted field in the chat template"
        )));
    }
    if final_message.kind() == ValueKind::Seq {
        let mut blocks: Vec<Value> = final_message
            .try_iter()
            .map_err(|e| template_error(e.to_string()))?
            .collect();
        for block in blocks.iter_mut().rev() {
            if block.kind() != ValueKind::Map {
                continue;
            }
            let mut pairs = pairs_of(block)?;
            if let Some(text) = get(&pairs, "text")
                .and_then(Value::as_str)
                .map(str::to_string)
            {
                set(
                    &mut pairs,
                    "text",
                    Value::from(format!("{text}{CONTINUE_FINAL_MESSAGE_TAG}")),
                );
                *block = map_of(pairs);
                set(last, field, Value::from(blocks));
                return Ok(text);
            }
        }
        return Err(template_error(
            "continue_final_message is set but there is no text to continue in the final message",
        ));
    }
    let text = final_message.as_str().map(str::to_string).ok_or_else(|| {
        template_error(format!(
            "continue_final_message: the final message's \"{field}\" is neither text nor a list of content blocks"
        ))
    })?;
    for f in &fields {
        set(
            last,
            f,
            Value::from(format!("{text}{CONTINUE_FINAL_MESSAGE_TAG}")),
        );
    }
    Ok(text)
}

/// The rendered chat cut where the final message's tag is, as upstream.
fn cut_at_continue_tag(rendered: String, final_message: &str) -> Result<String> {
    let tag = CONTINUE_FINAL_MESSAGE_TAG.trim();
    if !rendered.contains(final_message.trim()) || !rendered.contains(tag) {
        return Err(template_error(format!(
            "continue_final_message is set but the final message does not appear in the chat after applying the chat template (the template deletes part of it). Final message to continue: {}\nRendered chat:\n{rendered}",
            final_message.trim()
        )));
    }
    let at = rendered.rfind(tag).unwrap_or(rendered.len());
    Ok(if rendered[at..].starts_with(CONTINUE_FINAL_MESSAGE_TAG) {
        rendered[..at].to_string()
    } else {
        rendered[..at].trim_end().to_string()
    })
}

#[cfg(test)]
fn rewrite_generation_tags_untracked(template: &str) -> String {
    rewrite_generation_tags(template, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_float_spelling() {
        for (f, want) in [
            (1.0, "1.0"),
            (2.5, "2.5"),
            (1e20, "1e+20"),
            (1e-5, "1e-05"),
            (1e-6, "1e-06"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (-0.0, "-0.0"),
            (123.456, "123.456"),
            (0.0001, "0.0001"),
        ] {
            assert_eq!(python_float_repr(f), want, "{f}");
        }
    }

    #[test]
    fn generation_blocks_become_ifs() {
        // Not a tag: left for the template compiler to refuse.
        assert_eq!(rewrite_generation_tags_untracked("a{%}b"), "a{%}b");
        assert_eq!(
            rewrite_generation_tags_untracked("a{%- generation %}b{% endgeneration -%}c{% if x %}"),
            "a{%- if true %}b{% endif -%}c{% if x %}"
        );
    }
}
