//! Padding-free execution of padded batches (see
//! [`TrainableModel::set_padding_free`](crate::TrainableModel::set_padding_free)): the real
//! tokens (those the attention mask keeps) gathered into `[tokens, ...]`, so that the
//! projections, the feed-forward blocks, the norms and the dropouts do no work on padding;
//! attention scatters q / k / v back to the padded `[batch, seq]` layout and runs with the
//! same mask as the padded run (the same kernel on the same real rows), and gathers its
//! output again.
//!
//! Dropout draws its mask over the padded shape, as the padded run does, and keeps the real
//! tokens' entries: the same elements are dropped. Padding positions come out as zeros
//! instead of the values upstream computes for them, which the heads using this path never
//! read; the real tokens' values equal the padded run's up to the last bits (a matmul over
//! fewer rows may block its sums differently; the weight gradients sum over the tokens in
//! other chunks).

use tch::{Device, Tensor};

use crate::error::{Error, Result};
use crate::modeling_utils::ModelInputs;

/// The real tokens of a padded `[batch, seq]` batch.
pub(crate) struct Unpadded {
    /// `[tokens]`: the real tokens' indices in the flattened `[batch * seq]` layout.
    index: Tensor,
    batch: i64,
    seq: i64,
}

impl Unpadded {
    /// The layout of a forward's `attention_mask` when `padding_free` is asked, no cache is
    /// used, the underflow / overflow tracer is off (it reports upstream's padded shapes)
    /// and the mask pads at least one token (one host read).
    pub(crate) fn for_forward(
        ctx: &tchtrain_nn::Context,
        padding_free: bool,
        cached: bool,
        attention_mask: Option<&Tensor>,
        device: Device,
    ) -> Result<Option<Self>> {
        let Some(mask) = attention_mask.filter(|_| padding_free && !cached && !ctx.traced()) else {
            return Ok(None);
        };
        let size = mask.size();
        let [batch, seq] = size[..] else {
            return Ok(None);
        };
        let keep = mask.f_to_device(device)?.ne(0).reshape([-1]);
        let index = keep.nonzero().squeeze_dim(1);
        if index.size()[0] == batch * seq {
            return Ok(None);
        }
        Ok(Some(Self { index, batch, seq }))
    }

    /// `[batch, seq, features]` -> the real tokens' `[tokens, features]`.
    pub(crate) fn gather(&self, t: &Tensor) -> Tensor {
        let features = t.size()[2];
        t.reshape([self.batch * self.seq, features])
            .index_select(0, &self.index)
    }

    /// `[tokens, features]` -> `[batch, seq, features]`, zeros at the padding.
    pub(crate) fn scatter(&self, t: &Tensor) -> Tensor {
        let features = t.size()[1];
        Tensor::zeros([self.batch * self.seq, features], (t.kind(), t.device()))
            .index_copy(0, &self.index, t)
            .view([self.batch, self.seq, features])
    }

    /// `torch.nn.functional.dropout` of the padded run on the real tokens: the noise drawn
    /// over the padded shape (`empty_like(input).bernoulli_(1 - p).div_(1 - p)`, as
    /// libtorch's CPU dropout), the real tokens' rows kept.
    pub(crate) fn dropout(&self, x: &Tensor, p: f64, train: bool) -> Tensor {
        if !train || p == 0.0 {
            return x.shallow_clone();
        }
        if p == 1.0 {
            return x * Tensor::zeros([], (x.kind(), x.device()));
        }
        let features = x.size()[1];
        let noise = tchtrain_nn::noise(&[self.batch, self.seq, features], p, x.kind(), x.device());
        x * self.gather(&noise)
    }
}

/// `t` (`[tokens, features]` when `unpadded`) on the padded `[batch, seq, features]` layout
/// that attention runs on.
pub(crate) fn padded(unpadded: Option<&Unpadded>, t: Tensor) -> Tensor {
    match unpadded {
        Some(u) => u.scatter(&t),
        None => t,
    }
}

/// Attention's padded output `[batch, seq, features]` back on the layers' layout.
pub(crate) fn unpadded(unpadded: Option<&Unpadded>, t: Tensor) -> Tensor {
    match unpadded {
        Some(u) => u.gather(&t),
        None => t,
    }
}

/// Dropout on the hidden states, padded or padding-free, traced under `name`.
pub(crate) fn dropout_traced(
    ctx: &tchtrain_nn::Context,
    unpadded: Option<&Unpadded>,
    x: &Tensor,
    p: f64,
    train: bool,
    name: impl FnOnce() -> String,
) -> Tensor {
    match unpadded {
        Some(u) => {
            let y = u.dropout(x, p, train);
            ctx.leaf(name, "Dropout", &[], x, &y);
            y
        }
        None => tchtrain_nn::dropout_traced(ctx, x, p, train, name),
    }
}

