//! The crate's one error type: every way a checkpoint is refused (reading) or cannot be
//! written, each naming the file (or record) and the problem. Reading never panics; a file
//! that torch would not load, or that asks for anything outside the allow-list, ends here.

use std::path::PathBuf;

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a checkpoint could not be read or written.
///
/// `file` fields name what was being read: `optimizer.pt: optimizer/data.pkl` for a pickle
/// inside a zip checkpoint, `<pickle>` for a bare pickle stream. `offset` is the byte offset of
/// the opcode in that pickle.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The file is not a readable zip archive (truncated, corrupt, not a zip at all).
    #[error("{file}: not a readable zip checkpoint: {problem}")]
    Zip {
        /// The file.
        file: String,
        /// What the zip reader said.
        problem: String,
    },
    /// A record torch needs is not in the archive (`data.pkl`, `version`, a storage
    /// `data/<key>`).
    #[error("{file}: the archive has no record `{record}`")]
    MissingRecord {
        /// The file.
        file: String,
        /// The record, with its archive folder (`optimizer/data.pkl`).
        record: String,
    },
    /// A record holds something torch would refuse (a `version` out of range, a `byteorder`
    /// that is neither `little` nor `big`, entries outside one archive folder).
    #[error("{file}: record `{record}`: {problem}")]
    BadRecord {
        /// The file.
        file: String,
        /// The record.
        record: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A `GLOBAL` / `STACK_GLOBAL` names something outside the allow-list. Nothing is ever
    /// imported or called: the unpickler only knows the names on its list.
    #[error(
        "{file}: offset {offset}: unsupported global `{module}.{name}`: not on the allow-list \
         (torch.load(weights_only=True) refuses it too, unless added with add_safe_globals)"
    )]
    UnsupportedGlobal {
        /// The pickle.
        file: String,
        /// Where the opcode is.
        offset: usize,
        /// The module it names.
        module: String,
        /// The name in that module.
        name: String,
    },
    /// An opcode this unpickler does not execute (`INST`, `OBJ`, `EXT1`, out-of-band buffers,
    /// or a byte that is no opcode at all).
    #[error("{file}: offset {offset}: unsupported pickle opcode 0x{opcode:02x} ({what})")]
    UnsupportedOpcode {
        /// The pickle.
        file: String,
        /// Where the opcode is.
        offset: usize,
        /// The opcode byte.
        opcode: u8,
        /// Its name, or why it is refused.
        what: &'static str,
    },
    /// The pickle ends in the middle of an opcode, or before `STOP`.
    #[error("{file}: offset {offset}: the pickle ends early ({what})")]
    Truncated {
        /// The pickle.
        file: String,
        /// Where the opcode is.
        offset: usize,
        /// What was being read.
        what: &'static str,
    },
    /// A length field is larger than what is left of the input.
    #[error(
        "{file}: offset {offset}: {opcode} says {length} bytes follow but only {remaining} are left"
    )]
    OversizedLength {
        /// The pickle.
        file: String,
        /// Where the opcode is.
        offset: usize,
        /// The opcode's name.
        opcode: &'static str,
        /// The length it claims.
        length: u64,
        /// The bytes left after the length field.
        remaining: usize,
    },
    /// `BINGET` / `LONG_BINGET` / `GET` of a memo index nothing was stored at.
    #[error("{file}: offset {offset}: memo index {index} was never set")]
    MissingMemo {
        /// The pickle.
        file: String,
        /// Where the opcode is.
        offset: usize,
        /// The index asked for.
        index: u64,
    },
    /// An opcode needs more values (or a `MARK`) than the stack holds.
    #[error("{file}: offset {offset}: {opcode} on a stack that is too short (stack underflow)")]
    StackUnderflow {
        /// The pickle.
        file: String,
        /// Where the opcode is.
        offset: usize,
        /// The opcode's name.
        opcode: &'static str,
    },
    /// An opcode got values of the wrong kind (`APPEND` to a dict, `SETITEMS` on a tuple, an
    /// unhashable or duplicate dict key, text that is not UTF-8, a number that does not parse).
    #[error("{file}: offset {offset}: {opcode}: {problem}")]
    BadOperand {
        /// The pickle.
        file: String,
        /// Where the opcode is.
        offset: usize,
        /// The opcode's name.
        opcode: &'static str,
        /// What is wrong.
        problem: String,
    },
    /// An allow-listed callable (`_rebuild_tensor_v2`, `OrderedDict`, `_codecs.encode`, ...) got
    /// arguments it does not accept.
    #[error("{file}: offset {offset}: {callable}: {problem}")]
    BadArguments {
        /// The pickle.
        file: String,
        /// Where the `REDUCE` is.
        offset: usize,
        /// `module.name` of the callable.
        callable: String,
        /// What is wrong with the arguments.
        problem: String,
    },
    /// Containers nest deeper than the limit (or refer to themselves).
    #[error("{file}: values nest deeper than {limit} levels (or contain themselves)")]
    TooDeep {
        /// The pickle.
        file: String,
        /// The limit ([`crate::LoadOptions::max_depth`]).
        limit: usize,
    },
    /// Shared references (memo `GET`s) would expand the value beyond the limit.
    #[error(
        "{file}: the value would expand to more than {limit} units (memo references repeated \
         beyond any real checkpoint)"
    )]
    TooLarge {
        /// The pickle.
        file: String,
        /// The limit, in values plus bytes of text.
        limit: u64,
    },
    /// A persistent id names a storage whose record `data/<key>` is not in the archive.
    #[error("{file}: storage `{key}` has no record `{record}` in the archive")]
    MissingStorage {
        /// The file.
        file: String,
        /// The storage key.
        key: String,
        /// The record looked for.
        record: String,
    },
    /// A storage record's size differs from what its persistent id says, or one key is used
    /// with two storage types.
    #[error("{file}: storage `{key}`: {problem}")]
    BadStorage {
        /// The file.
        file: String,
        /// The storage key.
        key: String,
        /// What is wrong.
        problem: String,
    },
    /// A tensor's view (offset, sizes, strides) reaches past the end of its storage.
    #[error("{file}: {view} needs {needed} elements but its storage `{key}` holds {available}")]
    StorageOutOfBounds {
        /// The pickle.
        file: String,
        /// The storage key.
        key: String,
        /// The view: `a torch.float32 tensor (offset 0, size [5], stride [1])`.
        view: String,
        /// Elements the view needs (offset + extent).
        needed: u64,
        /// Elements the storage holds.
        available: u64,
    },
    /// A tensor's dense form does not fit in memory (a broadcast view, stride 0, can be far
    /// larger than its storage).
    #[error("a {dtype} tensor of {elements} elements does not fit in memory")]
    TensorTooLarge {
        /// The tensor's dtype.
        dtype: String,
        /// Its number of elements.
        elements: u64,
    },
    /// A storage type or dtype name this crate does not know.
    #[error("{file}: unknown dtype or storage type `{name}`")]
    UnknownDType {
        /// The pickle.
        file: String,
        /// The name (`torch.FooStorage`, `torch.int3`).
        name: String,
    },
    /// A value that cannot be written as torch writes it (a storage shared by tensors of two
    /// dtypes, a tensor whose bytes do not match its shape, nesting beyond the limit, an
    /// archive name torch would refuse).
    #[error("cannot write: {problem}")]
    Unwritable {
        /// What is wrong.
        problem: String,
    },
}
