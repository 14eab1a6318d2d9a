//! Upstream `examples/pytorch/translation/run_translation.py`: fine-tunes a
//! sequence-to-sequence model (T5, BART, Marian...) on JSON-lines files of translation
//! pairs and scores its generated translations with sacreBLEU.
//!
//! Steps as upstream: the files (`--train_file`, `--validation_file`: `.json` / `.jsonl`
//! JSON lines; `--test_file`), each row's `translation` object holding the
//! `--source_lang` / `--target_lang` texts (a language's part before `_`, as `en_XX` ->
//! `en`); `--max_train_samples` / `--max_eval_samples` / `--max_predict_samples`; the inputs
//! with `--source_prefix` in front truncated to `--max_source_length`, the targets
//! (`text_target`) to `--max_target_length` (evaluation and prediction:
//! `--val_max_target_length`), padded to those lengths with `--pad_to_max_length` (label
//! padding -100 unless `--ignore_pad_token_for_loss false`); `DataCollatorForSeq2Seq` given
//! the model (`default_data_collator` with `--pad_to_max_length`); `Seq2SeqTrainer`, whose
//! evaluations during training generate with `--generation_max_length` /
//! `--generation_num_beams`; the final evaluation and the prediction generate at most
//! `--generation_max_length` (else `--val_max_target_length`) tokens with `--num_beams`
//! beams. With `--predict_with_generate` the metrics are `bleu` (sacreBLEU's corpus BLEU of
//! the decoded, stripped texts, [`crate::sacrebleu`]) and `gen_len` (the mean count of
//! non-pad generated ids), rounded to 4 places; `--do_predict` writes
//! `predict_results.json` and `generated_predictions.txt`.
//!
//! `--dataset_name` / `--dataset_config_name` read a hub dataset repository's (or a local
//! folder's) `train` / `validation` / `test` splits, each split's files concatenated, in
//! place of the file flags, as upstream's `load_dataset`.
//!
//! Multilingual tokenizers (mBART, mBART-50, NLLB) get `--source_lang` / `--target_lang`
//! (`en_XX`, `ro_RO`) as their `src_lang` / `tgt_lang`: the inputs end with the source
//! code, the labels with the target's (mBART), and the dataset columns are the part before
//! `_`, as upstream's script. With an mBART tokenizer and a model config without
//! `decoder_start_token_id` (mBART-cc25's), the model's is set to `--target_lang`'s id, as
//! upstream's script does (saved in `config.json`; `generate` keeps the loaded generation
//! config, as transformers 5's).
//!
//! Not supported (refused with an error): M2M100's tokenizer (no fast form upstream),
//! `--forced_bos_token` with a multilingual tokenizer (transformers 5's `generate` refuses
//! what upstream's script does with it), a tokenizer larger than the model's embeddings (upstream resizes
//! them). `--preprocessing_num_workers` is accepted without effect.
//!
//! ```no_run
//! use tchtrain_examples::run_translation;
//! let out = run_translation::main_with_args([
//!     "--model_name_or_path", "t5-tiny", "--source_lang", "en", "--target_lang", "ro",
//!     "--source_prefix", "translate English to Romanian: ",
//!     "--train_file", "train.json", "--validation_file", "dev.json",
//!     "--do_train", "--do_eval", "--predict_with_generate", "--output_dir", "out/tr",
//! ])?;
//! println!("{:?}", out.eval_metrics);
//! # Ok::<(), tchtrain_examples::Error>(())
//! ```

use serde_json::Value;
use tchtrain_data::InMemoryDataset;
use tchtrain_datasets::{MapCache, Table, cell_text};
use tchtrain_models::{GenerationConfig, PreTrainedTokenizerFast};
use tchtrain_trainer::{EvalPrediction, Metrics};
use tchtrain_training_args::{Dataclass, FieldSpec, Seq2SeqTrainingArguments};

use super::ExampleOutput;
use super::args::{self, ScriptCommandLine, fields};
use super::sacrebleu;
use super::seq2seq_example::{
    self as s2s, Drive, PositionCheck, Seq2SeqDataArguments, Seq2SeqTokenization, Split,
};
use crate::error::{Error, Result};
use crate::sacrebleu::py_isspace;

