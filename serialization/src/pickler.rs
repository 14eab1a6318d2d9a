//! The pickle writer: a [`Value`] tree as CPython's `pickle.Pickler(protocol=2)` writes the
//! objects it stands for inside `torch.save` — the same opcodes, memo puts and batching, so
//! that simple checkpoints come out byte-identical to torch's. Python memoizes by identity,
//! which a tree cannot know; this writer memoizes what Python shares in practice: strings
//! and globals by value, a tensor seen twice, enum members.

use std::collections::HashMap;
use std::sync::Arc;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::globals::{
    BUILTINS_BYTES, CODECS_ENCODE, ENUM_CLASSES, ORDERED_DICT, REBUILD_PARAMETER,
    REBUILD_TENSOR_V2, REBUILD_TENSOR_V3, UNTYPED_STORAGE, python2_module,
};
use crate::opcodes::*;
use crate::value::{Object, ObjectKind, Storage, Tensor, Value};

/// Python's `Pickler._BATCHSIZE`.
const BATCHSIZE: usize = 1000;

/// How deeply a value may nest, read or written (checkpoints nest a handful of levels).
pub(crate) const MAX_DEPTH: usize = 256;

/// A storage to write as `data/<key>` (keys are `0, 1, ...` in the order they are met).
pub(crate) struct StorageRecord {
    pub storage: Arc<Storage>,
    pub dtype: DType,
}

/// The pickle bytes and the storages they reference, in key order.
pub(crate) struct Pickled {
    pub data: Vec<u8>,
    pub storages: Vec<StorageRecord>,
}

/// Pickles `value` with protocol 2. With `allow_tensors` false a tensor is an error (a bare
/// pickle has nowhere to put storages).
pub(crate) fn pickle(value: &Value, allow_tensors: bool) -> Result<Pickled> {
    let mut p = Pickler {
        out: vec![PROTO, 2],
        memo_len: 0,
        strings: HashMap::new(),
        globals: HashMap::new(),
        tensors: HashMap::new(),
        enums: Vec::new(),
        storage_keys: HashMap::new(),
        storages: Vec::new(),
        allow_tensors,
        fresh_strings: false,
    };
    p.save(value, 0)?;
    p.out.push(STOP);
    Ok(Pickled {
        data: p.out,
        storages: p.storages,
    })
}

/// A tensor's identity for the memo: its storage and view.
#[derive(PartialEq, Eq, Hash)]
struct TensorKey {
    storage: usize,
    dtype: DType,
    offset: i64,
    size: Vec<i64>,
    stride: Vec<i64>,
    requires_grad: bool,
    parameter: bool,
}

struct Pickler<'a> {
    out: Vec<u8>,
    memo_len: u32,
    strings: HashMap<String, u32>,
    globals: HashMap<(String, String), u32>,
    tensors: HashMap<TensorKey, u32>,
    enums: Vec<(&'a Object, u32)>,
    /// Storage pointer -> index into `storages`.
    storage_keys: HashMap<usize, usize>,
    storages: Vec<StorageRecord>,
    allow_tensors: bool,
    /// Write strings without sharing them through the memo (set while saving the arguments
    /// of an object that Python builds them afresh for).
    fresh_strings: bool,
}

impl<'a> Pickler<'a> {
    fn memoize(&mut self) -> u32 {
        let index = self.memo_len;
        if index < 256 {
            self.out.extend([BINPUT, index as u8]);
        } else {
            self.out.push(LONG_BINPUT);
            self.out.extend(index.to_le_bytes());
        }
        self.memo_len += 1;
        index
    }

    fn get(&mut self, index: u32) {
        if index < 256 {
            self.out.extend([BINGET, index as u8]);
        } else {
            self.out.push(LONG_BINGET);
            self.out.extend(index.to_le_bytes());
        }
    }

