//! `ModuleRepr`: what `print(model)` shows of a module tree — `torch.nn.Module.__repr__`
//! (the class name, its `extra_repr`, its children as `(name): child` indented by two
//! spaces) and `ModuleList.__repr__` (runs of equal children folded as `(0-11): 12 x
//! Block(...)`). W&B's model artifacts carry it as `model_architecture.txt`.

use std::fmt;

use tchtrain_python_json::python_float_repr;

/// One module of the tree: its class name, its `extra_repr()` and its children in
/// registration order (or, for a `ModuleList`, its items).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleRepr {
    name: String,
    extra: String,
    children: Vec<(String, ModuleRepr)>,
    /// A `ModuleList`: the children are its items, shown folded.
    list: bool,
}

impl ModuleRepr {
    /// A module without `extra_repr` (`LlamaRotaryEmbedding()`, `SiLUActivation()`).
    pub fn new(name: impl Into<String>) -> Self {
        Self::with_extra(name, "")
    }

    /// A module whose `extra_repr()` is `extra`.
    pub fn with_extra(name: impl Into<String>, extra: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            extra: extra.into(),
            children: Vec::new(),
            list: false,
        }
    }

    /// A `ModuleList` of `items`.
    pub fn module_list(items: Vec<ModuleRepr>) -> Self {
        Self {
            name: "ModuleList".into(),
            extra: String::new(),
            children: items
                .into_iter()
                .enumerate()
                .map(|(i, m)| (i.to_string(), m))
                .collect(),
            list: true,
        }
    }

    /// This module under another class name (a subclass that keeps its parent's
    /// `extra_repr`: Gemma's `GemmaTextScaledWordEmbedding(96, 16, padding_idx=0)`).
    pub fn renamed(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// A `ModuleDict` of `items` (shown as any module's children, not folded).
    pub fn module_dict(items: Vec<(String, ModuleRepr)>) -> Self {
        Self {
            name: "ModuleDict".into(),
            extra: String::new(),
            children: items,
            list: false,
        }
    }

    /// This tree with every module below the root passed through `f` with its dotted path
    /// (`model.layers.0.self_attn.q_proj`; a list's items by index), children before their
    /// parent.
    pub fn map_modules(self, f: &mut impl FnMut(&str, ModuleRepr) -> ModuleRepr) -> Self {
        self.map_at("", f)
    }

    fn map_at(mut self, prefix: &str, f: &mut impl FnMut(&str, ModuleRepr) -> ModuleRepr) -> Self {
        let children = std::mem::take(&mut self.children);
        self.children = children
            .into_iter()
            .map(|(key, m)| {
                let path = match prefix.is_empty() {
                    true => key.clone(),
                    false => format!("{prefix}.{key}"),
                };
                let m = m.map_at(&path, f);
                let m = f(&path, m);
                (key, m)
            })
            .collect();
        self
    }

    /// This module with `child` registered as `key` after the others.
    pub fn child(mut self, key: impl Into<String>, child: ModuleRepr) -> Self {
        self.children.push((key.into(), child));
        self
    }

    /// `nn.Linear`: `Linear(in_features=16, out_features=64, bias=False)`.
    pub fn linear(in_features: i64, out_features: i64, bias: bool) -> Self {
        Self::with_extra(
            "Linear",
            format!(
                "in_features={in_features}, out_features={out_features}, bias={}",
                py_bool(bias)
            ),
        )
    }

    /// `nn.Embedding`: `Embedding(64, 16)`, `Embedding(64, 16, padding_idx=2)`.
    pub fn embedding(num_embeddings: i64, embedding_dim: i64, padding_idx: Option<i64>) -> Self {
        let mut extra = format!("{num_embeddings}, {embedding_dim}");
        if let Some(p) = padding_idx {
            extra.push_str(&format!(", padding_idx={p}"));
        }
        Self::with_extra("Embedding", extra)
    }

    /// `nn.LayerNorm` over the last dimension:
    /// `LayerNorm((16,), eps=1e-05, elementwise_affine=True, bias=True)`.
    pub fn layer_norm(dim: i64, eps: f64, elementwise_affine: bool, bias: bool) -> Self {
        Self::with_extra(
            "LayerNorm",
            format!(
                "({dim},), eps={}, elementwise_affine={}, bias={}",
                python_float_repr(eps),
                py_bool(elementwise_affine),
                py_bool(bias)
            ),
        )
    }

    /// An RMSNorm of transformers' modeling files (`LlamaRMSNorm((16,), eps=1e-06)`: its
    /// `extra_repr` is the weight's shape and `variance_epsilon`).
    pub fn rms_norm(name: impl Into<String>, dim: i64, eps: f64) -> Self {
        Self::with_extra(name, format!("({dim},), eps={}", python_float_repr(eps)))
    }

    /// `nn.Dropout`: `Dropout(p=0.1, inplace=False)`.
    pub fn dropout(p: f64) -> Self {
        Self::with_extra(
            "Dropout",
            format!("p={}, inplace=False", python_float_repr(p)),
        )
    }

    /// transformers' `Conv1D` (GPT-2's projections): `Conv1D(nf=48, nx=16)`.
    pub fn conv1d(nf: i64, nx: i64) -> Self {
        Self::with_extra("Conv1D", format!("nf={nf}, nx={nx}"))
    }

    fn render(&self) -> String {
        if self.list {
            return self.render_list();
        }
        let extra_lines: Vec<&str> = match self.extra.is_empty() {
            true => Vec::new(),
            false => self.extra.split('\n').collect(),
        };
        let child_lines: Vec<String> = self
            .children
            .iter()
            .map(|(key, m)| format!("({key}): {}", add_indent(&m.render(), 2)))
            .collect();
        let mut out = format!("{}(", self.name);
        if extra_lines.len() == 1 && child_lines.is_empty() {
            out.push_str(extra_lines[0]);
        } else if !extra_lines.is_empty() || !child_lines.is_empty() {
            let lines: Vec<String> = extra_lines
                .iter()
                .map(|s| s.to_string())
                .chain(child_lines)
                .collect();
            out.push_str("\n  ");
            out.push_str(&lines.join("\n  "));
            out.push('\n');
        }
        out.push(')');
        out
    }

    fn render_list(&self) -> String {
        let items: Vec<String> = self.children.iter().map(|(_, m)| m.render()).collect();
        if items.is_empty() {
            return format!("{}()", self.name);
        }
        // Runs of equal items: (first index, last index, text).
        let mut runs: Vec<(usize, usize, &str)> = Vec::new();
        for (i, text) in items.iter().enumerate() {
            match runs.last_mut() {
                Some(run) if run.2 == text => run.1 = i,
                _ => runs.push((i, i, text)),
            }
        }
        let lines: Vec<String> = runs
            .into_iter()
            .map(|(start, end, text)| {
                let line = match start == end {
                    true => format!("({start}): {text}"),
                    false => format!("({start}-{end}): {} x {text}", end - start + 1),
                };
                add_indent(&line, 2)
            })
            .collect();
        format!("{}(\n  {}\n)", self.name, lines.join("\n  "))
    }
}