/// The script's own arguments (upstream's `ModelArguments` and `DataTrainingArguments`;
/// see [`COMMAND_LINE`]).
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
pub struct TranslationArguments {
    /// The flags `run_summarization` has too.
    #[serde(flatten)]
    pub data: Seq2SeqDataArguments,
    /// `--source_lang`: the key of the input text in each row's `translation` (required).
    pub source_lang: Option<String>,
    /// `--target_lang`: the key of the target text (required).
    pub target_lang: Option<String>,
}

impl Default for TranslationArguments {
    /// Upstream's defaults (the tables').
    fn default() -> Self {
        args::defaults(COMMAND_LINE)
            .unwrap_or_else(|e| unreachable!("run_translation's defaults read: {e}"))
    }
}

/// Upstream's `ModelArguments` of run_translation.py.
static MODEL_ARGUMENTS: Dataclass = Dataclass {
    name: "ModelArguments",
    fields: &s2s::MODEL_FIELDS,
};

/// Upstream's `DataTrainingArguments` of run_translation.py.
static DATA_TRAINING_ARGUMENTS: Dataclass = Dataclass {
    name: "DataTrainingArguments",
    fields: &[
        FieldSpec::str("source_lang", "None", "Source language id for translation."),
        FieldSpec::str("target_lang", "None", "Target language id for translation."),
        fields::DATASET_NAME,
        fields::DATASET_CONFIG_NAME,
        FieldSpec::str(
            "train_file",
            "None",
            "The input training data file (a jsonlines).",
        ),
        FieldSpec::str(
            "validation_file",
            "None",
            "An optional input evaluation data file to evaluate the metrics (sacrebleu) on a jsonlines file.",
        ),
        FieldSpec::str(
            "test_file",
            "None",
            "An optional input test data file to evaluate the metrics (sacrebleu) on a jsonlines file.",
        ),
        s2s::DATA_FIELDS[0],
        s2s::DATA_FIELDS[1],
        s2s::DATA_FIELDS[2],
        s2s::DATA_FIELDS[3],
        s2s::DATA_FIELDS[4],
        s2s::DATA_FIELDS[5],
        s2s::DATA_FIELDS[6],
        s2s::DATA_FIELDS[7],
        s2s::DATA_FIELDS[8],
        s2s::DATA_FIELDS[9],
        s2s::DATA_FIELDS[10],
        s2s::DATA_FIELDS[11],
        s2s::DATA_FIELDS[12],
    ],
};

/// The command line: upstream's dataclasses.
pub const COMMAND_LINE: &[&Dataclass] = &[&MODEL_ARGUMENTS, &DATA_TRAINING_ARGUMENTS];

const LINE: ScriptCommandLine = ScriptCommandLine {
    title: "run_translation: sequence-to-sequence translation (upstream examples/pytorch/translation/run_translation.py)",
    dataclasses: COMMAND_LINE,
    refused: &s2s::REFUSED,
};

/// Parses a command line (without the program name) into the script's flags and
/// `Seq2SeqTrainingArguments`, with upstream's `__post_init__` checks.
pub fn parse_args<I, S>(argv: I) -> Result<(TranslationArguments, Seq2SeqTrainingArguments)>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let (values, training) = args::parse_seq2seq(argv, &LINE)?;
    let mut flags: TranslationArguments = values.take(&[0, 1])?;
    let (source, target) = (flags.source_lang.is_some(), flags.target_lang.is_some());
    flags.data.post_init(
        "Need either a dataset name or a training/validation file.",
        false,
        &["json", "jsonl"],
        "a jsonlines file",
        || {
            if source && target {
                Ok(())
            } else {
                Err(Error::InvalidFlag {
                    flag: if source { "target_lang" } else { "source_lang" }.into(),
                    detail: "Need to specify the source language and the target language.".into(),
                })
            }
        },
    )?;
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

/// The source and target texts of a split's rows (`ex[source_lang]` of each row's
/// `translation`), the first `max`.
fn read_pairs(
    table: &Table,
    source: &str,
    target: &str,
    max: Option<usize>,
) -> Result<(Vec<String>, Vec<String>)> {
    let n = max.map_or(table.len(), |m| m.min(table.len()));
    let (mut inputs, mut targets) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for row in 0..n {
        let cell = table.cell(row, "translation")?;
        let text = |lang: &str| -> Result<String> {
            match cell.get(lang) {
                Some(v) if !v.is_null() => Ok(cell_text(v)),
                _ => Err(Error::DataFile {
                    path: table.path().to_path_buf(),
                    line: row + 1,
                    detail: format!(
                        "the row's `translation` has no '{lang}' text (it holds {})",
                        match cell {
                            Value::Object(o) => o.keys().cloned().collect::<Vec<_>>().join(", "),
                            other => other.to_string(),
                        }
                    ),
                }),
            }
        };
        inputs.push(text(source)?);
        targets.push(text(target)?);
    }
    Ok((inputs, targets))
}

