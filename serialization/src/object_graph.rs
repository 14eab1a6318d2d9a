//! The unpickler's working memory: the values on its stack and in its memo, and the mutable
//! containers they point at (kept in an arena, so that a memo `GET` sees later `APPEND`s, as
//! Python's shared references do). At `STOP` the graph is copied out into a [`Value`] tree
//! under a depth limit (which also stops cycles) and a size budget (which stops a few bytes
//! of memo references from expanding exponentially).

use std::collections::HashSet;
use std::rc::Rc;
use std::sync::Arc;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::value::{Object, ObjectKind, Storage, Tensor, Value};

/// A value on the unpickler's stack or in its memo. Cheap to clone: text and containers are
/// shared.
#[derive(Debug, Clone)]
pub(crate) enum Item {
    None,
    Bool(bool),
    Int(i64),
    BigInt(Rc<[u8]>),
    Float(f64),
    Str(Rc<str>),
    Bytes(Rc<[u8]>),
    /// An allow-listed global: (module, name).
    Global(Rc<(String, String)>),
    /// A container or object in the arena.
    Node(usize),
    Tensor(Rc<Tensor>),
    /// What `BINPERSID` gives: a storage, before a rebuild function wraps it in a tensor.
    Storage(Rc<StorageRef>),
}

/// A loaded storage with the dtype its persistent id named (`uint8` for an `UntypedStorage`).
#[derive(Debug)]
pub(crate) struct StorageRef {
    pub storage: Arc<Storage>,
    pub dtype: DType,
    pub key: String,
}

/// A mutable container or object.
#[derive(Debug)]
pub(crate) enum Node {
    List(Vec<Item>),
    Tuple(Vec<Item>),
    Dict {
        ordered: bool,
        items: Vec<(Item, Item)>,
        keys: HashSet<KeyRepr>,
    },
    Object {
        module: String,
        name: String,
        kind: ObjectKind,
        args: Vec<Item>,
        state: Option<Item>,
    },
}

/// A dict key as Python hashes it: `True == 1 == 1.0`; tuples by their items.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum KeyRepr {
    None,
    Int(i64),
    Big(Rc<[u8]>),
    Float(u64),
    Str(Rc<str>),
    Bytes(Rc<[u8]>),
    Tuple(Vec<KeyRepr>),
    Global(Rc<(String, String)>),
}

/// Limits for copying the graph out.
pub(crate) struct Limits<'a> {
    pub file: &'a str,
    pub max_depth: usize,
    /// Units left: one per value plus one per byte of text.
    pub budget: u64,
    pub budget_limit: u64,
    /// Where `STOP` is, for errors about values that cannot be represented.
    pub offset: usize,
}

#[derive(Debug, Default)]
pub(crate) struct Graph {
    nodes: Vec<Node>,
}

impl Graph {
    pub fn add(&mut self, node: Node) -> Item {
        self.nodes.push(node);
        Item::Node(self.nodes.len() - 1)
    }

    pub fn node(&self, item: &Item) -> Option<&Node> {
        match item {
            Item::Node(i) => self.nodes.get(*i),
            _ => None,
        }
    }

    pub fn node_mut(&mut self, item: &Item) -> Option<&mut Node> {
        match item {
            Item::Node(i) => self.nodes.get_mut(*i),
            _ => None,
        }
    }

    /// The items of a tuple node.
    pub fn tuple_items(&self, item: &Item) -> Option<&[Item]> {
        match self.node(item) {
            Some(Node::Tuple(items)) => Some(items),
            _ => None,
        }
    }

    /// Whether `item` is an empty `dict` / `OrderedDict` (backward hooks, tensor metadata).
    pub fn is_empty_dict(&self, item: &Item) -> bool {
        matches!(self.node(item), Some(Node::Dict { items, .. }) if items.is_empty())
    }

    /// Inserts `key: value` into the dict node `target`. A duplicate key (which no pickler
    /// writes) or an unhashable one is an error.
    pub fn set_item(&mut self, target: &Item, key: Item, value: Item) -> Result<(), String> {
        let repr = self.key_repr(&key, 0)?;
        match self.node_mut(target) {
            Some(Node::Dict { items, keys, .. }) => {
                // Keys hashed by identity (tensors, objects) are not compared: a tree cannot
                // tell two equal tensors from one tensor twice.
                if let Some(repr) = repr
                    && !keys.insert(repr)
                {
                    return Err(format!("duplicate dict key {}", describe(&key)));
                }
                items.push((key, value));
                Ok(())
            }
            _ => Err(format!(
                "can only set items of a dict or OrderedDict, not {}",
                self.describe(target)
            )),
        }
    }

