//! Upstream `examples/pytorch/image-classification/run_image_classification.py`: fine-tunes an
//! image classifier (ViT, SigLIP) on a dataset with an `Image` column and a `ClassLabel`
//! column, scored by accuracy.
//!
//! Steps as upstream's script: the `--dataset_name` splits (`train`, `validation`; a hub
//! dataset repository or a local folder laid out as one, Parquet files with `datasets`'
//! `Image` column), the columns checked, the labels' names from the `ClassLabel` feature;
//! `AutoModelForImageClassification` with that many labels (the names written into the saved
//! `config.json`), the image processor's size (`shortest_edge`, else `(height, width)`) and
//! mean / std; torchvision's transforms applied when a row is fetched ([`tchtrain_models::
//! transforms`]): training `RandomResizedCrop`, `RandomHorizontalFlip`, `ToTensor`,
//! `Normalize` drawing from the global generator in upstream's order (the Trainer fetches one
//! batch ahead, as accelerate's loader), evaluation `Resize`, `CenterCrop`, `ToTensor`,
//! `Normalize`; the script's `collate_fn`; the accuracy of the arg-max logits.
//!
//! Refused, naming the flag: image folders (`--train_dir` / `--validation_dir`: the
//! `imagefolder` builder), a dataset without a validation split (upstream splits
//! `--train_val_split` off with numpy's global generator), `--remove_unused_columns` left true (upstream's Trainer then drops the image column the
//! transforms read: its README passes `--remove_unused_columns False`), `--model_type`,
//! `--trust_remote_code`, `--dataloader_num_workers` above 0 (upstream's workers draw the
//! crops from their own generators).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tch::Device;
use tchtrain_collators::{Column, DefaultDataCollator, Feature, Label};
use tchtrain_data::Dataset;
use tchtrain_datasets::{DecodedImage, Table, class_label_names, image_from_cell};
use tchtrain_models::pil_resize::Filter;
use tchtrain_models::transforms::{
    RandomResizedCrop, Size, center_crop, normalize, random_horizontal_flip, resize, to_tensor,
};
use tchtrain_models::{AutoTask, ImageProcessor, LoadOptions, from_pretrained_dir};
use tchtrain_trainer::{EvalPrediction, Metrics, Trainer};
use tchtrain_training_args::{Dataclass, FieldSpec, TrainingArguments};

use super::ExampleOutput;
use super::args::{self, Refusal, ScriptCommandLine, fields, refusals};
use super::common;
use crate::error::{Error, Result};

/// The script's arguments (upstream's `ModelArguments` and `DataTrainingArguments`).
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[allow(missing_docs)]
pub struct ImageClassificationArguments {
    pub model_name_or_path: Option<String>,
    pub config_name: Option<String>,
    pub cache_dir: Option<String>,
    pub model_revision: String,
    pub image_processor_name: Option<String>,
    pub token: Option<String>,
    pub ignore_mismatched_sizes: bool,
    pub dataset_name: Option<String>,
    pub dataset_config_name: Option<String>,
    pub image_column_name: String,
    pub label_column_name: String,
    pub train_val_split: Option<f64>,
    pub max_train_samples: Option<usize>,
    pub max_eval_samples: Option<usize>,
}

impl Default for ImageClassificationArguments {
    fn default() -> Self {
        args::defaults(COMMAND_LINE)
            .unwrap_or_else(|e| unreachable!("run_image_classification's defaults read: {e}"))
    }
}

static MODEL_ARGUMENTS: Dataclass = Dataclass {
    name: "ModelArguments",
    fields: &[
        FieldSpec::str(
            "model_name_or_path",
            "google/vit-base-patch16-224-in21k",
            "Path to pretrained model or model identifier from huggingface.co/models",
        ),
        FieldSpec::str(
            "model_type",
            "None",
            "If training from scratch, pass a model type from the list: vit, siglip",
        ),
        fields::CONFIG_NAME,
        fields::CACHE_DIR,
        fields::MODEL_REVISION,
        FieldSpec::str(
            "image_processor_name",
            "None",
            "Name or path of preprocessor config.",
        ),
        fields::TOKEN,
        fields::TRUST_REMOTE_CODE,
        fields::IGNORE_MISMATCHED_SIZES,
    ],
};