    fn save(&mut self, value: &'a Value, depth: usize) -> Result<()> {
        if depth > MAX_DEPTH {
            return Err(Error::Unwritable {
                problem: format!("values nest deeper than {MAX_DEPTH} levels"),
            });
        }
        match value {
            Value::None => self.out.push(NONE),
            Value::Bool(b) => self.out.push(if *b { NEWTRUE } else { NEWFALSE }),
            Value::Int(i) => self.save_int(*i),
            Value::BigInt(bytes) => {
                let mut minimal = bytes.clone();
                minimal_twos_complement(&mut minimal);
                match decode_long_i64(&minimal) {
                    Some(i) => self.save_int(i),
                    None => self.save_long_bytes(&minimal)?,
                }
            }
            Value::Float(f) => {
                self.out.push(BINFLOAT);
                self.out.extend(f.to_be_bytes());
            }
            Value::Str(s) => self.save_str(s, true)?,
            Value::Bytes(b) => self.save_bytes(b)?,
            Value::Tuple(items) => self.save_tuple(items, depth)?,
            // _pickle.c `batch_list_exact`: one item is an APPEND; otherwise every batch,
            // a last one of one item too, is MARK ... APPENDS.
            Value::List(items) => {
                self.out.push(EMPTY_LIST);
                self.memoize();
                if let [one] = items.as_slice() {
                    self.save(one, depth + 1)?;
                    self.out.push(APPEND);
                } else {
                    for chunk in items.chunks(BATCHSIZE) {
                        self.out.push(MARK);
                        for item in chunk {
                            self.save(item, depth + 1)?;
                        }
                        self.out.push(APPENDS);
                    }
                }
            }
            // _pickle.c `batch_dict_exact`: one item is a SETITEM; otherwise batches of
            // MARK ... SETITEMS, and a size that is a multiple of the batch size ends with
            // an empty one (its loop stops only on a short batch).
            Value::Dict(items) => {
                self.out.push(EMPTY_DICT);
                self.memoize();
                if let [(k, v)] = items.as_slice() {
                    self.save(k, depth + 1)?;
                    self.save(v, depth + 1)?;
                    self.out.push(SETITEM);
                } else if !items.is_empty() {
                    for chunk in items.chunks(BATCHSIZE) {
                        self.out.push(MARK);
                        for (k, v) in chunk {
                            self.save(k, depth + 1)?;
                            self.save(v, depth + 1)?;
                        }
                        self.out.push(SETITEMS);
                    }
                    if items.len() % BATCHSIZE == 0 {
                        self.out.extend([MARK, SETITEMS]);
                    }
                }
            }
            // An OrderedDict is reduced: `OrderedDict()` then its items through _pickle.c's
            // iterator `batch_dict`, where any batch of one item is a SETITEM.
            Value::OrderedDict(items) => {
                self.save_global(ORDERED_DICT.0, ORDERED_DICT.1);
                self.out.extend([EMPTY_TUPLE, REDUCE]);
                self.memoize();
                self.save_setitems(items, depth)?;
            }
            Value::Tensor(t) => self.save_tensor(t)?,
            Value::Global { module, name } => self.save_global(module, name),
            Value::Object(o) => self.save_object(o, depth)?,
        }
        Ok(())
    }

    /// `save_long`: the shortest of `BININT1` / `BININT2` / `BININT` / `LONG1`.
    fn save_int(&mut self, i: i64) {
        if (0..=0xff).contains(&i) {
            self.out.extend([BININT1, i as u8]);
        } else if (0..=0xffff).contains(&i) {
            self.out.push(BININT2);
            self.out.extend((i as u16).to_le_bytes());
        } else if (i32::MIN as i64..=i32::MAX as i64).contains(&i) {
            self.out.push(BININT);
            self.out.extend((i as i32).to_le_bytes());
        } else {
            let bytes = encode_long(i);
            self.out.extend([LONG1, bytes.len() as u8]);
            self.out.extend(bytes);
        }
    }

    fn save_long_bytes(&mut self, bytes: &[u8]) -> Result<()> {
        if bytes.len() < 256 {
            self.out.extend([LONG1, bytes.len() as u8]);
        } else {
            let n = i32::try_from(bytes.len()).map_err(|_| Error::Unwritable {
                problem: "an int too large for LONG4".into(),
            })?;
            self.out.push(LONG4);
            self.out.extend(n.to_le_bytes());
        }
        self.out.extend(bytes);
        Ok(())
    }

    /// `save_str`: `BINUNICODE` and a memo put, or a memo get of an equal string written
    /// before when `shared` (Python's interned literals are one object).
    fn save_str(&mut self, s: &str, shared: bool) -> Result<()> {
        let shared = shared && !self.fresh_strings;
        if shared && let Some(&index) = self.strings.get(s) {
            self.get(index);
            return Ok(());
        }
        let n = u32::try_from(s.len()).map_err(|_| Error::Unwritable {
            problem: "a str of 4 GiB or more does not fit protocol 2".into(),
        })?;
        self.out.push(BINUNICODE);
        self.out.extend(n.to_le_bytes());
        self.out.extend(s.as_bytes());
        let index = self.memoize();
        if shared {
            self.strings.insert(s.to_string(), index);
        }
        Ok(())
    }