/// What an encoder's head reads of the last hidden state, which decides whether its forward
/// may run padding-free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncoderHead {
    /// A sequence classifier pooling the first token: padding-free when every row's first
    /// token is real.
    FirstToken,
    /// A sequence classifier pooling the mean of the real tokens (the mask weighs the
    /// padding out): padding-free whenever the mask pads.
    MaskedMean,
    /// Masked-LM and token-classification heads: padding-free in training when the labels
    /// are -100 on the padding (the loss reads no padding position's logits).
    EveryToken,
    /// The base model and question answering (a softmax over every position, padding
    /// included): never; asking is refused.
    AllPositions,
}

impl EncoderHead {
    /// What a head of `kind` reads when it pools the first token (BERT, DeBERTa, DistilBERT;
    /// ModernBERT's mean pooling is [`MaskedMean`](Self::MaskedMean)).
    pub(crate) const fn of(kind: crate::heads::HeadKind) -> Self {
        use crate::heads::HeadKind;
        match kind {
            HeadKind::SequenceClassification => Self::FirstToken,
            HeadKind::MaskedLm | HeadKind::TokenClassification => Self::EveryToken,
            HeadKind::Base | HeadKind::QuestionAnswering => Self::AllPositions,
        }
    }

    /// Refuses padding-free execution for a head that reads every position, naming
    /// `architecture`.
    pub(crate) fn check(self, on: bool, architecture: &str) -> Result<()> {
        if on && self == Self::AllPositions {
            return Err(Error::InvalidArgument {
                field: "padding_free",
                detail: format!(
                    "{architecture} reads every position's output (its logits, or a loss over every position, cover the padding as upstream computes it); padding-free execution is implemented for the sequence, token and masked-LM heads"
                ),
            });
        }
        Ok(())
    }

    /// Whether this forward runs padding-free: asked (`on`), and the head reads no padding
    /// position of these inputs.
    pub(crate) fn runs_padding_free(self, on: bool, train: bool, inputs: &ModelInputs<'_>) -> bool {
        on && match (self, inputs.attention_mask) {
            (Self::FirstToken, Some(m)) => first_tokens_real(m),
            (Self::MaskedMean, Some(_)) => true,
            (Self::EveryToken, Some(m)) => {
                train && inputs.labels.is_some_and(|l| labels_ignore_padding(l, m))
            }
            _ => false,
        }
    }
}

impl Unpadded {
    /// The padded layout's `(batch, seq)`.
    pub(crate) fn batch_seq(&self) -> (i64, i64) {
        (self.batch, self.seq)
    }

    /// A second handle on the same layout.
    pub(crate) fn shallow_clone(&self) -> Self {
        Self {
            index: self.index.shallow_clone(),
            batch: self.batch,
            seq: self.seq,
        }
    }
}

/// Whether a causal LM's loss reads only real tokens' logits: every position whose shifted
/// label counts (`labels[:, t + 1] != -100`) is kept by the attention mask (one host read).
/// Right padding with its labels at -100 passes; left padding whose first real token is
/// labelled does not (upstream's loss then reads the last padding position's logits).
pub(crate) fn causal_loss_reads_only_real_tokens(labels: &Tensor, attention_mask: &Tensor) -> bool {
    let (ls, ms) = (labels.size(), attention_mask.size());
    if ls.len() != 2 || ls != ms || ls[1] < 2 {
        return false;
    }
    let seq = ls[1];
    let counted = labels.narrow(1, 1, seq - 1).ne(-100);
    let padding = attention_mask
        .to_device(labels.device())
        .narrow(1, 0, seq - 1)
        .eq(0);
    counted.logical_and(&padding).any().int64_value(&[]) == 0
}

/// Whether every row's first token is real (a head reading position 0 reads a real token).
pub(crate) fn first_tokens_real(attention_mask: &Tensor) -> bool {
    attention_mask.dim() == 2
        && attention_mask.size()[1] > 0
        && attention_mask.select(1, 0).ne(0).all().int64_value(&[]) != 0
}

/// Whether per-token labels ignore every padding position (-100 wherever the attention
/// mask is 0), so that a loss over them reads no padding position's logits.
pub(crate) fn labels_ignore_padding(labels: &Tensor, attention_mask: &Tensor) -> bool {
    labels.size() == attention_mask.size()
        && labels
            .ne(-100)
            .logical_and(&attention_mask.to_device(labels.device()).eq(0))
            .any()
            .int64_value(&[])
            == 0
}
