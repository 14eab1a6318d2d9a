//! What the allow-listed globals mean when a pickle applies them: torch's tensor rebuild
//! functions (`_rebuild_tensor_v2` / `_v3`, `_rebuild_parameter`) over storages from
//! persistent ids, `collections.OrderedDict`, `_codecs.encode` (how protocol 2 spells
//! `bytes`), and, for every other allowed name, an inert [`crate::Object`] record. Nothing
//! is executed: each case checks its arguments and builds a value.

use std::rc::Rc;
use std::sync::Arc;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::globals::{
    BUILTINS_BYTES, CODECS_ENCODE, ORDERED_DICT, REBUILD_PARAMETER, REBUILD_TENSOR_V2,
    REBUILD_TENSOR_V3, UNTYPED_STORAGE,
};
use crate::object_graph::{Graph, Item, Node, StorageRef, describe};
use crate::value::{ObjectKind, Storage, Tensor, view_extent};

/// Where an opcode is, for errors.
pub(crate) struct At<'a> {
    pub file: &'a str,
    pub offset: usize,
}

impl At<'_> {
    fn bad_args(&self, callable: (&str, &str), problem: impl Into<String>) -> Error {
        Error::BadArguments {
            file: self.file.to_string(),
            offset: self.offset,
            callable: format!("{}.{}", callable.0, callable.1),
            problem: problem.into(),
        }
    }
}

/// The storage class a persistent id names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StorageType {
    /// `torch.FloatStorage` and the other legacy typed storages.
    Typed(DType),
    /// `torch.storage.UntypedStorage` (bytes; tensors over it name their dtype).
    Untyped,
}

impl StorageType {
    /// The storage's element type (`uint8` for untyped storages, as torch's `persistent_load`).
    pub fn dtype(self) -> DType {
        match self {
            StorageType::Typed(d) => d,
            StorageType::Untyped => DType::UInt8,
        }
    }
}

/// `('storage', storage_type, key, location, numel)`, what torch's `persistent_id` writes.
#[derive(Debug, Clone)]
pub(crate) struct PersistentId {
    pub storage_type: StorageType,
    pub key: String,
    pub location: String,
    pub numel: u64,
}

/// Where storages come from: the checkpoint's `data/<key>` records.
pub(crate) trait StorageSource {
    /// The storage a persistent id names, its size checked against the id.
    fn load_storage(&mut self, pid: &PersistentId) -> Result<Arc<Storage>>;
}

/// Reads a persistent id tuple (the `BINPERSID` operand).
pub(crate) fn persistent_id(graph: &Graph, at: &At<'_>, pid: &Item) -> Result<PersistentId> {
    let bad = |problem: String| Error::BadOperand {
        file: at.file.to_string(),
        offset: at.offset,
        opcode: "BINPERSID",
        problem,
    };
    let Some(items) = graph.tuple_items(pid) else {
        return Err(bad(format!(
            "a persistent id must be a ('storage', type, key, location, numel) tuple, not {}",
            graph.describe(pid)
        )));
    };
    let [tag, ty, key, location, numel] = items else {
        return Err(bad(format!(
            "a persistent id tuple has 5 items, this one {}",
            items.len()
        )));
    };
    if !matches!(tag, Item::Str(s) if &**s == "storage") {
        return Err(bad(format!(
            "only persistent ids of storages are allowed, not {}",
            describe(tag)
        )));
    }
    let storage_type = match ty {
        Item::Global(g) if (g.0.as_str(), g.1.as_str()) == UNTYPED_STORAGE => StorageType::Untyped,
        Item::Global(g) if g.0 == "torch" || g.0 == "torch.cuda" => {
            StorageType::Typed(DType::from_legacy_storage_name(&g.1).ok_or_else(|| {
                Error::UnknownDType {
                    file: at.file.to_string(),
                    name: format!("{}.{}", g.0, g.1),
                }
            })?)
        }
        Item::Global(g) => {
            return Err(Error::UnknownDType {
                file: at.file.to_string(),
                name: format!("{}.{}", g.0, g.1),
            });
        }
        other => return Err(bad(format!("a storage type, not {}", describe(other)))),
    };
    let (Item::Str(key), Item::Str(location)) = (key, location) else {
        return Err(bad("the storage key and location must be strings".into()));
    };
    let numel = match numel {
        Item::Int(n) if *n >= 0 => *n as u64,
        other => {
            return Err(bad(format!(
                "the storage numel must be a non-negative int, not {}",
                describe(other)
            )));
        }
    };
    Ok(PersistentId {
        storage_type,
        key: key.to_string(),
        location: location.to_string(),
        numel,
    })
}

