//! The restricted unpickler (torch's `_weights_only_unpickler.Unpickler`): runs a pickle's
//! opcodes over a stack, a memo and an object graph, resolving `GLOBAL`s only against the
//! allow-list and never importing or calling anything. Binary opcodes of protocols 1-5 are
//! read, plus protocol 0's numeric and memo opcodes; `INST`, `OBJ`, `EXT*`, text `PERSID`,
//! escaped `STRING` and out-of-band buffers are refused. Every bound (lengths, memo indices,
//! the stack, nesting, expansion) is an [`Error`], never a panic.

use std::collections::HashMap;
use std::rc::Rc;

use crate::error::{Error, Result};
use crate::globals::python3_module;
use crate::object_graph::{Graph, Item, Limits, Node, describe};
use crate::opcodes::*;
use crate::pickle_input::{PickleInput, long_item, raw_unicode_escape};
use crate::rebuild::{At, StorageSource, call, persistent_id, storage_item};
use crate::serialization::LoadOptions;
use crate::value::{ObjectKind, Value};

/// Runs the pickle `data` (named `file` in errors), loading storages from `storages`.
pub(crate) fn unpickle(
    data: &[u8],
    file: &str,
    options: &LoadOptions,
    storages: &mut dyn StorageSource,
) -> Result<Value> {
    let mut u = Unpickler {
        input: PickleInput::new(data, file),
        options,
        storages,
        stack: Vec::new(),
        metastack: Vec::new(),
        memo: HashMap::new(),
        graph: Graph::default(),
    };
    u.run()
}

struct Unpickler<'a> {
    input: PickleInput<'a>,
    options: &'a LoadOptions,
    storages: &'a mut dyn StorageSource,
    stack: Vec<Item>,
    metastack: Vec<Vec<Item>>,
    memo: HashMap<u64, Item>,
    graph: Graph,
}

impl<'a> Unpickler<'a> {
    fn run(&mut self) -> Result<Value> {
        loop {
            let opcode = self.input.opcode()?;
            if opcode == STOP {
                let top = self.pop("STOP")?;
                // A value may expand by sharing; 64 units per input byte is far beyond any real
                // checkpoint (each value costs one unit, each byte of text one).
                let limit = (self.input.len() as u64).saturating_mul(64).max(1 << 20);
                let mut limits = Limits {
                    file: self.input.file,
                    max_depth: self.options.max_depth,
                    budget: limit,
                    budget_limit: limit,
                    offset: self.input.op,
                };
                return self.graph.materialize(&top, &mut limits);
            }
            self.step(opcode)?;
        }
    }

