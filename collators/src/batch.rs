//! `Batch`: the named tensors a collator produces (upstream's `dict[str, Tensor]`),
//! in insertion order.

use tch::Tensor;

/// The output of a collator: named tensors in insertion order, plus the few plain
/// integers upstream returns outside tensors (`max_length_q` / `max_length_k` of
/// `DataCollatorWithFlattening`).
///
/// Keys are upstream's: `input_ids`, `attention_mask`, `token_type_ids`, `labels`,
/// `decoder_input_ids`, `position_ids`, `seq_idx`, `cu_seq_lens_q`, ...
#[derive(Debug, Default)]
pub struct Batch {
    tensors: Vec<(String, Tensor)>,
    ints: Vec<(String, i64)>,
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// The tensor named `key`.
    pub fn get(&self, key: &str) -> Option<&Tensor> {
        self.tensors.iter().find(|(k, _)| k == key).map(|(_, t)| t)
    }

    /// Inserts `tensor` under `key`, replacing (in place) a tensor of the same name.
    pub fn insert(&mut self, key: impl Into<String>, tensor: Tensor) {
        let key = key.into();
        match self.tensors.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = tensor,
            None => self.tensors.push((key, tensor)),
        }
    }

    /// Removes and returns the tensor named `key`.
    pub fn remove(&mut self, key: &str) -> Option<Tensor> {
        let i = self.tensors.iter().position(|(k, _)| k == key)?;
        Some(self.tensors.remove(i).1)
    }

    /// Whether a tensor named `key` is present.
    pub fn contains(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// The tensor names, in order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.tensors.iter().map(|(k, _)| k.as_str())
    }

    /// The named tensors, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Tensor)> {
        self.tensors.iter().map(|(k, t)| (k.as_str(), t))
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// Whether the batch holds no tensor.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// The plain integer named `key` (`max_length_q`, `max_length_k`).
    pub fn int(&self, key: &str) -> Option<i64> {
        self.ints.iter().find(|(k, _)| k == key).map(|(_, v)| *v)
    }

    /// Sets the plain integer `key`.
    pub fn insert_int(&mut self, key: impl Into<String>, value: i64) {
        let key = key.into();
        match self.ints.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.ints.push((key, value)),
        }
    }

    /// The plain integers, in order.
    pub fn ints(&self) -> impl Iterator<Item = (&str, i64)> {
        self.ints.iter().map(|(k, v)| (k.as_str(), *v))
    }

    /// Moves every tensor to `device` (as the Trainer's `_prepare_inputs` does).
    pub fn to_device(&self, device: tch::Device) -> Result<Batch, tch::TchError> {
        self.to_device_with(device, false, false)
    }

    /// [`to_device`](Self::to_device) as the Trainer's loaders feed a CUDA device: with
    /// `pin_memory` each host tensor is first copied to page-locked memory (torch's
    /// `DataLoader(pin_memory=True)`), and with `non_blocking` the host-to-device copy is
    /// asynchronous (accelerate's `non_blocking`: the stream orders it before the kernels
    /// that read it). Off CUDA both are ignored, as torch ignores them (it warns that
    /// pinning without an accelerator does nothing).
    pub fn to_device_with(
        &self,
        device: tch::Device,
        pin_memory: bool,
        non_blocking: bool,
    ) -> Result<Batch, tch::TchError> {
        let cuda = device.is_cuda();
        let move_one = |t: &Tensor| -> Result<Tensor, tch::TchError> {
            if !cuda || t.device() == device {
                return t.f_to_device(device);
            }
            let host = if pin_memory && t.device() == tch::Device::Cpu {
                t.f_pin_memory(device)?
            } else {
                t.shallow_clone()
            };
            host.f_to_device_(device, host.kind(), non_blocking, false)
        };
        Ok(Batch {
            tensors: self
                .tensors
                .iter()
                .map(|(k, t)| Ok((k.clone(), move_one(t)?)))
                .collect::<Result<_, tch::TchError>>()?,
            ints: self.ints.clone(),
        })
    }
}

impl IntoIterator for Batch {
    type Item = (String, Tensor);
    type IntoIter = std::vec::IntoIter<(String, Tensor)>;

    fn into_iter(self) -> Self::IntoIter {
        self.tensors.into_iter()
    }
}
