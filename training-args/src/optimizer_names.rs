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
        AdamwBnb8bit = "adamw_bnb_8bit" as "ADAMW_BNB",
        /// Alias of `adamw_bnb_8bit` (upstream `ADAMW_8BIT`).
        Adamw8bit = "adamw_8bit",
        /// bitsandbytes 8-bit AdEMAMix.
        Ademamix8bit = "ademamix_8bit",
        /// bitsandbytes 8-bit Lion.
        Lion8bit = "lion_8bit",
        /// bitsandbytes 32-bit Lion (upstream `LION`).
        Lion32bit = "lion_32bit" as "LION",
        /// bitsandbytes paged 32-bit AdamW.
        PagedAdamw32bit = "paged_adamw_32bit" as "PAGED_ADAMW",
        /// bitsandbytes paged 8-bit AdamW.
        PagedAdamw8bit = "paged_adamw_8bit",
        /// bitsandbytes paged 32-bit AdEMAMix.
        PagedAdemamix32bit = "paged_ademamix_32bit" as "PAGED_ADEMAMIX",
        /// bitsandbytes paged 8-bit AdEMAMix.
        PagedAdemamix8bit = "paged_ademamix_8bit",
        /// bitsandbytes paged 32-bit Lion.
        PagedLion32bit = "paged_lion_32bit" as "PAGED_LION",
        /// bitsandbytes paged 8-bit Lion.
        PagedLion8bit = "paged_lion_8bit",
        /// `torch.optim.RMSprop`.
        Rmsprop = "rmsprop",
        /// bitsandbytes RMSprop.
        RmspropBnb = "rmsprop_bnb",
        /// bitsandbytes 8-bit RMSprop.
        RmspropBnb8bit = "rmsprop_bnb_8bit" as "RMSPROP_8BIT",
        /// bitsandbytes 32-bit RMSprop.
        RmspropBnb32bit = "rmsprop_bnb_32bit" as "RMSPROP_32BIT",
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

/// How tchtrain serves one `optim` name: implemented and checked against a reference, or
/// refused with the reason and the name to use instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptimizerSupport {
    /// Implemented in `tchtrain-optim`; `reference` names what its numbers are checked against.
    Working {
        /// The Python class (and package) the parity tests compare with.
        reference: &'static str,
    },
    /// Refused by the optimizer factory with this reason.
    Refused {
        /// Why tchtrain does not run it.
        why: &'static str,
        /// The name to use instead.
        instead: &'static str,
    },
}

