//! The task head an encoder family puts on its base model, as a type: upstream's
//! `...Model`, `...ForMaskedLM`, `...ForSequenceClassification`,
//! `...ForTokenClassification` and `...ForQuestionAnswering` are `Bert<C, MaskedLm>` and
//! so on. A head that does not exist does not compile.

/// Which head (the value a model matches on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadKind {
    /// The base model (its last hidden state, and BERT's pooler).
    Base,
    /// A masked-language-modeling head.
    MaskedLm,
    /// A sequence-classification head.
    SequenceClassification,
    /// A token-classification head.
    TokenClassification,
    /// An extractive question-answering head (start and end logits).
    QuestionAnswering,
}

/// A task head type (one of this module's unit structs).
pub trait TaskHead: Send + Sync + std::fmt::Debug + 'static {
    /// Which head.
    const KIND: HeadKind;
}

macro_rules! heads {
    ($($(#[$doc:meta])* $name:ident,)*) => {$(
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $name;

        impl TaskHead for $name {
            const KIND: HeadKind = HeadKind::$name;
        }
    )*};
}

heads! {
    /// The base model.
    Base,
    /// `...ForMaskedLM`.
    MaskedLm,
    /// `...ForSequenceClassification`.
    SequenceClassification,
    /// `...ForTokenClassification`.
    TokenClassification,
    /// `...ForQuestionAnswering`.
    QuestionAnswering,
}