    fn step(&mut self, opcode: u8) -> Result<()> {
        match opcode {
            PROTO => {
                let p = self.input.take(1, "PROTO")?[0];
                if p > HIGHEST_PROTOCOL {
                    return Err(self.bad("PROTO", format!("unsupported pickle protocol {p}")));
                }
            }
            FRAME => {
                let n = self.input.u64_le("FRAME")?;
                self.input.check_len(n, "FRAME")?;
            }
            MARK => {
                let stack = std::mem::take(&mut self.stack);
                self.metastack.push(stack);
            }
            POP => {
                if self.stack.pop().is_none() {
                    self.pop_mark("POP")?;
                }
            }
            POP_MARK => {
                self.pop_mark("POP_MARK")?;
            }
            DUP => {
                let top = self.top("DUP")?.clone();
                self.stack.push(top);
            }
            NONE => self.stack.push(Item::None),
            NEWTRUE => self.stack.push(Item::Bool(true)),
            NEWFALSE => self.stack.push(Item::Bool(false)),
            BININT => {
                let b = self.input.take(4, "BININT")?;
                self.stack.push(Item::Int(
                    i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64
                ));
            }
            BININT1 => {
                let b = self.input.take(1, "BININT1")?[0];
                self.stack.push(Item::Int(b as i64));
            }
            BININT2 => {
                let b = self.input.take(2, "BININT2")?;
                self.stack
                    .push(Item::Int(u16::from_le_bytes([b[0], b[1]]) as i64));
            }
            LONG1 => {
                let n = self.input.take(1, "LONG1")?[0] as u64;
                let bytes = self.input.take_len(n, "LONG1")?;
                let item = long_item(bytes);
                self.stack.push(item);
            }
            LONG4 => {
                let n = self.input.i32_le("LONG4")?;
                if n < 0 {
                    return Err(self.bad("LONG4", "negative byte count".into()));
                }
                let bytes = self.input.take_len(n as u64, "LONG4")?;
                let item = long_item(bytes);
                self.stack.push(item);
            }
            INT => {
                let line = self.input.line_str("INT")?;
                let item = match line.as_str() {
                    "00" => Item::Bool(false),
                    "01" => Item::Bool(true),
                    text => self.input.decimal(text, "INT")?,
                };
                self.stack.push(item);
            }
            LONG => {
                let line = self.input.line_str("LONG")?;
                let text = line.strip_suffix('L').unwrap_or(&line).to_string();
                let item = self.input.decimal(&text, "LONG")?;
                self.stack.push(item);
            }
            FLOAT => {
                let line = self.input.line_str("FLOAT")?;
                let f = line
                    .trim()
                    .parse::<f64>()
                    .map_err(|_| self.bad("FLOAT", format!("not a float: {line:?}")))?;
                self.stack.push(Item::Float(f));
            }
            BINFLOAT => {
                let b = self.input.take(8, "BINFLOAT")?;
                let mut be = [0u8; 8];
                be.copy_from_slice(b);
                self.stack.push(Item::Float(f64::from_be_bytes(be)));
            }
            BINUNICODE => {
                let n = self.input.u32_le("BINUNICODE")? as u64;
                self.push_str(n, "BINUNICODE")?;
            }
            SHORT_BINUNICODE => {
                let n = self.input.take(1, "SHORT_BINUNICODE")?[0] as u64;
                self.push_str(n, "SHORT_BINUNICODE")?;
            }
            BINUNICODE8 => {
                let n = self.input.u64_le("BINUNICODE8")?;
                self.push_str(n, "BINUNICODE8")?;
            }
            // Python 2 `str`: torch.load decodes it as UTF-8.
            SHORT_BINSTRING => {
                let n = self.input.take(1, "SHORT_BINSTRING")?[0] as u64;
                self.push_str(n, "SHORT_BINSTRING")?;
            }
            BINSTRING => {
                let n = self.input.i32_le("BINSTRING")?;
                if n < 0 {
                    return Err(self.bad("BINSTRING", "negative length".into()));
                }
                self.push_str(n as u64, "BINSTRING")?;
            }
            UNICODE => {
                let line = self.input.line("UNICODE")?;
                let text = raw_unicode_escape(line)
                    .ok_or_else(|| self.bad("UNICODE", "bad raw-unicode-escape text".into()))?;
                self.stack.push(Item::Str(text.into()));
            }
            BINBYTES => {
                let n = self.input.u32_le("BINBYTES")? as u64;
                let b = self.input.take_len(n, "BINBYTES")?;
                self.stack.push(Item::Bytes(b.into()));
            }
            SHORT_BINBYTES => {
                let n = self.input.take(1, "SHORT_BINBYTES")?[0] as u64;
                let b = self.input.take_len(n, "SHORT_BINBYTES")?;
                self.stack.push(Item::Bytes(b.into()));
            }
            BINBYTES8 => {
                let n = self.input.u64_le("BINBYTES8")?;
                let b = self.input.take_len(n, "BINBYTES8")?;
                self.stack.push(Item::Bytes(b.into()));
            }
            BYTEARRAY8 => {
                let n = self.input.u64_le("BYTEARRAY8")?;
                let b: Rc<[u8]> = self.input.take_len(n, "BYTEARRAY8")?.into();
                let item = self.object("builtins", "bytearray", vec![Item::Bytes(b)]);
                self.stack.push(item);
            }
            EMPTY_TUPLE => {
                let t = self.graph.add(Node::Tuple(Vec::new()));
                self.stack.push(t);
            }
            TUPLE => {
                let items = self.pop_mark("TUPLE")?;
                let t = self.graph.add(Node::Tuple(items));
                self.stack.push(t);
            }
            TUPLE1 | TUPLE2 | TUPLE3 => {
                let n = (opcode - TUPLE1 + 1) as usize;
                let name = ["TUPLE1", "TUPLE2", "TUPLE3"][n - 1];
                if self.stack.len() < n {
                    return Err(self.underflow(name));
                }
                let items = self.stack.split_off(self.stack.len() - n);
                let t = self.graph.add(Node::Tuple(items));
                self.stack.push(t);
            }
            EMPTY_LIST => {
                let l = self.graph.add(Node::List(Vec::new()));
                self.stack.push(l);
            }
            LIST => {
                let items = self.pop_mark("LIST")?;
                let l = self.graph.add(Node::List(items));
                self.stack.push(l);
            }
            APPEND => {
                let item = self.pop("APPEND")?;
                self.extend_list(vec![item], "APPEND")?;
            }
            APPENDS => {
                let items = self.pop_mark("APPENDS")?;
                self.extend_list(items, "APPENDS")?;
            }
            EMPTY_DICT => {
                let d = self.new_dict(false);
                self.stack.push(d);
            }
            DICT => {
                let items = self.pop_mark("DICT")?;
                let d = self.new_dict(false);
                self.set_items(&d, items, "DICT")?;
                self.stack.push(d);
            }
            SETITEM => {
                let v = self.pop("SETITEM")?;
                let k = self.pop("SETITEM")?;
                let target = self.top("SETITEM")?.clone();
                self.set_items(&target, vec![k, v], "SETITEM")?;
            }
            SETITEMS => {
                let items = self.pop_mark("SETITEMS")?;
                let target = self.top("SETITEMS")?.clone();
                self.set_items(&target, items, "SETITEMS")?;
            }
            EMPTY_SET => {
                let list = self.graph.add(Node::List(Vec::new()));
                let item = self.object("builtins", "set", vec![list]);
                self.stack.push(item);
            }
            ADDITEMS => {
                let items = self.pop_mark("ADDITEMS")?;
                let target = self.top("ADDITEMS")?.clone();
                let list = match self.graph.node(&target) {
                    Some(Node::Object {
                        module, name, args, ..
                    }) if module == "builtins" && name == "set" && args.len() == 1 => {
                        args[0].clone()
                    }
                    _ => {
                        let what = self.graph.describe(&target);
                        return Err(
                            self.bad("ADDITEMS", format!("can only add to a set, not {what}"))
                        );
                    }
                };
                if let Some(Node::List(l)) = self.graph.node_mut(&list) {
                    l.extend(items);
                }
            }
            FROZENSET => {
                let items = self.pop_mark("FROZENSET")?;
                let list = self.graph.add(Node::List(items));
                let item = self.object("builtins", "frozenset", vec![list]);
                self.stack.push(item);
            }
            GET => {
                let line = self.input.line_str("GET")?;
                let index = line
                    .parse::<u64>()
                    .map_err(|_| self.bad("GET", format!("not a memo index: {line:?}")))?;
                self.memo_get(index)?;
            }
            BINGET => {
                let index = self.input.take(1, "BINGET")?[0] as u64;
                self.memo_get(index)?;
            }
            LONG_BINGET => {
                let index = self.input.u32_le("LONG_BINGET")? as u64;
                self.memo_get(index)?;
            }
            PUT => {
                let line = self.input.line_str("PUT")?;
                let index = line
                    .parse::<u64>()
                    .map_err(|_| self.bad("PUT", format!("not a memo index: {line:?}")))?;
                self.memo_put(index, "PUT")?;
            }
            BINPUT => {
                let index = self.input.take(1, "BINPUT")?[0] as u64;
                self.memo_put(index, "BINPUT")?;
            }
            LONG_BINPUT => {
                let index = self.input.u32_le("LONG_BINPUT")? as u64;
                self.memo_put(index, "LONG_BINPUT")?;
            }
            MEMOIZE => {
                let index = self.memo.len() as u64;
                self.memo_put(index, "MEMOIZE")?;
            }
            GLOBAL => {
                let module = self.input.line_str("GLOBAL")?;
                let name = self.input.line_str("GLOBAL")?;
                self.push_global(&module, &name)?;
            }
            STACK_GLOBAL => {
                let name = self.pop("STACK_GLOBAL")?;
                let module = self.pop("STACK_GLOBAL")?;
                let (Item::Str(module), Item::Str(name)) = (&module, &name) else {
                    return Err(self.bad("STACK_GLOBAL", "module and name must be strings".into()));
                };
                let (module, name) = (module.to_string(), name.to_string());
                self.push_global(&module, &name)?;
            }
            REDUCE => {
                let args = self.pop("REDUCE")?;
                let callable = self.pop("REDUCE")?;
                let result = self.apply(&callable, &args, ObjectKind::Reduce, "REDUCE")?;
                self.stack.push(result);
            }
            NEWOBJ => {
                let args = self.pop("NEWOBJ")?;
                let class = self.pop("NEWOBJ")?;
                let result = self.apply(&class, &args, ObjectKind::NewObj, "NEWOBJ")?;
                self.stack.push(result);
            }
            NEWOBJ_EX => {
                let kwargs = self.pop("NEWOBJ_EX")?;
                let args = self.pop("NEWOBJ_EX")?;
                let class = self.pop("NEWOBJ_EX")?;
                if !self.graph.is_empty_dict(&kwargs) {
                    return Err(self.bad("NEWOBJ_EX", "keyword arguments are not supported".into()));
                }
                let result = self.apply(&class, &args, ObjectKind::NewObj, "NEWOBJ_EX")?;
                self.stack.push(result);
            }
            BUILD => {
                let state = self.pop("BUILD")?;
                let target = self.top("BUILD")?.clone();
                self.build(&target, state)?;
            }
            BINPERSID => {
                let pid = self.pop("BINPERSID")?;
                let at = At {
                    file: self.input.file,
                    offset: self.input.op,
                };
                let pid = persistent_id(&self.graph, &at, &pid)?;
                let storage = self.storages.load_storage(&pid)?;
                self.stack.push(storage_item(storage, &pid));
            }
            PERSID => return Err(self.unsupported(opcode, "PERSID: text persistent ids")),
            STRING => return Err(self.unsupported(opcode, "STRING: escaped protocol-0 text")),
            INST => return Err(self.unsupported(opcode, "INST: builds arbitrary instances")),
            OBJ => return Err(self.unsupported(opcode, "OBJ: builds arbitrary instances")),
            EXT1 | EXT2 | EXT4 => {
                return Err(self.unsupported(opcode, "EXT: the copyreg extension registry"));
            }
            NEXT_BUFFER | READONLY_BUFFER => {
                return Err(self.unsupported(opcode, "out-of-band buffers"));
            }
            _ => return Err(self.unsupported(opcode, "not a pickle opcode")),
        }
        Ok(())
    }

