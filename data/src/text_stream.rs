//! `run_clm.py --streaming`'s text stream as an [`IterableDataset`]: each epoch is a new
//! pass over the file ([`CausalLmTextStream::blocks`]).

use tchtrain_datasets::CausalLmTextStream;

use crate::dataset::{FeatureStream, IterableDataset};
use crate::error::Result;

impl IterableDataset for CausalLmTextStream {
    fn iter_epoch(&self, _epoch: u64) -> Result<FeatureStream> {
        Ok(Box::new(self.blocks()?.map(|row| row.map_err(Into::into))))
    }
}