static DATA_TRAINING_ARGUMENTS: Dataclass = Dataclass {
    name: "DataTrainingArguments",
    fields: &[
        fields::DATASET_NAME,
        fields::DATASET_CONFIG_NAME,
        FieldSpec::str(
            "image_column_name",
            "image",
            "The name of the dataset column containing the image data. Defaults to 'image'.",
        ),
        FieldSpec::str(
            "label_column_name",
            "label",
            "The name of the dataset column containing the labels. Defaults to 'label'.",
        ),
        FieldSpec::str(
            "train_dir",
            "None",
            "A folder containing the training data.",
        ),
        FieldSpec::str(
            "validation_dir",
            "None",
            "A folder containing the validation data.",
        ),
        FieldSpec::float(
            "train_val_split",
            "0.15",
            "Percent to split off of train for validation.",
        ),
        fields::MAX_TRAIN_SAMPLES,
        fields::MAX_EVAL_SAMPLES,
    ],
};

/// The command line: upstream's dataclasses.
pub const COMMAND_LINE: &[&Dataclass] = &[&MODEL_ARGUMENTS, &DATA_TRAINING_ARGUMENTS];

const REFUSED: [Refusal; 4] = [
    refusals::TRUST_REMOTE_CODE,
    Refusal {
        flag: "model_type",
        reason: "training from scratch is not supported: give --model_name_or_path",
    },
    Refusal {
        flag: "train_dir",
        reason: "the imagefolder builder is not implemented here: lay the images out as a dataset repository (Parquet files with an Image column) and give --dataset_name",
    },
    Refusal {
        flag: "validation_dir",
        reason: "the imagefolder builder is not implemented here: lay the images out as a dataset repository (Parquet files with an Image column) and give --dataset_name",
    },
];

const LINE: ScriptCommandLine = ScriptCommandLine {
    title: "run_image_classification: image classification (upstream examples/pytorch/image-classification/run_image_classification.py)",
    dataclasses: COMMAND_LINE,
    refused: &REFUSED,
};

/// Parses a command line (without the program name).
pub fn parse_args<I, S>(argv: I) -> Result<(ImageClassificationArguments, TrainingArguments)>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let (values, training) = args::parse(argv, &LINE)?;
    let flags: ImageClassificationArguments = values.take(&[0, 1])?;
    if flags.dataset_name.is_none() {
        return Err(Error::InvalidFlag {
            flag: "dataset_name".into(),
            detail: "You must specify either a dataset name from the hub or a train and/or validation directory.".into(),
        });
    }
    Ok((flags, training))
}

/// Runs the script on `argv` (the command line without the program name).
pub fn main_with_args<I, S>(argv: I) -> Result<ExampleOutput>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let (flags, training) = parse_args(argv)?;
    run(&flags, training)
}

/// The transforms of one split (upstream's `_train_transforms` / `_val_transforms`).
#[derive(Debug, Clone)]
struct Transforms {
    size: Size,
    mean: Vec<f32>,
    std: Vec<f32>,
    train: bool,
}

/// A split's images and labels, transformed when a row is fetched (upstream's
/// `set_transform`): the training crops and flips draw from the global generator then.
struct TransformedImages {
    images: Vec<DecodedImage>,
    labels: Vec<i64>,
    transforms: Transforms,
}

impl Dataset for TransformedImages {
    fn len(&self) -> usize {
        self.images.len()
    }

    fn labels(&self, index: usize) -> tchtrain_data::Result<Option<Label>> {
        let label = self
            .labels
            .get(index)
            .ok_or(tchtrain_data::Error::IndexOutOfRange {
                index,
                len: self.labels.len(),
            })?;
        Ok(Some(Label::Class(*label)))
    }

    fn get(&self, index: usize) -> tchtrain_data::Result<Feature> {
        let image = self
            .images
            .get(index)
            .ok_or(tchtrain_data::Error::IndexOutOfRange {
                index,
                len: self.images.len(),
            })?;
        let t = &self.transforms;
        let bad = |e: tchtrain_models::Error| tchtrain_data::Error::InvalidArgument {
            field: "image",
            detail: format!("row {index}: {e}"),
        };
        let image = if t.train {
            let (h, w) = match t.size {
                Size::Exact(h, w) => (h, w),
                Size::ShortestEdge(s) => (s, s),
            };
            random_horizontal_flip(
                &RandomResizedCrop::new(h, w).apply(image).map_err(bad)?,
                0.5,
            )
        } else {
            let resized = resize(image, t.size, Filter::Bilinear).map_err(bad)?;
            let (h, w) = match t.size {
                Size::Exact(h, w) => (h, w),
                Size::ShortestEdge(s) => (s, s),
            };
            center_crop(&resized, h, w)
        };
        let pixels = normalize(&to_tensor(&image), &t.mean, &t.std).map_err(bad)?;
        let values = Vec::<f32>::try_from(pixels.reshape([-1])).map_err(|e| {
            tchtrain_data::Error::InvalidArgument {
                field: "pixel_values",
                detail: format!("row {index}: {e}"),
            }
        })?;
        Ok(Feature::default()
            .with_column(
                "pixel_values",
                Column::Floats {
                    shape: pixels.size(),
                    values,
                },
            )
            .with_labels(Label::Class(self.labels[index])))
    }
}