    /// Protocol 2 has no bytes opcode: Python writes `_codecs.encode(text, 'latin1')`, or
    /// `bytes()` for `b""`.
    fn save_bytes(&mut self, b: &[u8]) -> Result<()> {
        if b.is_empty() {
            self.save_global(BUILTINS_BYTES.0, BUILTINS_BYTES.1);
            self.out.extend([EMPTY_TUPLE, REDUCE]);
            self.memoize();
            return Ok(());
        }
        self.save_global(CODECS_ENCODE.0, CODECS_ENCODE.1);
        let text: String = b.iter().map(|&c| c as char).collect();
        // CPython caches one-character strings; longer ones are new objects.
        self.save_str(&text, text.chars().count() <= 1)?;
        self.save_str("latin1", true)?;
        self.out.push(TUPLE2);
        self.memoize();
        self.out.push(REDUCE);
        self.memoize();
        Ok(())
    }

    /// `save_tuple`: `EMPTY_TUPLE`, `TUPLE1`-`TUPLE3` or `MARK ... TUPLE`, then a memo put.
    fn save_tuple(&mut self, items: &'a [Value], depth: usize) -> Result<()> {
        if items.is_empty() {
            self.out.push(EMPTY_TUPLE);
            return Ok(());
        }
        if items.len() > 3 {
            self.out.push(MARK);
        }
        for item in items {
            self.save(item, depth + 1)?;
        }
        self.out.push(match items.len() {
            1 => TUPLE1,
            2 => TUPLE2,
            3 => TUPLE3,
            _ => TUPLE,
        });
        self.memoize();
        Ok(())
    }

    fn save_setitems(&mut self, items: &'a [(Value, Value)], depth: usize) -> Result<()> {
        for chunk in items.chunks(BATCHSIZE) {
            if let [(k, v)] = chunk {
                self.save(k, depth + 1)?;
                self.save(v, depth + 1)?;
                self.out.push(SETITEM);
            } else {
                self.out.push(MARK);
                for (k, v) in chunk {
                    self.save(k, depth + 1)?;
                    self.save(v, depth + 1)?;
                }
                self.out.push(SETITEMS);
            }
        }
        Ok(())
    }

    /// `save_global`: `GLOBAL module\nname\n` (Python 2 module names) and a memo put.
    fn save_global(&mut self, module: &str, name: &str) {
        let key = (module.to_string(), name.to_string());
        if let Some(&index) = self.globals.get(&key) {
            self.get(index);
            return;
        }
        self.out.push(GLOBAL);
        self.out.extend(python2_module(module).as_bytes());
        self.out.push(b'\n');
        self.out.extend(name.as_bytes());
        self.out.push(b'\n');
        let index = self.memoize();
        self.globals.insert(key, index);
    }

    fn save_object(&mut self, o: &'a Object, depth: usize) -> Result<()> {
        let singleton = o.kind == ObjectKind::Reduce
            && o.state.is_none()
            && ENUM_CLASSES.contains(&o.class().as_str());
        if singleton && let Some(&(_, index)) = self.enums.iter().find(|(e, _)| *e == o) {
            self.get(index);
            return Ok(());
        }
        for part in [&o.module, &o.name] {
            if part.is_empty() || part.contains('\n') {
                return Err(Error::Unwritable {
                    problem: format!("an object class {:?} cannot be a global", o.class()),
                });
            }
        }
        self.save_global(&o.module, &o.name);
        // `torch.device.__reduce__` builds its type string anew each time: never shared.
        let fresh = o.module == "torch" && o.name == "device";
        self.fresh_strings = fresh;
        let saved = self.save_tuple(&o.args, depth);
        self.fresh_strings = false;
        saved?;
        self.out.push(match o.kind {
            ObjectKind::Reduce => REDUCE,
            ObjectKind::NewObj => NEWOBJ,
        });
        let index = self.memoize();
        if singleton {
            self.enums.push((o, index));
        }
        if let Some(state) = &o.state {
            self.save(state, depth + 1)?;
            self.out.push(BUILD);
        }
        Ok(())
    }