/// The scripts' `preprocess_function` on picked inputs and targets: the inputs with
/// `--source_prefix` in front truncated to `--max_source_length`, the targets (tokenized as
/// `text_target`) truncated to `max_target_length`, both padded to those lengths with
/// `--pad_to_max_length` (then the label padding is -100 with
/// `--ignore_pad_token_for_loss`); the target ids are the rows' `labels`.
///
/// ```no_run
/// use tchtrain_data::Dataset;
/// use tchtrain_examples::{Seq2SeqDataArguments, run_translation::preprocess_function};
/// let tok = tchtrain_models::AutoTokenizer::from_pretrained("t5-tiny")?;
/// let data = Seq2SeqDataArguments { max_source_length: 32, ..Default::default() };
/// let rows = preprocess_function(&tok, &data, &["Hello".into()], &["Salut".into()], 16)?;
/// println!("{:?}", rows.get(0)?.labels);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn preprocess_function(
    tokenizer: &PreTrainedTokenizerFast,
    data: &Seq2SeqDataArguments,
    inputs: &[String],
    targets: &[String],
    max_target_length: usize,
) -> Result<InMemoryDataset> {
    let tok = Seq2SeqTokenization {
        tokenizer,
        prefix: data.source_prefix.clone().unwrap_or_default(),
        max_source_length: data.max_source_length,
        pad_to_max_length: data.pad_to_max_length,
        ignore_pad_token_for_loss: data.ignore_pad_token_for_loss,
        function: "run_translation.preprocess_function",
    };
    Ok(InMemoryDataset::new(tok.features(
        inputs,
        targets,
        max_target_length,
    )?))
}

/// Upstream's `compute_metrics`: sacreBLEU of the stripped decoded texts and `gen_len`,
/// rounded to 4 places.
fn translation_metrics(
    tokenizer: PreTrainedTokenizerFast,
) -> impl FnMut(&EvalPrediction) -> tchtrain_trainer::Result<Metrics> + Send + 'static {
    move |p: &EvalPrediction| {
        let (preds, labels, gen_len) = s2s::decoded(&tokenizer, p)?;
        let strip = |v: Vec<String>| -> Vec<String> {
            v.iter()
                .map(|t| t.trim_matches(py_isspace).to_string())
                .collect()
        };
        let (preds, labels) = (strip(preds), strip(labels));
        let bleu = sacrebleu::corpus_bleu(&preds, &labels).score;
        Ok(Metrics::from([
            ("bleu".to_string(), s2s::py_round(bleu)),
            ("gen_len".to_string(), s2s::py_round(gen_len)),
        ]))
    }
}

/// Upstream's block for `MULTILINGUAL_TOKENIZERS` (mBART, mBART-50; NLLB here too): both
/// languages required, `tokenizer.src_lang` / `tgt_lang` set from `--source_lang` /
/// `--target_lang` (`en_XX`, `ro_RO`). Upstream also sets `model.config.forced_bos_token_id`
/// from `--forced_bos_token`: with transformers 5 a generation setting on the model config
/// makes `generate` raise ("You have modified the pretrained model configuration to control
/// generation"), so the flag is refused up front with that reason and the fix (the model's
/// `generation_config.json`); without it nothing changes, as upstream (`None` is no setting).
fn set_language_codes(
    tokenizer: &mut PreTrainedTokenizerFast,
    flags: &TranslationArguments,
    data: &Seq2SeqDataArguments,
) -> Result<()> {
    if tokenizer.language_codes().is_none() {
        return Ok(());
    }
    let class = tokenizer
        .config()
        .get("tokenizer_class")
        .and_then(|v| v.as_str())
        .unwrap_or_default()
        .to_string();
    let (Some(src), Some(tgt)) = (&flags.source_lang, &flags.target_lang) else {
        return Err(Error::InvalidFlag {
            flag: "source_lang".into(),
            detail: format!(
                "{class} is a multilingual tokenizer which requires --source_lang and --target_lang arguments."
            ),
        });
    };
    tokenizer.set_src_lang(src)?;
    tokenizer.set_tgt_lang(tgt)?;
    if let Some(token) = &data.forced_bos_token {
        return Err(Error::InvalidFlag {
            flag: "forced_bos_token".into(),
            detail: format!(
                "`{token}`: upstream's script sets `model.config.forced_bos_token_id` from it, and transformers 5's `generate` then raises (\"You have modified the pretrained model configuration to control generation\"); set `forced_bos_token_id` in the model's generation_config.json (or `--generation_config`) and remove the flag"
            ),
        });
    }
    Ok(())
}