/// `REDUCE` (or `NEWOBJ` when `kind` says so) of the allow-listed `callable` with `args`.
pub(crate) fn call(
    graph: &mut Graph,
    at: &At<'_>,
    callable: &(String, String),
    kind: ObjectKind,
    args: Vec<Item>,
) -> Result<Item> {
    let c = (callable.0.as_str(), callable.1.as_str());
    if c == ORDERED_DICT {
        let mut items = Vec::new();
        match args.as_slice() {
            [] => {}
            [pairs] if matches!(graph.node(pairs), Some(Node::List(_))) => {
                if let Some(Node::List(list)) = graph.node(pairs) {
                    for pair in list.clone() {
                        match graph.tuple_items(&pair) {
                            Some([k, v]) => items.push((k.clone(), v.clone())),
                            _ => return Err(at.bad_args(c, "expects a list of (key, value) pairs")),
                        }
                    }
                }
            }
            _ => return Err(at.bad_args(c, "expects () or a list of (key, value) pairs")),
        }
        let dict = graph.add(Node::Dict {
            ordered: true,
            items: Vec::new(),
            keys: Default::default(),
        });
        for (k, v) in items {
            graph.set_item(&dict, k, v).map_err(|p| at.bad_args(c, p))?;
        }
        return Ok(dict);
    }
    if kind == ObjectKind::NewObj
        && [
            REBUILD_TENSOR_V2,
            REBUILD_TENSOR_V3,
            REBUILD_PARAMETER,
            CODECS_ENCODE,
            BUILTINS_BYTES,
        ]
        .contains(&c)
    {
        return Err(at.bad_args(c, "is a function, not a class (NEWOBJ)"));
    }
    if c == REBUILD_TENSOR_V2 || c == REBUILD_TENSOR_V3 {
        return rebuild_tensor(graph, at, c, &args).map(|t| Item::Tensor(Rc::new(t)));
    }
    if c == REBUILD_PARAMETER {
        let [Item::Tensor(data), requires_grad, hooks] = args.as_slice() else {
            return Err(at.bad_args(c, "expects (tensor, requires_grad, backward_hooks)"));
        };
        let Item::Bool(requires_grad) = requires_grad else {
            return Err(at.bad_args(c, "requires_grad must be a bool"));
        };
        if !graph.is_empty_dict(hooks) {
            return Err(at.bad_args(c, "backward hooks must be an empty OrderedDict"));
        }
        let mut t = (**data).clone();
        t.requires_grad = *requires_grad;
        t.parameter = true;
        return Ok(Item::Tensor(Rc::new(t)));
    }
    if c == CODECS_ENCODE {
        let [Item::Str(text), Item::Str(encoding)] = args.as_slice() else {
            return Err(at.bad_args(c, "expects (str, encoding)"));
        };
        if !matches!(&**encoding, "latin1" | "latin-1") {
            return Err(at.bad_args(
                c,
                format!("only the latin1 encoding is supported, not {encoding:?}"),
            ));
        }
        let bytes = text
            .chars()
            .map(|ch| u8::try_from(u32::from(ch)).ok())
            .collect::<Option<Vec<u8>>>()
            .ok_or_else(|| at.bad_args(c, "the text has a character beyond U+00FF"))?;
        return Ok(Item::Bytes(bytes.into()));
    }
    if c == BUILTINS_BYTES {
        if !args.is_empty() {
            return Err(at.bad_args(c, "only bytes() (empty) is supported"));
        }
        return Ok(Item::Bytes(Rc::from(Vec::new())));
    }
    if c == UNTYPED_STORAGE || DType::from_legacy_storage_name(c.1).is_some() {
        return Err(at.bad_args(c, "storages are only read through persistent ids"));
    }
    Ok(graph.add(Node::Object {
        module: callable.0.clone(),
        name: callable.1.clone(),
        kind,
        args,
        state: None,
    }))
}

