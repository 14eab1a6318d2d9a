//! One module per fuzz target; each has `pub fn run(data: &[u8])`.

pub mod adapter_config;
pub mod audio;
pub mod config_json;
pub mod data_file;
pub mod dataset_cache_rows;
pub mod deepspeed_config;
pub mod deepspeed_scheduler;
pub mod fsdp_config;
pub mod generation_config;
pub mod gpt2_vocab_merges;
pub mod image_png;
pub mod parquet;
pub mod table_csv;
pub mod table_json;
pub mod tokenizer_json;
pub mod torch_pickle;
pub mod trainer_state_json;
pub mod training_args_cli;
pub mod training_args_json;
