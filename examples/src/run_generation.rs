//! Upstream `examples/pytorch/text-generation/run_generation.py`: continuations of a prompt
//! sampled from a causal LM, with the script's flags (`--model_type`, `--model_name_or_path`,
//! `--prompt`, `--length`, `--stop_token`, `--temperature`, `--repetition_penalty`, `--k`,
//! `--p`, `--prefix`, `--padding_text`, `--seed`, `--num_return_sequences`, `--use_cpu`).
//!
//! As upstream's: the model and the prompt on `PartialState(cpu=args.use_cpu).device`
//! (`cuda:LOCAL_RANK` where a CUDA device is visible, else the CPU), the seed set first, `length` adjusted to the model's positions, the prompt
//! (after `--prefix`, else `--padding_text`) encoded without special tokens, `generate` with
//! `do_sample=True`, `max_length = length + prompt length` and the flags' temperature,
//! `top_k`, `top_p` and repetition penalty over the model's `generation_config.json`; each
//! sequence decoded, cut at `--stop_token`, printed after `=== GENERATED SEQUENCE i ===`
//! with the prompt text in front. `--model_name_or_path` may name a LoRA adapter folder (its
//! base model with the adapter, as transformers' PEFT integration loads one).
//!
//! Refused with the reason: `--fp16` and `--jit` (half-precision CPU generation and
//! TorchScript tracing are not implemented here), `--xlm_language` (XLM is not a model here),
//! model types of upstream's list that no model here implements (`ctrl`, `xlnet`, ...).

use std::path::{Path, PathBuf};

use tch::{Device, Tensor};
use tchtrain_models::{
    AutoTask, GenerationConfig, LoadOptions, LoraConfig, from_pretrained_dir, generate,
};

use crate::common::{load_example_tokenizer, model_dir};
use crate::error::{Error, Result};
use crate::plain_args::{self as args, split_flags};
use tchtrain_models::HubOptions;

/// Upstream's `MODEL_CLASSES` keys (`--model_type` choices).
const MODEL_TYPES: [&str; 10] = [
    "gpt2",
    "ctrl",
    "openai-gpt",
    "xlnet",
    "transfo-xl",
    "xlm",
    "gptj",
    "bloom",
    "llama",
    "opt",
];

/// Upstream's `MAX_LENGTH`: the length when neither the flag nor the model bounds it.
const MAX_LENGTH: i64 = 10_000;

/// The script's flags, with upstream's defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationArgs {
    /// `--model_type` (required).
    pub model_type: Option<String>,
    /// `--model_name_or_path` (required).
    pub model_name_or_path: Option<String>,
    /// `--prompt` (asked for on standard input when empty).
    pub prompt: String,
    /// `--length`: new tokens (20).
    pub length: i64,
    /// `--stop_token`: the text is cut at its first occurrence.
    pub stop_token: Option<String>,
    /// `--temperature` (1.0).
    pub temperature: f64,
    /// `--repetition_penalty` (1.0).
    pub repetition_penalty: f64,
    /// `--k`: top-k (0: off).
    pub k: i64,
    /// `--p`: top-p (0.9).
    pub p: f64,
    /// `--prefix`: text put before the prompt.
    pub prefix: String,
    /// `--padding_text`: the prefix when `--prefix` is empty.
    pub padding_text: String,
    /// `--seed` (42).
    pub seed: i64,
    /// `--num_return_sequences` (1).
    pub num_return_sequences: i64,
    /// `--use_cpu`: the CPU even where a CUDA device is visible (else `cuda:LOCAL_RANK`, as
    /// upstream's `PartialState(cpu=args.use_cpu).device`).
    pub use_cpu: bool,
}

impl Default for GenerationArgs {
    fn default() -> Self {
        Self {
            model_type: None,
            model_name_or_path: None,
            prompt: String::new(),
            length: 20,
            stop_token: None,
            temperature: 1.0,
            repetition_penalty: 1.0,
            k: 0,
            p: 0.9,
            prefix: String::new(),
            padding_text: String::new(),
            seed: 42,
            num_return_sequences: 1,
            use_cpu: false,
        }
    }
}

