//! The `DataCollator` trait: rows in, one [`Batch`] of tensors out.

use crate::batch::Batch;
use crate::error::Result;
use tchtrain_datasets::Feature;

/// A data collator: turns a list of dataset rows into one [`Batch`], as upstream's
/// `DataCollator = Callable[[list[InputDataClass]], dict[str, Any]]`.
///
/// `F` is the row type, [`Feature`] for every collator except
/// [`DataCollatorForMultipleChoice`](crate::DataCollatorForMultipleChoice) (rows of
/// choices) and the raw-token-id form of
/// [`DataCollatorForLanguageModeling`](crate::DataCollatorForLanguageModeling)
/// (`Vec<i64>`). `collate` takes `&mut self` because the masking collators carry a
/// random generator that advances from one batch to the next, as upstream's does.
///
/// ```
/// use tchtrain_collators::{DataCollator, DataCollatorWithPadding, Feature, TokenizerInfo};
/// let tokenizer = TokenizerInfo { pad_token_id: Some(0), ..TokenizerInfo::default() };
/// let mut collator: Box<dyn DataCollator> = Box::new(DataCollatorWithPadding::new(tokenizer));
/// let batch = collator.collate(&[Feature::new(vec![101, 7, 102]), Feature::new(vec![101, 102])])?;
/// assert_eq!(batch.get("input_ids").unwrap().size(), [2, 3]);
/// # Ok::<(), tchtrain_collators::Error>(())
/// ```
pub trait DataCollator<F = Feature> {
    /// Collates `features` into a batch.
    fn collate(&mut self, features: &[F]) -> Result<Batch>;
}