    fn push_str(&mut self, n: u64, opcode: &'static str) -> Result<()> {
        let text = self.input.text(n, opcode)?;
        self.stack.push(Item::Str(text));
        Ok(())
    }

    // ----------------------------------------------------------------- stack and memo

    fn underflow(&self, opcode: &'static str) -> Error {
        Error::StackUnderflow {
            file: self.input.file.to_string(),
            offset: self.input.op,
            opcode,
        }
    }

    fn bad(&self, opcode: &'static str, problem: String) -> Error {
        Error::BadOperand {
            file: self.input.file.to_string(),
            offset: self.input.op,
            opcode,
            problem,
        }
    }

    fn unsupported(&self, opcode: u8, what: &'static str) -> Error {
        Error::UnsupportedOpcode {
            file: self.input.file.to_string(),
            offset: self.input.op,
            opcode,
            what,
        }
    }

    fn pop(&mut self, opcode: &'static str) -> Result<Item> {
        self.stack.pop().ok_or_else(|| self.underflow(opcode))
    }

    fn top(&self, opcode: &'static str) -> Result<&Item> {
        self.stack.last().ok_or_else(|| self.underflow(opcode))
    }

    fn pop_mark(&mut self, opcode: &'static str) -> Result<Vec<Item>> {
        let outer = self.metastack.pop().ok_or_else(|| self.underflow(opcode))?;
        Ok(std::mem::replace(&mut self.stack, outer))
    }