const HELP: &str = "usage: run_generation --model_type TYPE --model_name_or_path PATH [options]

  --model_type TYPE            one of gpt2, llama (upstream's list also names ctrl, openai-gpt,
                               xlnet, transfo-xl, xlm, gptj, bloom, opt: not implemented here)
  --model_name_or_path PATH    model folder, hub id, or a LoRA adapter folder
  --prompt TEXT                the prompt (asked for on standard input when empty)
  --length N                   new tokens (default 20)
  --stop_token TEXT            cut each text at this token
  --temperature T              sampling temperature (default 1.0)
  --repetition_penalty R       (default 1.0)
  --k K                        top-k (default 0: off)
  --p P                        top-p (default 0.9)
  --prefix TEXT                text before the prompt
  --padding_text TEXT          the prefix when --prefix is empty
  --seed N                     random seed (default 42)
  --num_return_sequences N     sequences to sample (default 1)
  --use_cpu                    run on the CPU even where a CUDA device is visible
";

/// Parses the command line (without the program name).
pub fn parse_args<I, S>(argv: I) -> Result<GenerationArgs>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let argv: Vec<String> = argv.into_iter().map(|a| a.as_ref().to_string()).collect();
    if argv.iter().any(|a| a == "--help" || a == "-h") {
        return Err(Error::TrainingArgs(
            tchtrain_training_args::Error::HelpRequested(HELP.into()),
        ));
    }
    let mut a = GenerationArgs::default();
    for (name, value) in split_flags(&argv)? {
        let v = value.as_deref();
        match name.as_str() {
            "model_type" => {
                let t = args::string(&name, v)?;
                if !MODEL_TYPES.contains(&t.as_str()) {
                    return Err(Error::InvalidFlag {
                        flag: name,
                        detail: format!(
                            "invalid choice: '{t}' (choose from {})",
                            MODEL_TYPES.map(|m| format!("'{m}'")).join(", ")
                        ),
                    });
                }
                if !matches!(t.as_str(), "gpt2" | "llama") {
                    return Err(Error::InvalidFlag {
                        flag: name,
                        detail: format!(
                            "{t}: no {t} model is implemented here; gpt2 and llama are (Qwen2, Mistral and the other Llama-shaped families load as llama)"
                        ),
                    });
                }
                a.model_type = Some(t);
            }
            "model_name_or_path" => a.model_name_or_path = Some(args::string(&name, v)?),
            "prompt" => a.prompt = args::string(&name, v)?,
            "length" => a.length = args::number(&name, v)?,
            "stop_token" => a.stop_token = Some(args::string(&name, v)?),
            "temperature" => a.temperature = args::number(&name, v)?,
            "repetition_penalty" => a.repetition_penalty = args::number(&name, v)?,
            "k" => a.k = args::number(&name, v)?,
            "p" => a.p = args::number(&name, v)?,
            "prefix" => a.prefix = args::string(&name, v)?,
            "padding_text" => a.padding_text = args::string(&name, v)?,
            "seed" => a.seed = args::number(&name, v)?,
            "num_return_sequences" => a.num_return_sequences = args::number(&name, v)?,
            "use_cpu" => a.use_cpu = args::boolean(&name, v)?,
            "fp16" | "jit" => {
                return Err(Error::InvalidFlag {
                    flag: name,
                    detail: "half-precision CPU generation and TorchScript tracing are not implemented here; generate in float32 without it".into(),
                });
            }
            "xlm_language" => {
                return Err(Error::InvalidFlag {
                    flag: name,
                    detail: "XLM's language ids: no XLM model is implemented here".into(),
                });
            }
            _ => {
                return Err(Error::InvalidFlag {
                    flag: name,
                    detail: "unrecognized argument (see --help)".into(),
                });
            }
        }
    }
    if a.model_type.is_none() {
        return Err(Error::InvalidFlag {
            flag: "model_type".into(),
            detail: "the following arguments are required: --model_type".into(),
        });
    }
    if a.model_name_or_path.is_none() {
        return Err(Error::InvalidFlag {
            flag: "model_name_or_path".into(),
            detail: "the following arguments are required: --model_name_or_path".into(),
        });
    }
    Ok(a)
}

/// Upstream's `adjust_length_to_model`.
fn adjust_length_to_model(length: i64, max_sequence_length: i64) -> i64 {
    if max_sequence_length > 0 && (length < 0 || max_sequence_length < length) {
        max_sequence_length
    } else if length < 0 {
        MAX_LENGTH
    } else {
        length
    }
}

