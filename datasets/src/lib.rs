//! `tchtrain-datasets` — the parts of Hugging Face `datasets` the Trainer's example scripts
//! use, without libtorch.
//!
//! Owns the row type [`Feature`] (a tokenized row: `input_ids`, `attention_mask`, ... and
//! its [`Label`]), data files as the `csv` / `json` / `text` / `parquet` / `arrow` loaders
//! read them ([`Table`], [`load_text_lines`], plain or `.bz2`; [`ParquetFile`] reads a
//! Parquet file row group by row group), the folders of `save_to_disk`
//! ([`load_from_disk`], [`DatasetDict`]), `Dataset.map`'s fingerprint cache
//! ([`MapCache`], [`Fingerprint`]), the parallel map of `map(num_proc=...)`
//! ([`parallel_map`]), and `run_clm.py`'s text preparation ([`tokenize_lines`],
//! [`group_texts`], [`causal_lm_blocks_from_file`], and the streamed form
//! [`CausalLmTextStream`], of a text file or a Parquet text column), and TRL's packing of tokenized rows ([`pack_dataset`]).
//!
//! Mirrors the Hugging Face `datasets` library (the loaders, `arrow_dataset.map`,
//! `load_from_disk`, `fingerprint.py`); names follow upstream so a user finds each concept where they expect it.
//!
//! ```
//! use tchtrain_datasets::{Label, Table, group_texts};
//! let table = Table::from_csv_str("text,label\nhello,1\n", "inline.csv")?;
//! assert_eq!(table.len(), 1);
//! let blocks = group_texts(&[vec![1, 2, 3], vec![4]], 2, None)?;
//! assert_eq!(blocks[1].labels, Some(Label::Ids(vec![3, 4])));
//! # Ok::<(), tchtrain_datasets::Error>(())
//! ```

mod arrow_cells;
mod arrow_dataset;
mod arrow_ipc;
mod audio;
mod class_label;
mod data_files;
mod error;
mod feature;
mod glob;
mod hub;
mod image;
mod map_cache;
mod media;
mod metadata;
pub mod numpy_random;
mod packing;
mod parallel;
mod parquet;
mod table;
mod text;
mod yaml;

pub use arrow_dataset::{DatasetDict, LoadedDataset, load_from_disk};
pub use audio::{DecodedAudio, audio_from_cell, decode_audio};
pub use class_label::class_label_names;
pub use data_files::{DataFilesDict, PackagedModule};
pub use error::{Error, Result};
pub use feature::{Column, Feature, Label};
pub use hub::{
    DatasetFiles, PARQUET_EXPORT_REVISION, hub_options_from_env, hub_options_from_vars,
    load_dataset_files,
};
pub use image::{DecodedImage, decode_image, image_from_cell, open_image};
pub use map_cache::{
    CacheEntry, DATASETS_CACHE_ENV, DATASETS_CACHE_MB_ENV, DEFAULT_DATASETS_CACHE_MB, Fingerprint,
    MapCache, decode_rows, encode_rows, map_cached,
};
pub use packing::{Packed, PackingStrategy, pack_dataset};
pub use parallel::parallel_map;
pub use parquet::{ColumnChunks, ParquetFile, RowGroups};
pub use table::{Table, cell_text, read_text_maybe_bz2};
pub use text::{
    CausalLmTextStream, DEFAULT_MAP_BATCH_SIZE, TextBlocks, causal_lm_blocks_from_file,
    clm_text_column, group_texts, load_text_lines, split_lines, tokenize_lines,
};