/// A split's images (converted to RGB, as the transforms' `pil_img.convert("RGB")`) and labels;
/// with `max`, upstream's `shuffle(seed=seed).select(range(max))` first (numpy's
/// `default_rng(seed).permutation`, [`tchtrain_datasets::numpy_random`]).
fn read_split(
    table: &Table,
    flags: &ImageClassificationArguments,
    max: Option<usize>,
    seed: u64,
    flag: &str,
) -> Result<(Vec<DecodedImage>, Vec<i64>)> {
    let rows: Vec<usize> = match max {
        None => (0..table.len()).collect(),
        Some(m) => {
            if m > table.len() {
                return Err(Error::InvalidFlag {
                    flag: flag.into(),
                    detail: format!(
                        "{m} rows asked of a split of {} (upstream's `select(range({m}))` raises IndexError)",
                        table.len()
                    ),
                });
            }
            let mut order =
                tchtrain_datasets::numpy_random::default_rng(seed).permutation(table.len());
            order.truncate(m);
            order
        }
    };
    let (mut images, mut labels) = (Vec::new(), Vec::new());
    for i in rows {
        let what = format!("row {i} of {}", table.path().display());
        let cell = table.cell(i, &flags.image_column_name)?;
        images.push(image_from_cell(cell, table.path().parent(), &what)?.to_rgb());
        let label = table.cell(i, &flags.label_column_name)?;
        labels.push(label.as_i64().ok_or_else(|| Error::DataFile {
            path: table.path().to_path_buf(),
            line: i + 1,
            detail: format!("the label {label} is not a class id (a ClassLabel column)"),
        })?);
    }
    Ok((images, labels))
}

/// Upstream's `compute_metrics`: the accuracy of the arg-max logits.
fn accuracy(p: &EvalPrediction) -> tchtrain_trainer::Result<Metrics> {
    let logits = p.predictions.concatenated()?;
    let labels = p
        .label_ids
        .as_ref()
        .ok_or_else(|| tchtrain_trainer::Error::InvalidArgument {
            field: "compute_metrics",
            detail: "the evaluation has no labels".into(),
        })?
        .concatenated()?;
    let predicted = logits.f_argmax(1, false)?;
    let correct = predicted
        .f_eq_tensor(&labels)?
        .f_to_kind(tch::Kind::Double)?;
    let accuracy = correct.f_mean(tch::Kind::Double)?.double_value(&[]);
    Ok(Metrics::from([("accuracy".to_string(), accuracy)]))
}

