//! `OptimizerNames`: upstream's optimizer identifiers (`training_args.py`), and which of them
//! tchtrain implements.

use crate::error::{Error, Result};
use crate::string_enum::string_enum;

string_enum! {
    /// The optimizer identifiers of `optim`: upstream `OptimizerNames`. Every upstream name parses;
    /// [`OptimizerNames::ensure_supported`] tells whether tchtrain implements it.
    pub enum OptimizerNames ("OptimizerNames") {
        /// `torch.optim.AdamW`.
        AdamwTorch = "adamw_torch",
        /// `torch.optim.AdamW(fused=True)`; upstream's default on torch >= 2.8.
        AdamwTorchFused = "adamw_torch_fused",
        /// torch_xla's AdamW.
        AdamwTorchXla = "adamw_torch_xla",
        /// Ascend NPU fused AdamW.
        AdamwTorchNpuFused = "adamw_torch_npu_fused",
        /// transformers' Adafactor.
        Adafactor = "adafactor",
        /// torchdistx AnyPrecisionAdamW.
        AdamwAnyprecision = "adamw_anyprecision",
        /// torchao 4-bit AdamW.
        AdamwTorch4bit = "adamw_torch_4bit",
        /// torchao 8-bit AdamW.
        AdamwTorch8bit = "adamw_torch_8bit",
        /// bitsandbytes AdEMAMix.
        Ademamix = "ademamix",
        /// `torch.optim.SGD`.
        Sgd = "sgd",
        /// `torch.optim.Adagrad`.
        Adagrad = "adagrad",
        /// bitsandbytes 8-bit AdamW (upstream `ADAMW_BNB`).
        AdamwBnb8bit = "adamw_bnb_8bit",
        /// Alias of `adamw_bnb_8bit` (upstream `ADAMW_8BIT`).
        Adamw8bit = "adamw_8bit",
        /// bitsandbytes 8-bit AdEMAMix.
        Ademamix8bit = "ademamix_8bit",
        /// bitsandbytes 8-bit Lion.
        Lion8bit = "lion_8bit",
        /// bitsandbytes 32-bit Lion (upstream `LION`).
        Lion32bit = "lion_32bit",
        /// bitsandbytes paged 32-bit AdamW.
        PagedAdamw32bit = "paged_adamw_32bit",
        /// bitsandbytes paged 8-bit AdamW.
        PagedAdamw8bit = "paged_adamw_8bit",
        /// bitsandbytes paged 32-bit AdEMAMix.
        PagedAdemamix32bit = "paged_ademamix_32bit",
        /// bitsandbytes paged 8-bit AdEMAMix.
        PagedAdemamix8bit = "paged_ademamix_8bit",
        /// bitsandbytes paged 32-bit Lion.
        PagedLion32bit = "paged_lion_32bit",
        /// bitsandbytes paged 8-bit Lion.
        PagedLion8bit = "paged_lion_8bit",
        /// `torch.optim.RMSprop`.
        Rmsprop = "rmsprop",
        /// bitsandbytes RMSprop.
        RmspropBnb = "rmsprop_bnb",
        /// bitsandbytes 8-bit RMSprop.
        RmspropBnb8bit = "rmsprop_bnb_8bit",
        /// bitsandbytes 32-bit RMSprop.
        RmspropBnb32bit = "rmsprop_bnb_32bit",
        /// GaLore AdamW.
        GaloreAdamw = "galore_adamw",
        /// GaLore 8-bit AdamW.
        GaloreAdamw8bit = "galore_adamw_8bit",
        /// GaLore Adafactor.
        GaloreAdafactor = "galore_adafactor",
        /// Layer-wise GaLore AdamW.
        GaloreAdamwLayerwise = "galore_adamw_layerwise",
        /// Layer-wise GaLore 8-bit AdamW.
        GaloreAdamw8bitLayerwise = "galore_adamw_8bit_layerwise",
        /// Layer-wise GaLore Adafactor.
        GaloreAdafactorLayerwise = "galore_adafactor_layerwise",
        /// LOMO.
        Lomo = "lomo",
        /// AdaLOMO.
        Adalomo = "adalomo",
        /// GrokAdamW.
        Grokadamw = "grokadamw",
        /// Schedule-free RAdam.
        ScheduleFreeRadam = "schedule_free_radam",
        /// Schedule-free AdamW.
        ScheduleFreeAdamw = "schedule_free_adamw",
        /// Schedule-free SGD.
        ScheduleFreeSgd = "schedule_free_sgd",
        /// APOLLO AdamW.
        ApolloAdamw = "apollo_adamw",
        /// Layer-wise APOLLO AdamW.
        ApolloAdamwLayerwise = "apollo_adamw_layerwise",
        /// StableAdamW (torch-optimi).
        StableAdamw = "stable_adamw",
    }
    default = AdamwTorchFused;
}

impl OptimizerNames {
    /// The optimizers tchtrain implements (in `tchtrain-optim`); every other name parses but is
    /// rejected by [`OptimizerNames::ensure_supported`]. Extend this list when the optim crate
    /// gains an optimizer.
    pub const SUPPORTED: &'static [OptimizerNames] = &[
        OptimizerNames::AdamwTorch,
        OptimizerNames::AdamwTorchFused,
        OptimizerNames::Adafactor,
        OptimizerNames::Sgd,
        OptimizerNames::Adagrad,
        OptimizerNames::Rmsprop,
    ];

    /// Whether tchtrain implements this optimizer.
    pub fn is_supported(self) -> bool {
        Self::SUPPORTED.contains(&self)
    }

    /// `Ok(self)` when tchtrain implements this optimizer, else
    /// [`Error::UnsupportedOptimizer`] listing the ones it does.
    pub fn ensure_supported(self) -> Result<Self> {
        if self.is_supported() {
            Ok(self)
        } else {
            Err(Error::UnsupportedOptimizer {
                optim: self.as_str().to_string(),
                supported: Self::SUPPORTED
                    .iter()
                    .map(|o| o.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
        }
    }
}