/// `_rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks[, metadata])` and
/// `_rebuild_tensor_v3(..., hooks, dtype[, metadata])`.
fn rebuild_tensor(graph: &Graph, at: &At<'_>, c: (&str, &str), args: &[Item]) -> Result<Tensor> {
    let v3 = c == REBUILD_TENSOR_V3;
    let fixed = if v3 { 7 } else { 6 };
    if args.len() != fixed && args.len() != fixed + 1 {
        return Err(at.bad_args(
            c,
            format!(
                "expects {fixed} or {} arguments, got {}",
                fixed + 1,
                args.len()
            ),
        ));
    }
    let Item::Storage(storage) = &args[0] else {
        return Err(at.bad_args(
            c,
            format!(
                "the first argument must be a storage, not {}",
                describe(&args[0])
            ),
        ));
    };
    let Item::Int(offset) = args[1] else {
        return Err(at.bad_args(c, "the storage offset must be an int"));
    };
    let ints = |item: &Item, what: &str| -> Result<Vec<i64>> {
        graph
            .tuple_items(item)
            .and_then(|items| {
                items
                    .iter()
                    .map(|x| match x {
                        Item::Int(i) => Some(*i),
                        _ => None,
                    })
                    .collect::<Option<Vec<i64>>>()
            })
            .ok_or_else(|| at.bad_args(c, format!("{what} must be a tuple of ints")))
    };
    let size = ints(&args[2], "size")?;
    let stride = ints(&args[3], "stride")?;
    let Item::Bool(requires_grad) = args[4] else {
        return Err(at.bad_args(c, "requires_grad must be a bool"));
    };
    if !graph.is_empty_dict(&args[5]) {
        return Err(at.bad_args(c, "backward hooks must be an empty OrderedDict"));
    }
    let dtype = if v3 {
        match &args[6] {
            Item::Global(g) if g.0 == "torch" => {
                DType::from_name(&g.1).ok_or_else(|| Error::UnknownDType {
                    file: at.file.to_string(),
                    name: format!("torch.{}", g.1),
                })?
            }
            other => {
                return Err(at.bad_args(
                    c,
                    format!("the dtype must be a torch dtype, not {}", describe(other)),
                ));
            }
        }
    } else {
        storage.dtype
    };
    if let Some(metadata) = args.get(fixed)
        && !matches!(metadata, Item::None)
        && !graph.is_empty_dict(metadata)
    {
        return Err(at.bad_args(
            c,
            "tensor metadata (conj / neg bits, torch.utils metadata) is not supported",
        ));
    }
    if size.len() != stride.len() {
        return Err(at.bad_args(
            c,
            format!("{} sizes but {} strides", size.len(), stride.len()),
        ));
    }
    let es = dtype.element_size() as u64;
    let available = storage.storage.bytes.len() as u64 / es;
    let extent = view_extent(offset, &size, &stride).ok_or_else(|| {
        at.bad_args(
            c,
            format!(
                "negative or overflowing view (offset {offset}, size {size:?}, stride {stride:?})"
            ),
        )
    })?;
    if let Some(needed) = extent
        && needed > available
    {
        return Err(Error::StorageOutOfBounds {
            file: at.file.to_string(),
            key: storage.key.clone(),
            view: format!("a {dtype} tensor (offset {offset}, size {size:?}, stride {stride:?})"),
            needed,
            available,
        });
    }
    Ok(Tensor {
        dtype,
        storage: storage.storage.clone(),
        storage_offset: offset,
        size,
        stride,
        requires_grad,
        parameter: false,
    })
}

/// Wraps a loaded storage for the stack.
pub(crate) fn storage_item(storage: Arc<Storage>, pid: &PersistentId) -> Item {
    Item::Storage(Rc::new(StorageRef {
        storage,
        dtype: pid.storage_type.dtype(),
        key: pid.key.clone(),
    }))
}