/// The folder with the model's `config.json`: the folder itself, or an adapter folder's
/// base model.
fn config_dir(dir: &Path) -> Result<PathBuf> {
    let adapter = dir.join(tchtrain_models::ADAPTER_CONFIG_NAME);
    if adapter.is_file() && !dir.join("config.json").is_file() {
        let config = LoraConfig::from_file(&adapter)?;
        if let Some(base) = config.base_model_name_or_path {
            return model_dir(Some(&base), None, &HubOptions::from_env());
        }
    }
    Ok(dir.to_path_buf())
}

/// Runs the script; returns the generated texts (prompt included), as printed.
pub fn main_with_args<I, S>(argv: I) -> Result<Vec<String>>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let a = parse_args(argv)?;
    // `set_seed(args)`.
    tch::manual_seed(a.seed);
    let hub = HubOptions::from_env();
    let dir = model_dir(a.model_name_or_path.as_deref(), None, &hub)?;
    let base_dir = config_dir(&dir)?;
    let tokenizer = load_example_tokenizer(&dir, None, &hub)
        .or_else(|_| load_example_tokenizer(&base_dir, None, &hub))?;
    // `distributed_state = PartialState(cpu=args.use_cpu)`; `model.to(distributed_state.device)`.
    let device = tchtrain_accelerate::default_device(a.use_cpu)?;
    let mut model =
        from_pretrained_dir(&dir, AutoTask::CausalLm, device, &LoadOptions::default())?.model;
    model.eval();
    // What the model read from its folder (an adapter folder's: its base's).
    let config = model.config().to_json_value()?;
    let max_positions = config["max_position_embeddings"]
        .as_i64()
        .or(config["n_positions"].as_i64());
    let length = adjust_length_to_model(a.length, max_positions.unwrap_or(0));
    log::info!("{a:?}");

    let prompt_text = if a.prompt.is_empty() {
        eprint!("Model prompt >>> ");
        let mut line = String::new();
        std::io::stdin()
            .read_line(&mut line)
            .map_err(|source| Error::Io {
                action: "reading",
                path: "<stdin>".into(),
                source,
            })?;
        line.trim_end_matches(['\n', '\r']).to_string()
    } else {
        a.prompt.clone()
    };
    let prefix = if a.prefix.is_empty() {
        &a.padding_text
    } else {
        &a.prefix
    };
    let encoded = tokenizer.encode(&format!("{prefix}{prompt_text}"), false)?;
    if encoded.is_empty() {
        return Err(Error::InvalidFlag {
            flag: "prompt".into(),
            detail: "the prompt encodes to no token: generating from nothing is not implemented here; give a prompt".into(),
        });
    }
    let input_ids = Tensor::from_slice(&encoded).unsqueeze(0).to_device(device);
    let mut generation = match model.generation_config() {
        Some(g) => GenerationConfig::from_json(g)?,
        None => GenerationConfig::default(),
    };
    generation.update(&GenerationConfig {
        max_length: Some(length + encoded.len() as i64),
        // `max_new_tokens` from the model's file would take precedence over the script's
        // `max_length`, as upstream's.
        temperature: Some(a.temperature),
        top_k: Some(a.k),
        top_p: Some(a.p),
        repetition_penalty: Some(a.repetition_penalty),
        do_sample: Some(true),
        num_return_sequences: Some(a.num_return_sequences),
        ..GenerationConfig::default()
    });
    let out = generate(&*model, &input_ids, None, &generation, max_positions)?;
    let prompt_decoded = tokenizer.decode(&encoded, false, Some(true))?;
    let rows: Vec<Vec<i64>> = Vec::<Vec<i64>>::try_from(&out.sequences.to_device(Device::Cpu))?;
    let mut texts = Vec::new();
    for (i, row) in rows.iter().enumerate() {
        println!("=== GENERATED SEQUENCE {} ===", i + 1);
        let text = tokenizer.decode(row, false, Some(true))?;
        // `text[: text.find(stop_token) if stop_token else None]`: a stop token that never
        // occurs (`find` gives -1) drops the last character, as upstream's.
        let text = match a.stop_token.as_deref() {
            Some(stop) => match text.find(stop) {
                Some(at) => &text[..at],
                None => text
                    .char_indices()
                    .last()
                    .map_or(&text[..], |(at, _)| &text[..at]),
            },
            None => &text[..],
        };
        // Python's `text[len(decoded prompt):]` counts characters.
        let rest: String = text.chars().skip(prompt_decoded.chars().count()).collect();
        let total = format!("{prompt_text}{rest}");
        println!("{total}");
        texts.push(total);
    }
    Ok(texts)
}