impl OptimizerNames {
    /// Whether and how tchtrain serves this name: the one table of working and refused
    /// optimizers (`tchtrain-optim`'s factory builds exactly the working ones).
    pub fn support(self) -> OptimizerSupport {
        use OptimizerNames::*;
        use OptimizerSupport::{Refused, Working};
        match self {
            AdamwTorch => Working {
                reference: "torch.optim.AdamW",
            },
            AdamwTorchFused => Working {
                reference: "torch.optim.AdamW(fused=True)",
            },
            Adafactor => Working {
                reference: "transformers.optimization.Adafactor",
            },
            Sgd => Working {
                reference: "torch.optim.SGD",
            },
            Adagrad => Working {
                reference: "torch.optim.Adagrad",
            },
            Rmsprop => Working {
                reference: "torch.optim.RMSprop",
            },
            AdamwBnb8bit | Adamw8bit | PagedAdamw8bit => Working {
                reference: "bitsandbytes.optim.AdamW(optim_bits=8)",
            },
            PagedAdamw32bit => Working {
                reference: "bitsandbytes.optim.AdamW(optim_bits=32)",
            },
            Ademamix | PagedAdemamix32bit => Working {
                reference: "bitsandbytes.optim.AdEMAMix(optim_bits=32)",
            },
            Ademamix8bit | PagedAdemamix8bit => Working {
                reference: "bitsandbytes.optim.AdEMAMix(optim_bits=8)",
            },
            Lion32bit | PagedLion32bit => Working {
                reference: "bitsandbytes.optim.Lion(optim_bits=32)",
            },
            Lion8bit | PagedLion8bit => Working {
                reference: "bitsandbytes.optim.Lion(optim_bits=8)",
            },
            RmspropBnb | RmspropBnb32bit => Working {
                reference: "bitsandbytes.optim.RMSprop(optim_bits=32)",
            },
            RmspropBnb8bit => Working {
                reference: "bitsandbytes.optim.RMSprop(optim_bits=8)",
            },
            StableAdamw => Working {
                reference: "optimi.StableAdamW (torch-optimi, single-tensor path)",
            },
            Grokadamw => Working {
                reference: "grokadamw.GrokAdamW",
            },
            Lomo => Working {
                reference: "lomo_optim.Lomo (fused_backward)",
            },
            Adalomo => Working {
                reference: "lomo_optim.AdaLomo (fused_backward; its state kept on the CPU)",
            },
            ScheduleFreeAdamw => Working {
                reference: "schedulefree.AdamWScheduleFree",
            },
            ScheduleFreeSgd => Working {
                reference: "schedulefree.SGDScheduleFree",
            },
            ScheduleFreeRadam => Working {
                reference: "schedulefree.RAdamScheduleFree",
            },
            AdamwTorch8bit => Working {
                reference: "torchao.optim.AdamW8bit",
            },
            AdamwTorch4bit => Working {
                reference: "torchao.optim.AdamW4bit",
            },
            GaloreAdamw => Working {
                reference: "galore_torch.GaLoreAdamW",
            },
            GaloreAdafactor => Working {
                reference: "galore_torch.GaLoreAdafactor",
            },
            ApolloAdamw => Working {
                reference: "apollo_torch.APOLLOAdamW (random projection drawn on the CPU)",
            },
            GaloreAdamw8bit => Working {
                reference: "galore_torch.GaLoreAdamW8bit (bitsandbytes' CPU update; \
                            torch.cuda.synchronize stubbed)",
            },
            GaloreAdamw8bitLayerwise => Working {
                reference: "galore_torch.GaLoreAdamW8bit, one per parameter (fused_backward; \
                            bitsandbytes' CPU update; torch.cuda.synchronize stubbed)",
            },
            GaloreAdamwLayerwise => Working {
                reference: "galore_torch.GaLoreAdamW, one per parameter (fused_backward)",
            },
            ApolloAdamwLayerwise => Working {
                reference: "apollo_torch.APOLLOAdamW, one per parameter (fused_backward; random \
                            projection drawn on the CPU)",
            },
            GaloreAdafactorLayerwise => Refused {
                why: "upstream builds each parameter's GaLoreAdafactor with the Trainer's lr but \
                      adds scale_parameter=False, relative_step=False for galore_adafactor only, \
                      so galore_torch raises \"Cannot combine manual `lr` and \
                      `relative_step=True` options\" when the optimizer is created: there is no \
                      run to match",
                instead: "galore_adafactor",
            },
            AdamwTorchXla => Refused {
                why: "it is torch_xla's AdamW for XLA devices (TPU), and libtorch has no XLA backend",
                instead: "adamw_torch_fused",
            },
            AdamwTorchNpuFused => Refused {
                why: "it is torch_npu's fused AdamW for Ascend NPUs, which libtorch does not drive",
                instead: "adamw_torch_fused",
            },
            AdamwAnyprecision => Refused {
                why: "its package, torchdistx, is not on PyPI and does not build against torch 2.13, \
                      so there is no reference to check it against",
                instead: "adamw_torch_fused",
            },
        }
    }

    /// The names tchtrain implements, in upstream's order.
    pub fn supported() -> Vec<OptimizerNames> {
        Self::ALL
            .iter()
            .copied()
            .filter(|o| o.is_supported())
            .collect()
    }

    /// Whether tchtrain implements this optimizer.
    pub fn is_supported(self) -> bool {
        matches!(self.support(), OptimizerSupport::Working { .. })
    }

    /// `Ok(self)` when tchtrain implements this optimizer, else
    /// [`Error::UnsupportedOptimizer`] with the reason and the name to use instead.
    pub fn ensure_supported(self) -> Result<Self> {
        match self.support() {
            OptimizerSupport::Working { .. } => Ok(self),
            OptimizerSupport::Refused { why, instead } => Err(Error::UnsupportedOptimizer {
                optim: self.as_str().to_string(),
                why,
                instead,
            }),
        }
    }
}