impl fmt::Display for ModuleRepr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render())
    }
}

fn py_bool(b: bool) -> &'static str {
    if b { "True" } else { "False" }
}

/// torch's `_addindent`: every line after the first indented by `spaces` (blank lines left
/// empty).
fn add_indent(s: &str, spaces: usize) -> String {
    let mut lines = s.split('\n');
    let first = lines.next().unwrap_or_default();
    let rest: Vec<String> = lines
        .map(|line| match line.trim().is_empty() {
            true => String::new(),
            false => format!("{}{line}", " ".repeat(spaces)),
        })
        .collect();
    if rest.is_empty() {
        return s.to_string();
    }
    format!("{first}\n{}", rest.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// torch 2.13's `repr` of a module `M` (`extra_repr` `"k=1"`) with `a = Linear(2, 3)` and
    /// `l = ModuleList([Linear(3, 3) x 3, Dropout(0.5), Linear(3, 3)])`, and of an empty
    /// `ModuleList`.
    #[test]
    fn renders_as_torch_does() {
        let m = ModuleRepr::with_extra("M", "k=1")
            .child("a", ModuleRepr::linear(2, 3, true))
            .child(
                "l",
                ModuleRepr::module_list(vec![
                    ModuleRepr::linear(3, 3, true),
                    ModuleRepr::linear(3, 3, true),
                    ModuleRepr::linear(3, 3, true),
                    ModuleRepr::dropout(0.5),
                    ModuleRepr::linear(3, 3, true),
                ]),
            );
        assert_eq!(
            m.to_string(),
            "M(\n  k=1\n  (a): Linear(in_features=2, out_features=3, bias=True)\n  (l): ModuleList(\n    (0-2): 3 x Linear(in_features=3, out_features=3, bias=True)\n    (3): Dropout(p=0.5, inplace=False)\n    (4): Linear(in_features=3, out_features=3, bias=True)\n  )\n)"
        );
        assert_eq!(ModuleRepr::module_list(vec![]).to_string(), "ModuleList()");
        assert_eq!(
            ModuleRepr::layer_norm(768, 1e-5, true, true).to_string(),
            "LayerNorm((768,), eps=1e-05, elementwise_affine=True, bias=True)"
        );
        assert_eq!(
            ModuleRepr::embedding(64, 16, Some(2)).to_string(),
            "Embedding(64, 16, padding_idx=2)"
        );
    }
}
