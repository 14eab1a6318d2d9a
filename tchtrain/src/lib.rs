//! `tchtrain` — the Hugging Face `transformers` Trainer stack in Rust on `tch` (libtorch).
//!
//! This facade re-exports every tchtrain crate under the name of the upstream module it
//! mirrors. Each crate is also usable on its own.
//!
//! | module | crate | upstream |
//! |---|---|---|
//! | [`training_args`] | `tchtrain-training-args` | `training_args.py` |
//! | [`callbacks`] | `tchtrain-callbacks` | `trainer_callback.py` |
//! | [`optim`] | `tchtrain-optim` | `optimization.py`, `torch.optim` |
//! | [`losses`] | `tchtrain-losses` | `loss/loss_utils.py` |
//! | [`collators`] | `tchtrain-collators` | `data/data_collator.py` |
//! | [`models`] | `tchtrain-models` | `modeling_utils.py` + model files |
//! | [`distributed`] | `tchtrain-distributed` | `torch.distributed` |
//! | [`deepspeed`] | `tchtrain-deepspeed` | `integrations/deepspeed.py` |
//! | [`fsdp`] | `tchtrain-fsdp` | FSDP integration |
//! | [`trainer`] | `tchtrain-trainer` | `trainer.py` |
//!
//! `tch` itself is re-exported, so one dependency gives the tensors too:
//!
//! ```
//! use tchtrain::tch::{Kind, Tensor};
//!
//! let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0]).set_requires_grad(true);
//! let loss = (&x * &x).sum(Kind::Float);
//! loss.backward();
//! assert_eq!(Vec::<f32>::try_from(x.grad()).unwrap(), vec![2.0, 4.0, 6.0]);
//! ```

pub use tch;
pub use tchtrain_callbacks as callbacks;
pub use tchtrain_collators as collators;
pub use tchtrain_deepspeed as deepspeed;
pub use tchtrain_distributed as distributed;
pub use tchtrain_fsdp as fsdp;
pub use tchtrain_losses as losses;
pub use tchtrain_models as models;
pub use tchtrain_optim as optim;
pub use tchtrain_trainer as trainer;
pub use tchtrain_training_args as training_args;