    fn memo_get(&mut self, index: u64) -> Result<()> {
        let item = self.memo.get(&index).cloned().ok_or(Error::MissingMemo {
            file: self.input.file.to_string(),
            offset: self.input.op,
            index,
        })?;
        self.stack.push(item);
        Ok(())
    }

    fn memo_put(&mut self, index: u64, opcode: &'static str) -> Result<()> {
        let top = self.top(opcode)?.clone();
        self.memo.insert(index, top);
        Ok(())
    }

    // ----------------------------------------------------------------- containers

    fn new_dict(&mut self, ordered: bool) -> Item {
        self.graph.add(Node::Dict {
            ordered,
            items: Vec::new(),
            keys: Default::default(),
        })
    }

    fn extend_list(&mut self, items: Vec<Item>, opcode: &'static str) -> Result<()> {
        let target = self.top(opcode)?.clone();
        match self.graph.node_mut(&target) {
            Some(Node::List(list)) => {
                list.extend(items);
                Ok(())
            }
            _ => {
                let what = self.graph.describe(&target);
                Err(self.bad(opcode, format!("can only append to a list, not {what}")))
            }
        }
    }

    fn set_items(&mut self, target: &Item, items: Vec<Item>, opcode: &'static str) -> Result<()> {
        if !items.len().is_multiple_of(2) {
            return Err(self.bad(opcode, "an odd number of keys and values".into()));
        }
        let mut it = items.into_iter();
        while let (Some(k), Some(v)) = (it.next(), it.next()) {
            self.graph
                .set_item(target, k, v)
                .map_err(|problem| self.bad(opcode, problem))?;
        }
        Ok(())
    }