/// Runs the script with parsed arguments.
pub fn run(
    flags: &ImageClassificationArguments,
    training: TrainingArguments,
) -> Result<ExampleOutput> {
    let output_dir = PathBuf::from(training.output_dir());
    if training.remove_unused_columns {
        return Err(Error::InvalidFlag {
            flag: "remove_unused_columns".into(),
            detail: "the transforms read the image column, which upstream's Trainer removes with --remove_unused_columns true (its README passes --remove_unused_columns False): pass --remove_unused_columns False".into(),
        });
    }
    if training.dataloader_num_workers > 0 {
        return Err(Error::InvalidFlag {
            flag: "dataloader_num_workers".into(),
            detail: "upstream's loader workers draw the random crops from their own generators (seeded per worker), which is not reproduced here: leave it at 0".into(),
        });
    }
    let name = flags.dataset_name.as_deref().unwrap_or_default();
    let splits = common::load_dataset_splits(
        name,
        flags.dataset_config_name.as_deref(),
        flags.token.as_deref(),
    )?;
    let read = |split: &str| -> Result<Option<(Table, Vec<PathBuf>)>> {
        let Some(files) = splits.get(split) else {
            return Ok(None);
        };
        Ok(Some((common::concat_files(files)?, files.to_vec())))
    };
    let train = read("train")?;
    let validation = read("validation")?;
    let first = train
        .as_ref()
        .or(validation.as_ref())
        .ok_or_else(|| Error::InvalidFlag {
            flag: "dataset_name".into(),
            detail: format!("the dataset {name} has neither a train nor a validation split"),
        })?;
    for (flag, column) in [
        ("image_column_name", &flags.image_column_name),
        ("label_column_name", &flags.label_column_name),
    ] {
        if !first.0.columns().iter().any(|c| c == column) {
            return Err(Error::InvalidFlag {
                flag: flag.into(),
                detail: format!(
                    "--{flag} {column} not found in dataset '{name}'. Make sure to set `--{flag}` to the correct column - one of {}.",
                    first.0.columns().join(", ")
                ),
            });
        }
    }
    if validation.is_none() && flags.train_val_split.is_some_and(|s| s > 0.0) {
        return Err(Error::InvalidFlag {
            flag: "train_val_split".into(),
            detail: "the dataset has no validation split, and upstream splits one off the training split with numpy's generator (`train_test_split`), which is not reproduced here: give the dataset a validation split".into(),
        });
    }
    let (train_table, train_files) = train.ok_or_else(|| Error::InvalidFlag {
        flag: "dataset_name".into(),
        detail: format!(
            "the dataset {name} has no train split (upstream reads the labels' names from it)"
        ),
    })?;
    let names = class_label_names(&train_files[0], &flags.label_column_name)?.ok_or_else(|| {
        Error::InvalidFlag {
            flag: "label_column_name".into(),
            detail: format!(
                "the column {} of {} is not a ClassLabel (upstream reads `features[label_column_name].names`)",
                flags.label_column_name,
                train_files[0].display()
            ),
        }
    })?;

    // Model and image processor.
    let (_hub, dir) = common::resolve_model_dir(
        flags.model_name_or_path.as_deref(),
        flags.config_name.as_deref(),
        flags.cache_dir.as_deref(),
        &flags.model_revision,
        flags.token.as_deref(),
    )?;
    let processor_dir = match &flags.image_processor_name {
        Some(n) => PathBuf::from(n),
        None => dir.clone(),
    };
    let processor = ImageProcessor::from_pretrained(&processor_dir)?.config;
    tch::manual_seed(training.seed as i64);
    let options = LoadOptions {
        ignore_mismatched_sizes: flags.ignore_mismatched_sizes,
        ..LoadOptions::default()
    };
    let model = from_pretrained_dir(
        &dir,
        AutoTask::ImageClassification {
            num_labels: Some(names.len() as i64),
        },
        Device::Cpu,
        &options,
    )?
    .model;
    let size = match (
        processor.size.shortest_edge,
        processor.size.height,
        processor.size.width,
    ) {
        (Some(s), _, _) => Size::ShortestEdge(s),
        (None, Some(h), Some(w)) => Size::Exact(h, w),
        _ => {
            return Err(Error::InvalidArgument {
                field: "size",
                detail: format!(
                    "{}: the image processor's size has neither shortest_edge nor height and width",
                    processor_dir.display()
                ),
            });
        }
    };
    let transforms = |train: bool| Transforms {
        size,
        mean: processor.image_mean.iter().map(|&m| m as f32).collect(),
        std: processor.image_std.iter().map(|&s| s as f32).collect(),
        train,
    };
    let mut builder = Trainer::builder(model, training.clone())
        .data_collator(DefaultDataCollator)
        .compute_metrics(Box::new(accuracy));
    if training.do_train {
        let (images, labels) = read_split(
            &train_table,
            flags,
            flags.max_train_samples,
            training.seed,
            "max_train_samples",
        )?;
        builder = builder.train_dataset(Arc::new(TransformedImages {
            images,
            labels,
            transforms: transforms(true),
        }));
    }
    if training.do_eval {
        let (table, _) = validation.ok_or_else(|| Error::InvalidFlag {
            flag: "do_eval".into(),
            detail: format!("the dataset {name} has no validation split"),
        })?;
        let (images, labels) = read_split(
            &table,
            flags,
            flags.max_eval_samples,
            training.seed,
            "max_eval_samples",
        )?;
        builder = builder.eval_dataset(Arc::new(TransformedImages {
            images,
            labels,
            transforms: transforms(false),
        }));
    }
    let mut trainer = builder.build()?;
    let mut out = ExampleOutput {
        output_dir: output_dir.clone(),
        ..ExampleOutput::default()
    };
    if training.do_train {
        let metrics = common::do_train(&mut trainer, None, |saved: &Path| {
            crate::run_classification::write_label_names(saved, &names)?;
            let src = processor_dir.join("preprocessor_config.json");
            let dst = saved.join("preprocessor_config.json");
            std::fs::copy(&src, &dst).map_err(|e| Error::io("copying", &src, e))?;
            Ok(())
        })?;
        out.train_metrics = Some(metrics);
    }
    if training.do_eval {
        let metrics = trainer.evaluate(None, "eval")?;
        trainer.log_metrics("eval", &metrics);
        trainer.save_metrics("eval", &metrics, true)?;
        out.eval_metrics = Some(metrics);
    }
    let card = tchtrain_trainer::ModelCardOptions {
        finetuned_from: flags.model_name_or_path.clone(),
        tasks: vec!["image-classification".into()],
        dataset: flags.dataset_name.iter().cloned().collect(),
        tags: vec!["image-classification".into(), "vision".into()],
        ..Default::default()
    };
    common::push_or_write_model_card(&mut trainer, card)?;
    Ok(out)
}
