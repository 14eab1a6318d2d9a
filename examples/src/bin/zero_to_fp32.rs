//! `zero_to_fp32 CHECKPOINT_DIR OUTPUT_DIR`: consolidates the per-rank shards of a ZeRO or
//! sharded FSDP checkpoint (a `checkpoint-N` folder with `latest` / `pytorch_model_fsdp_0/`,
//! or the shard folder itself) into `OUTPUT_DIR/model.safetensors`, as DeepSpeed's
//! `zero_to_fp32.py` does. Copy the checkpoint's `config.json` beside it to load it with
//! `from_pretrained`.

use std::path::PathBuf;
use std::process::ExitCode;

use tchtrain_deepspeed::convert_zero_checkpoint_to_fp32_state_dict;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [checkpoint, output] = args.as_slice() else {
        eprintln!("usage: zero_to_fp32 CHECKPOINT_DIR OUTPUT_DIR");
        return ExitCode::from(2);
    };
    match convert_zero_checkpoint_to_fp32_state_dict(
        &PathBuf::from(checkpoint),
        &PathBuf::from(output),
    ) {
        Ok(path) => {
            println!("Saved fp32 state dict to {}", path.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("zero_to_fp32: {e}");
            ExitCode::FAILURE
        }
    }
}