    fn object(&mut self, module: &str, name: &str, args: Vec<Item>) -> Item {
        self.graph.add(Node::Object {
            module: module.into(),
            name: name.into(),
            kind: ObjectKind::Reduce,
            args,
            state: None,
        })
    }

    // ----------------------------------------------------------------- globals and calls

    fn push_global(&mut self, module: &str, name: &str) -> Result<()> {
        let module = python3_module(module);
        if !self.options.globals.allows(module, name) {
            return Err(Error::UnsupportedGlobal {
                file: self.input.file.to_string(),
                offset: self.input.op,
                module: module.to_string(),
                name: name.to_string(),
            });
        }
        self.stack.push(Item::Global(Rc::new((
            module.to_string(),
            name.to_string(),
        ))));
        Ok(())
    }

    fn apply(
        &mut self,
        callable: &Item,
        args: &Item,
        kind: ObjectKind,
        opcode: &'static str,
    ) -> Result<Item> {
        let Item::Global(callable) = callable else {
            let what = self.graph.describe(callable);
            return Err(self.bad(
                opcode,
                format!("can only call an allow-listed global, not {what}"),
            ));
        };
        let Some(args) = self.graph.tuple_items(args).map(<[Item]>::to_vec) else {
            let what = self.graph.describe(args);
            return Err(self.bad(opcode, format!("the arguments must be a tuple, not {what}")));
        };
        let at = At {
            file: self.input.file,
            offset: self.input.op,
        };
        call(&mut self.graph, &at, callable, kind, args)
    }

    fn build(&mut self, target: &Item, state: Item) -> Result<()> {
        let empty_state = matches!(state, Item::None) || self.graph.is_empty_dict(&state);
        let target_name = self.graph.describe(target);
        match self.graph.node_mut(target) {
            Some(Node::Object { state: slot, .. }) => {
                if slot.is_some() {
                    return Err(self.bad("BUILD", format!("{target_name} is built twice")));
                }
                *slot = Some(state);
                Ok(())
            }
            // `OrderedDict.__dict__.update({})`: nothing to keep.
            Some(Node::Dict { ordered: true, .. }) if empty_state => Ok(()),
            _ => Err(self.bad(
                "BUILD",
                format!(
                    "can only set the state of an allow-listed object, not {target_name} \
                     (state {})",
                    describe(&state)
                ),
            )),
        }
    }
}
