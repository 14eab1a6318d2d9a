//! `tchtrain-serialization` — `torch.save` / `torch.load` for torch's zip checkpoints, in pure
//! Rust (no libtorch): what transformers' Trainer writes into `checkpoint-N/` beside the
//! safetensors weights (`optimizer.pt`, `scheduler.pt`, `rng_state.pth`, `scaler.pt`,
//! `training_args.bin`), read and written so that Python resumes our checkpoints and we
//! resume its.
//!
//! - Reading ([`load`], [`TorchFile`]) mirrors `torch.load(weights_only=True)`
//!   (`torch._weights_only_unpickler`): a restricted unpickler that never imports, calls or
//!   executes anything. `GLOBAL`s resolve only against an allow-list ([`Globals`]); tensors
//!   come from persistent ids `('storage', type, key, location, numel)` over the archive's
//!   `data/<key>` records; the few allow-listed classes (numpy's RNG array, `torch.device`,
//!   `TrainingArguments` and its enums) become inert [`Object`] records. Every bound is
//!   checked and every refusal is an [`Error`] naming the file and the problem.
//! - Writing ([`save`]) mirrors `torch.save`: the pickle opcodes CPython's protocol-2
//!   pickler emits for the same objects, and caffe2's `PyTorchStreamWriter` zip layout (64-byte
//!   aligned STORED records, data descriptors, zip64 end records, `version` 3, the
//!   `.data/serialization_id` torch computes), so simple checkpoints are byte-identical to
//!   torch's and all load with `torch.load(weights_only=True)`.
//!
//! ```no_run
//! use tchtrain_serialization::{DType, Tensor, Value, load, save};
//! let state = load("checkpoint-2/optimizer.pt")?;
//! if let Some(Value::Dict(per_param)) = state.get("state") {
//!     for (index, slots) in per_param {
//!         let exp_avg = slots.get("exp_avg").and_then(Value::as_tensor);
//!         // exp_avg.contiguous_bytes() feeds tch::Tensor::from_data_size(...)
//!     }
//! }
//! let scale = Tensor::from_bytes(DType::Float32, &[], 1024f32.to_le_bytes().to_vec())?;
//! save("scaler.pt", &Value::Dict(vec![(Value::Str("scale".into()), Value::Tensor(scale))]))?;
//! # Ok::<(), tchtrain_serialization::Error>(())
//! ```

mod dtype;
mod error;
mod globals;
mod object_graph;
mod opcodes;
mod pickle_input;
mod pickler;
mod rebuild;
mod serialization;
mod serialization_id;
mod stream_writer;
mod torch_file;
mod unpickler;
mod value;

pub use dtype::DType;
pub use error::{Error, Result};
pub use globals::Globals;
pub use serialization::{LoadOptions, dumps, load, load_with, loads, save, save_to_vec};
pub use torch_file::TorchFile;
pub use value::{Object, ObjectKind, Storage, Tensor, Value};
