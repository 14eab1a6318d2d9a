//! `SFTTrainer` on a vision-language model against trl 1.16 + transformers 5.23
//! (`scripts/reference/trl_sft_vlm.py`): the tiny-gemma3 asset (`Gemma3ForConditionalGeneration`,
//! `Gemma3Processor`) on a Parquet dataset of `messages` and `images` (none, one or two a row).
//!
//! - `Gemma3ImageProcessor` (torchvision backend, what AutoProcessor picks with torchvision
//!   installed): every image's `pixel_values` equal upstream's, resized or not, gray or RGB.
//! - `DataCollatorForVisionLanguageModeling`: the five train batches (`input_ids`,
//!   `attention_mask`, `token_type_ids`, `pixel_values`, `labels`) equal TRL's.
//! - 20 steps with TRL's default gradient checkpointing: every logged value (loss, grad_norm,
//!   learning_rate, entropy, mean_token_accuracy, num_tokens and the `eval_` ones) and the
//!   trained weights equal TRL's to the bit.
//! - A `max_length` that cuts image tokens, and a vision dataset without a processor: TRL's
//!   messages.

use std::collections::HashMap;

use anyhow::{Context, Result, ensure};
use tch::{Device, Tensor};
use tchtrain_collators::DataCollator;
use tchtrain_datasets::Table;
use tchtrain_models::{AutoTask, Gemma3Processor, LoadOptions, from_pretrained_dir};
use tchtrain_testing::{assets, lock, temp_dir};
use tchtrain_trl::{DataCollatorForVisionLanguageModeling, SFTConfig, SFTTrainer};

use crate::common::{assert_logs_equal, reference_arguments, tensors};

fn dir() -> std::path::PathBuf {
    assets().join("reference/trl_sft_vlm")
}

fn table(split: &str) -> Result<Table> {
    let path = dir().join("vlm").join(format!("{split}.parquet"));
    Table::read(&path).with_context(|| format!("{} (run `cargo xtask setup`)", path.display()))
}

fn config(out: &std::path::Path) -> SFTConfig {
    let mut config = SFTConfig::new(out.display().to_string());
    reference_arguments(&mut config.base);
    config.base.max_steps = 20;
    config.base.logging_steps = 5.0;
    config.base.eval_steps = Some(10.0);
    // TRL's default.
    config.base.gradient_checkpointing = true;
    config.bf16 = Some(false);
    config
}

fn builder(config: SFTConfig) -> Result<tchtrain_trl::SFTTrainerBuilder> {
    let model_dir = assets().join("tiny-gemma3");
    let model = from_pretrained_dir(
        &model_dir,
        AutoTask::CausalLm,
        Device::Cpu,
        &LoadOptions::default(),
    )?
    .model;
    let processor = Gemma3Processor::from_pretrained(&model_dir)?;
    Ok(SFTTrainer::builder_with_processor(model, config, processor))
}

#[test]
fn sft_vision_language_equals_trl() -> Result<()> {
    let _g = lock();
    let r: HashMap<String, Tensor> = tensors(&dir().join("processor.safetensors"))?;
    // The image processor, image by image (the train and test rows' images in order).
    let processor = Gemma3Processor::from_pretrained(&assets().join("tiny-gemma3"))?;
    let mut n = 0;
    for split in ["train", "test"] {
        let t = table(split)?;
        for row in 0..t.len() {
            let cell = t.cell(row, "images")?;
            for image in cell.as_array().context("images")? {
                let image = tchtrain_datasets::image_from_cell(image, None, "image")?;
                let (shape, values) = processor.image_processor.process_torchvision(&image)?;
                let ours = Tensor::from_slice(&values).reshape(shape.as_slice());
                let theirs = &r[&format!("image.{n}")];
                ensure!(
                    ours.equal(theirs),
                    "image {n} ({}x{} {}): differs by {}",
                    image.width,
                    image.height,
                    image.mode,
                    (&ours - theirs).abs().max()
                );
                n += 1;
            }
        }
    }
    ensure!(n >= 20, "{n} images compared");
    let out = temp_dir("sft-vlm");
    let mut trainer = builder(config(&out))?
        .train_dataset(table("train")?)
        .eval_dataset(table("test")?)
        .build()?;
    // The collator's batches.
    let rows = trainer.train_dataset().context("train dataset")?.clone();
    let mut collator = DataCollatorForVisionLanguageModeling {
        pad_token_id: processor
            .tokenizer
            .tokenizer()
            .token_to_id("<pad>")
            .context("pad")? as i64,
        pad_to_multiple_of: None,
    };
    for k in 0..5 {
        let features = (4 * k..4 * k + 4)
            .map(|i| rows.get(i))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let batch = collator.collate(&features)?;
        for key in [
            "input_ids",
            "attention_mask",
            "token_type_ids",
            "pixel_values",
            "labels",
        ] {
            let theirs = &r[&format!("batch.{k}.{key}")];
            let ours = batch
                .get(key)
                .with_context(|| format!("batch {k}: no {key}"))?;
            ensure!(ours.equal(theirs), "batch {k}: {key} differs");
        }
    }
    trainer.train(None)?;
    let expected: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
        dir().join("run/log_history.json"),
    )?)?;
    assert_logs_equal("sft-vlm", &trainer.state.log_history, &expected)?;
    let saved = out.join("saved");
    trainer.save_model(Some(&saved))?;
    let ours = tensors(&saved.join("model.safetensors"))?;
    let theirs = tensors(&dir().join("run/model/model.safetensors"))?;
    ensure!(
        ours.len() == theirs.len(),
        "{} saved tensors vs {}",
        ours.len(),
        theirs.len()
    );
    for (name, t) in &theirs {
        let o = ours
            .get(name)
            .with_context(|| format!("saved: no {name}"))?;
        ensure!(
            o.equal(t),
            "trained {name} differs by {}",
            (o - t).abs().max()
        );
    }
    let _ = std::fs::remove_dir_all(&out);
    Ok(())
}

#[test]
fn sft_vision_language_refuses_as_trl() -> Result<()> {
    let _g = lock();
    let out = temp_dir("sft-vlm-refusals");
    // Image tokens cut by max_length: the processor's message, when the row is fetched.
    let mut c = config(&out);
    c.max_length = Some(8);
    let trainer = builder(c)?.train_dataset(table("train")?).build()?;
    let Err(err) = trainer.train_dataset().context("train dataset")?.get(0) else {
        anyhow::bail!("row 0 cut inside its image tokens was accepted");
    };
    ensure!(
        err.to_string().contains("Mismatch in `image` token count"),
        "{err}"
    );
    // Packing.
    let mut c = config(&out);
    c.packing = true;
    let err = builder(c)?
        .train_dataset(table("train")?)
        .build()
        .err()
        .context("packing")?;
    ensure!(
        err.to_string()
            .contains("Packing is not supported for vision datasets"),
        "{err}"
    );
    // A vision dataset without a processor.
    let model = from_pretrained_dir(
        &assets().join("tiny-gemma3"),
        AutoTask::CausalLm,
        Device::Cpu,
        &LoadOptions::default(),
    )?
    .model;
    let tokenizer = tchtrain_models::AutoTokenizer::from_pretrained(assets().join("tiny-gemma3"))?;
    let err = SFTTrainer::builder(model, config(&out), tokenizer)
        .train_dataset(table("train")?)
        .build()
        .err()
        .context("no processor")?;
    ensure!(
        err.to_string().contains("appears to be vision-related"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&out);
    Ok(())
}
