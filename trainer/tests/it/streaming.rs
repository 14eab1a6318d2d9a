//! Training on a stream (upstream's `IterableDataset`, `run_clm.py --streaming`): the text
//! stream yields exactly the in-memory blocks, training on it equals training on those blocks
//! in sequential order, and its bad inputs are errors before or at the first step.

use std::sync::Arc;
use tchtrain_testing::{assets, lock};

use anyhow::Result;
use tch::Device;
use tchtrain_data::{Dataset, InMemoryDataset, IterableDataset};
use tchtrain_datasets::{CausalLmTextStream, causal_lm_blocks_from_file};
use tchtrain_models::{
    AutoTask, AutoTokenizer, LoadOptions, PreTrainedModel, Tokenizer, from_pretrained_dir,
};
use tchtrain_trainer::{Error, Trainer};
use tchtrain_training_args::{SaveStrategy, TrainingArguments};

fn gpt2() -> Result<Arc<Tokenizer>> {
    let tok = AutoTokenizer::from_pretrained(assets().join("gpt2-tokenizer"))?;
    Ok(Arc::new(tok.tokenizer().clone()))
}

fn model() -> Result<Box<dyn PreTrainedModel>> {
    Ok(from_pretrained_dir(
        &assets().join("reference/trainer_clm/initial"),
        AutoTask::CausalLm,
        Device::Cpu,
        &LoadOptions::default(),
    )?
    .model)
}

fn args(name: &str, max_steps: i64) -> Result<TrainingArguments> {
    let out = std::env::temp_dir().join(format!("tchtrain-stream-{name}-{}", std::process::id()));
    let mut args = TrainingArguments {
        per_device_train_batch_size: 4,
        gradient_accumulation_steps: 2,
        max_steps,
        learning_rate: 1e-3,
        logging_steps: 1.0,
        save_strategy: SaveStrategy::No,
        train_sampling_strategy: "sequential".into(),
        seed: 42,
        use_cpu: true,
        report_to: vec![],
        disable_tqdm: true,
        ..TrainingArguments::new(out.display().to_string())
    };
    args.post_init()?;
    Ok(args)
}

fn losses(t: &Trainer) -> Vec<(f64, f64)> {
    t.state
        .log_history
        .iter()
        .filter_map(|e| Some((e.get("loss")?.as_f64()?, e.get("grad_norm")?.as_f64()?)))
        .collect()
}

#[test]
fn text_stream_trains_as_the_in_memory_blocks_do() -> Result<()> {
    let _g = lock();
    let hamlet = assets().join("text/hamlet.txt");
    let tokenizer = gpt2()?;
    let blocks = InMemoryDataset::new(causal_lm_blocks_from_file(&hamlet, &tokenizer, 64)?);
    let stream = CausalLmTextStream::new(&hamlet, Arc::clone(&tokenizer), 64)?;
    // Every block, in order, read chunk by chunk.
    let streamed: Vec<_> = stream
        .iter_epoch(0)?
        .collect::<tchtrain_data::Result<_>>()?;
    assert_eq!(streamed.len(), blocks.len());
    assert!(streamed.iter().zip(blocks.rows()).all(|(a, b)| a == b));

    // 6 steps x 2 x 4 blocks: the stream's order is the sequential sampler's.
    let mut in_memory = Trainer::builder(model()?, args("memory", 6)?)
        .train_dataset(blocks.take(48).into_shared())
        .build()?;
    in_memory.train(None)?;
    let mut streaming = Trainer::builder(model()?, args("stream", 6)?)
        .train_stream(Arc::new(stream.clone()))
        .build()?;
    let out = streaming.train(None)?;
    assert_eq!(out.global_step, 6);
    assert_eq!(losses(&streaming), losses(&in_memory));
    assert_eq!(losses(&streaming).len(), 6);
    Ok(())
}

#[test]
fn a_short_stream_is_read_again_until_max_steps() -> Result<()> {
    let _g = lock();
    // 20 blocks = 5 batches of 4: a pass gives 2 full windows and one of a single batch.
    let tokenizer = gpt2()?;
    let blocks = InMemoryDataset::new(causal_lm_blocks_from_file(
        assets().join("text/hamlet.txt"),
        &tokenizer,
        64,
    )?);
    let short = Arc::new(ShortStream(blocks.take(20)));
    let mut t = Trainer::builder(model()?, args("short", 7)?)
        .train_stream(short)
        .build()?;
    assert_eq!(t.train(None)?.global_step, 7);
    Ok(())
}

/// A stream over in-memory rows.
struct ShortStream(tchtrain_data::InMemoryDataset);

impl IterableDataset for ShortStream {
    fn iter_epoch(&self, _epoch: u64) -> tchtrain_data::Result<tchtrain_data::FeatureStream> {
        let rows: Vec<_> = (0..self.0.len()).map(|i| self.0.get(i)).collect();
        Ok(Box::new(rows.into_iter()))
    }
}

#[test]
fn stream_bad_input_is_an_error() -> Result<()> {
    let _g = lock();
    let tokenizer = gpt2()?;
    let stream = Arc::new(CausalLmTextStream::new(
        assets().join("text/hamlet.txt"),
        Arc::clone(&tokenizer),
        64,
    )?);
    // No max_steps: upstream's "args.max_steps must be set to a positive value".
    let mut no_steps = args("no-steps", -1)?;
    no_steps.num_train_epochs = 1.0;
    let mut t = Trainer::builder(model()?, no_steps)
        .train_stream(stream)
        .build()?;
    let err = t.train(None).unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidArgument {
                field: "max_steps",
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(t.state.global_step, 0);
    // A file that is not there: named, no step taken.
    let missing = assets().join("text/no-such-file.txt");
    let mut t = Trainer::builder(model()?, args("missing", 3)?)
        .train_stream(Arc::new(CausalLmTextStream::new(&missing, tokenizer, 64)?))
        .build()?;
    let err = t.train(None).unwrap_err();
    assert!(err.to_string().contains("no-such-file.txt"), "{err}");
    assert_eq!(t.state.global_step, 0);
    assert!(matches!(
        CausalLmTextStream::new(&missing, gpt2()?, 0),
        Err(tchtrain_datasets::Error::InvalidArgument {
            field: "block_size",
            ..
        })
    ));
    Ok(())
}