/// Runs the script with parsed arguments.
pub fn run(
    flags: &TranslationArguments,
    training: Seq2SeqTrainingArguments,
) -> Result<ExampleOutput> {
    let mut data = flags.data.clone();
    data.resolve_dataset()?;
    let data = &data;
    data.check_steps(&training)?;
    data.warn_t5_prefix(
        "which is expected, e.g. with `--source_prefix 'translate English to German: ' `",
    );
    let mut loaded = s2s::load_model(
        data,
        &training,
        PositionCheck::Translation,
        flags.target_lang.as_deref(),
    )?;
    set_language_codes(&mut loaded.tokenizer, flags, data)?;
    if !s2s::something_to_do(&training) {
        return Ok(ExampleOutput {
            output_dir: training.base.output_dir().into(),
            ..ExampleOutput::default()
        });
    }
    let lang = |l: &Option<String>| {
        l.as_deref()
            .unwrap_or_default()
            .split('_')
            .next()
            .unwrap_or_default()
            .to_string()
    };
    let (source_lang, target_lang) = (lang(&flags.source_lang), lang(&flags.target_lang));
    let tok = Seq2SeqTokenization {
        tokenizer: &loaded.tokenizer,
        prefix: data.source_prefix.clone().unwrap_or_default(),
        max_source_length: data.max_source_length,
        pad_to_max_length: data.pad_to_max_length,
        ignore_pad_token_for_loss: data.ignore_pad_token_for_loss,
        function: "run_translation.preprocess_function",
    };
    let cache = MapCache::from_env()?;
    let split = |split: &str, max: Option<usize>, target_len: usize| -> Result<Split> {
        let table = data.split_table(split)?;
        let (inputs, targets) = read_pairs(&table, &source_lang, &target_lang, max)?;
        let dataset = tok.dataset(
            &inputs,
            &targets,
            target_len,
            cache.as_ref(),
            data.overwrite_cache,
        )?;
        let samples = inputs.len();
        Ok(Split { dataset, samples })
    };
    let b = &training.base;
    let val_len = data.val_max_target_length();
    let train = b
        .do_train
        .then(|| split("train", data.max_train_samples, data.max_target_length))
        .transpose()?;
    let eval = b
        .do_eval
        .then(|| split("validation", data.max_eval_samples, val_len))
        .transpose()?;
    let test = b
        .do_predict
        .then(|| split("test", data.max_predict_samples, val_len))
        .transpose()?;
    let gen_kwargs = GenerationConfig {
        max_length: Some(training.generation_max_length.unwrap_or(val_len as i64)),
        num_beams: data.num_beams.or(training.generation_num_beams),
        ..GenerationConfig::default()
    };
    let metrics = training.predict_with_generate.then(|| {
        Box::new(translation_metrics(loaded.tokenizer.clone())) as tchtrain_trainer::ComputeMetrics
    });
    let languages: Vec<String> = [&flags.source_lang, &flags.target_lang]
        .into_iter()
        .flatten()
        .cloned()
        .collect();
    s2s::drive(
        &training,
        loaded,
        train,
        eval,
        test,
        Drive {
            eval_gen: Some(gen_kwargs.clone()),
            predict_gen: Some(gen_kwargs),
            metrics,
            default_collator: data.pad_to_max_length,
            ignore_pad_token_for_loss: data.ignore_pad_token_for_loss,
            card: {
                let mut card = crate::common::card_options(
                    data.model_name_or_path.as_deref(),
                    "translation",
                    data.dataset_name.as_deref(),
                    data.dataset_config_name.as_deref(),
                );
                card.language = languages;
                card
            },
        },
    )
}