    /// The key as Python hashes it; `None` for keys hashed by identity.
    fn key_repr(&self, key: &Item, depth: usize) -> Result<Option<KeyRepr>, String> {
        Ok(Some(match key {
            Item::None => KeyRepr::None,
            Item::Bool(b) => KeyRepr::Int(*b as i64),
            Item::Int(i) => KeyRepr::Int(*i),
            Item::BigInt(b) => KeyRepr::Big(b.clone()),
            Item::Float(f) if f.fract() == 0.0 && f.abs() < 9.2e18 => KeyRepr::Int(*f as i64),
            Item::Float(f) => KeyRepr::Float(f.to_bits()),
            Item::Str(s) => KeyRepr::Str(s.clone()),
            Item::Bytes(b) => KeyRepr::Bytes(b.clone()),
            Item::Global(g) => KeyRepr::Global(g.clone()),
            Item::Tensor(_) | Item::Storage(_) => return Ok(None),
            Item::Node(i) => match &self.nodes[*i] {
                Node::Tuple(items) if depth < 64 => {
                    let mut parts = Vec::with_capacity(items.len());
                    for k in items {
                        match self.key_repr(k, depth + 1)? {
                            Some(part) => parts.push(part),
                            None => return Ok(None),
                        }
                    }
                    KeyRepr::Tuple(parts)
                }
                Node::Tuple(_) => return Err("a dict key nests tuples too deeply".into()),
                Node::Object { .. } => return Ok(None),
                Node::List(_) | Node::Dict { .. } => {
                    return Err(format!("unhashable dict key {}", self.describe(key)));
                }
            },
        }))
    }

    /// A short name of what `item` is, for errors.
    pub fn describe(&self, item: &Item) -> String {
        match self.node(item) {
            Some(Node::List(_)) => "a list".into(),
            Some(Node::Tuple(_)) => "a tuple".into(),
            Some(Node::Dict { ordered: true, .. }) => "an OrderedDict".into(),
            Some(Node::Dict { .. }) => "a dict".into(),
            Some(Node::Object { module, name, .. }) => format!("a {module}.{name} object"),
            None => describe(item),
        }
    }

    /// Copies `item` out into a [`Value`] tree.
    pub fn materialize(&self, item: &Item, limits: &mut Limits<'_>) -> Result<Value> {
        self.materialize_at(item, 0, limits)
    }

    fn charge(limits: &mut Limits<'_>, units: u64) -> Result<()> {
        limits.budget = limits
            .budget
            .checked_sub(units)
            .ok_or_else(|| Error::TooLarge {
                file: limits.file.to_string(),
                limit: limits.budget_limit,
            })?;
        Ok(())
    }

    fn materialize_at(&self, item: &Item, depth: usize, limits: &mut Limits<'_>) -> Result<Value> {
        Self::charge(limits, 1)?;
        Ok(match item {
            Item::None => Value::None,
            Item::Bool(b) => Value::Bool(*b),
            Item::Int(i) => Value::Int(*i),
            Item::BigInt(b) => {
                Self::charge(limits, b.len() as u64)?;
                Value::BigInt(b.to_vec())
            }
            Item::Float(f) => Value::Float(*f),
            Item::Str(s) => {
                Self::charge(limits, s.len() as u64)?;
                Value::Str(s.to_string())
            }
            Item::Bytes(b) => {
                Self::charge(limits, b.len() as u64)?;
                Value::Bytes(b.to_vec())
            }
            Item::Global(g) => Value::Global {
                module: g.0.clone(),
                name: g.1.clone(),
            },
            Item::Tensor(t) => {
                Self::charge(limits, t.size.len() as u64)?;
                Value::Tensor((**t).clone())
            }
            Item::Storage(s) => {
                return Err(Error::BadOperand {
                    file: limits.file.to_string(),
                    offset: limits.offset,
                    opcode: "STOP",
                    problem: format!(
                        "storage `{}` is used outside a tensor (a bare storage is not supported)",
                        s.key
                    ),
                });
            }
            Item::Node(i) => {
                if depth >= limits.max_depth {
                    return Err(Error::TooDeep {
                        file: limits.file.to_string(),
                        limit: limits.max_depth,
                    });
                }
                let seq = |items: &[Item], limits: &mut Limits<'_>| {
                    items
                        .iter()
                        .map(|x| self.materialize_at(x, depth + 1, limits))
                        .collect::<Result<Vec<_>>>()
                };
                match &self.nodes[*i] {
                    Node::List(items) => Value::List(seq(items, limits)?),
                    Node::Tuple(items) => Value::Tuple(seq(items, limits)?),
                    Node::Dict { ordered, items, .. } => {
                        let mut out = Vec::with_capacity(items.len());
                        for (k, v) in items {
                            out.push((
                                self.materialize_at(k, depth + 1, limits)?,
                                self.materialize_at(v, depth + 1, limits)?,
                            ));
                        }
                        if *ordered {
                            Value::OrderedDict(out)
                        } else {
                            Value::Dict(out)
                        }
                    }
                    Node::Object {
                        module,
                        name,
                        kind,
                        args,
                        state,
                    } => Value::Object(Object {
                        module: module.clone(),
                        name: name.clone(),
                        kind: *kind,
                        args: seq(args, limits)?,
                        state: match state {
                            Some(s) => Some(Box::new(self.materialize_at(s, depth + 1, limits)?)),
                            None => None,
                        },
                    }),
                }
            }
        })
    }
}

/// A short name of a non-container item, for errors.
pub(crate) fn describe(item: &Item) -> String {
    match item {
        Item::None => "None".into(),
        Item::Bool(b) => format!("{b}"),
        Item::Int(i) => format!("int {i}"),
        Item::BigInt(_) => "a big int".into(),
        Item::Float(f) => format!("float {f}"),
        Item::Str(s) if s.len() <= 40 => format!("str {s:?}"),
        Item::Str(_) => "a str".into(),
        Item::Bytes(_) => "bytes".into(),
        Item::Global(g) => format!("global {}.{}", g.0, g.1),
        Item::Node(_) => "a container".into(),
        Item::Tensor(_) => "a tensor".into(),
        Item::Storage(s) => format!("storage `{}`", s.key),
    }
}