    /// torch's `Tensor.__reduce_ex__`: `_rebuild_tensor_v2(storage, offset, size, stride,
    /// requires_grad, OrderedDict())` (v3 with a dtype for the dtypes without a legacy storage
    /// class), wrapped in `_rebuild_parameter` for parameters.
    fn save_tensor(&mut self, t: &'a Tensor) -> Result<()> {
        if !self.allow_tensors {
            return Err(Error::Unwritable {
                problem: "a bare pickle cannot hold tensors (their storages need a zip \
                          checkpoint: use save)"
                    .into(),
            });
        }
        let key = TensorKey {
            storage: Arc::as_ptr(&t.storage) as usize,
            dtype: t.dtype,
            offset: t.storage_offset,
            size: t.size.clone(),
            stride: t.stride.clone(),
            requires_grad: t.requires_grad,
            parameter: t.parameter,
        };
        if let Some(&index) = self.tensors.get(&key) {
            self.get(index);
            return Ok(());
        }
        // The view must lie inside its storage (torch.load would refuse it otherwise).
        t.check_view()?;
        if t.size.len() != t.stride.len() {
            return Err(Error::Unwritable {
                problem: format!(
                    "a tensor with {} sizes and {} strides",
                    t.size.len(),
                    t.stride.len()
                ),
            });
        }
        if t.parameter {
            // Parameter.__reduce_ex__: (_rebuild_parameter, (self.data, requires_grad,
            // OrderedDict())); `self.data` is a new tensor object without grad.
            self.save_global(REBUILD_PARAMETER.0, REBUILD_PARAMETER.1);
            self.save_plain_tensor(t, false)?;
            self.memoize();
            self.out
                .push(if t.requires_grad { NEWTRUE } else { NEWFALSE });
            self.save_global(ORDERED_DICT.0, ORDERED_DICT.1);
            self.out.extend([EMPTY_TUPLE, REDUCE]);
            self.memoize();
            self.out.push(TUPLE3);
            self.memoize();
            self.out.push(REDUCE);
        } else {
            self.save_plain_tensor(t, t.requires_grad)?;
        }
        let index = self.memoize();
        self.tensors.insert(key, index);
        Ok(())
    }

    /// Writes `_rebuild_tensor_v2/v3(...)` up to and including its `REDUCE` (no memo put of
    /// the result).
    fn save_plain_tensor(&mut self, t: &'a Tensor, requires_grad: bool) -> Result<()> {
        let legacy = t.dtype.legacy_storage_name();
        let rebuild = if legacy.is_some() {
            REBUILD_TENSOR_V2
        } else {
            REBUILD_TENSOR_V3
        };
        self.save_global(rebuild.0, rebuild.1);
        self.out.push(MARK);
        // The persistent id ('storage', type, key, location, numel), then BINPERSID.
        let ptr = Arc::as_ptr(&t.storage) as usize;
        let index = match self.storage_keys.get(&ptr) {
            Some(&i) => {
                if self.storages[i].dtype != t.dtype {
                    return Err(Error::Unwritable {
                        problem: format!(
                            "Cannot save multiple tensors or storages that view the same data \
                             as different types ({} and {})",
                            self.storages[i].dtype, t.dtype
                        ),
                    });
                }
                i
            }
            None => {
                let es = t.dtype.element_size();
                if !t.storage.bytes.len().is_multiple_of(es) {
                    return Err(Error::Unwritable {
                        problem: format!(
                            "a {} storage of {} bytes is not a whole number of elements",
                            t.dtype,
                            t.storage.bytes.len()
                        ),
                    });
                }
                self.storages.push(StorageRecord {
                    storage: t.storage.clone(),
                    dtype: t.dtype,
                });
                self.storage_keys.insert(ptr, self.storages.len() - 1);
                self.storages.len() - 1
            }
        };
        self.out.push(MARK);
        self.save_str("storage", true)?;
        let numel = match legacy {
            Some(name) => {
                self.save_global("torch", name);
                t.storage.bytes.len() / t.dtype.element_size()
            }
            None => {
                self.save_global(UNTYPED_STORAGE.0, UNTYPED_STORAGE.1);
                t.storage.bytes.len()
            }
        };
        self.save_str(&index.to_string(), true)?;
        // torch's location tags: "cpu" is one interned string, "cuda:0" a new one each time.
        let device = &t.storage.device;
        self.save_str(device, device == "cpu")?;
        self.save_int(numel as i64);
        self.out.push(TUPLE);
        self.memoize();
        self.out.push(BINPERSID);
        self.save_int(t.storage_offset);
        self.save_int_tuple(&t.size);
        self.save_int_tuple(&t.stride);
        self.out
            .push(if requires_grad { NEWTRUE } else { NEWFALSE });
        self.save_global(ORDERED_DICT.0, ORDERED_DICT.1);
        self.out.extend([EMPTY_TUPLE, REDUCE]);
        self.memoize();
        if legacy.is_none() {
            self.save_global("torch", t.dtype.name());
        }
        self.out.push(TUPLE);
        self.memoize();
        self.out.push(REDUCE);
        Ok(())
    }

    /// `save_tuple` of ints (a tensor's size or stride).
    fn save_int_tuple(&mut self, items: &[i64]) {
        if items.is_empty() {
            self.out.push(EMPTY_TUPLE);
            return;
        }
        if items.len() > 3 {
            self.out.push(MARK);
        }
        for &i in items {
            self.save_int(i);
        }
        self.out.push(match items.len() {
            1 => TUPLE1,
            2 => TUPLE2,
            3 => TUPLE3,
            _ => TUPLE,
        });
        self.memoize();
    }
}
