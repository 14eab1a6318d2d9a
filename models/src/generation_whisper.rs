//! Whisper's own `generate` (upstream `models/whisper/generation_whisper.py`,
//! `WhisperGenerationMixin.generate`) for short-form audio (at most 30 s, `input_features`
//! `[batch, num_mel_bins, 2 * max_source_positions]`): the decoder prompt of
//! `_retrieve_init_tokens` (`<|startoftranscript|>`, the language token given or detected,
//! the task token, `<|notimestamps|>`; the legacy `forced_decoder_ids` converted), the
//! processors Whisper adds (`SuppressTokensAtBeginLogitsProcessor` at the prompt's end, then
//! `SuppressTokensLogitsProcessor`), `_set_max_new_tokens_and_length`, greedy decoding or beam
//! search over the encoder's output, and the returned ids as upstream's: the prompt cut, the
//! trailing padding and end-of-sequence token removed, rows right-padded with `pad_token_id`.
//!
//! Not implemented, and refused naming the option: long-form audio (the seek loop),
//! timestamps (`return_timestamps`, `WhisperTimeStampLogitsProcessor`), the temperature
//! fallback (Whisper decides sampling from its `temperature` argument; a configured
//! `do_sample` upstream ignores), `num_return_sequences`, and an output holding two
//! consecutive timestamp tokens (upstream then re-decodes the audio after the last one).

use serde_json::Value;
use tch::{Kind, Tensor};

use crate::generation::{GenerationConfig, LogitsProcessor};
use crate::modeling_utils::{ModelInputs, TrainableModel};
use crate::whisper::WhisperConfig;
use crate::{Error, Result};

/// Upstream `TASK_IDS`.
const TASK_IDS: [&str; 2] = ["translate", "transcribe"];

fn invalid(field: &'static str, detail: impl Into<String>) -> Error {
    Error::InvalidArgument {
        field,
        detail: detail.into(),
    }
}

/// A `{token: id}` map of the generation config (`lang_to_id`, `task_to_id`).
fn id_map(config: &GenerationConfig, key: &str) -> Result<Option<Vec<(String, i64)>>> {
    let Some(v) = config.other.get(key).filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let obj = v.as_object().ok_or_else(|| {
        invalid(
            "generation_config",
            format!("{key}: expected an object of token ids, got {v}"),
        )
    })?;
    obj.iter()
        .map(|(k, id)| {
            id.as_i64().map(|id| (k.clone(), id)).ok_or_else(|| {
                invalid(
                    "generation_config",
                    format!("{key}.{k}: expected a token id, got {id}"),
                )
            })
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

fn int_field(config: &GenerationConfig, key: &str) -> Result<Option<i64>> {
    match config.other.get(key).filter(|v| !v.is_null()) {
        None => Ok(None),
        Some(v) => v.as_i64().map(Some).ok_or_else(|| {
            invalid(
                "generation_config",
                format!("{key}: expected a token id, got {v}"),
            )
        }),
    }
}

fn python_list(items: impl Iterator<Item = String>) -> String {
    let items: Vec<String> = items.map(|s| format!("'{s}'")).collect();
    format!("[{}]", items.join(", "))
}

/// Upstream's `language_to_id`: a `lang_to_id` key, a language name or a language code.
fn language_to_id(language: &str, lang_to_id: &[(String, i64)]) -> Result<i64> {
    let language = language.to_lowercase();
    let token = if lang_to_id.iter().any(|(k, _)| *k == language) {
        language.clone()
    } else if let Some((_, code)) = TO_LANGUAGE_CODE.iter().find(|(name, _)| *name == language) {
        format!("<|{code}|>")
    } else if TO_LANGUAGE_CODE.iter().any(|(_, code)| *code == language) {
        format!("<|{language}|>")
    } else {
        let listed = if language.chars().count() == 2 {
            python_list(TO_LANGUAGE_CODE.iter().map(|(_, c)| c.to_string()))
        } else {
            python_list(TO_LANGUAGE_CODE.iter().map(|(n, _)| n.to_string()))
        };
        return Err(invalid(
            "language",
            format!("Unsupported language: {language}. Language should be one of: {listed}."),
        ));
    };
    lang_to_id
        .iter()
        .find(|(k, _)| *k == token)
        .map(|(_, id)| *id)
        .ok_or_else(|| {
            invalid(
                "language",
                format!(
                    "{token} is not supported by this specific model as it is not in the `generation_config.lang_to_id`. (You should just add it to the generation config)"
                ),
            )
        })
}

/// The configured language: one for every row, or one per row.
fn languages(config: &GenerationConfig, batch: i64) -> Result<Option<Vec<String>>> {
    match config.other.get("language") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(vec![s.clone(); batch as usize])),
        Some(Value::Array(list)) => {
            let list: Vec<String> = list
                .iter()
                .map(|l| {
                    l.as_str().map(str::to_string).ok_or_else(|| {
                        invalid("language", "Expected `language` to be `None`, a single string (e.g. `'en'`), or a list of strings with length equal to the batch size (e.g. `('en', 'fr')` for a batch size of 2). Got a list containing `None`.")
                    })
                })
                .collect::<Result<_>>()?;
            if list.len() as i64 != batch {
                return Err(invalid(
                    "language",
                    format!(
                        "When passing a list of languages, the length of the list must match the batch size. Expected length of {batch}, but got {} languages.",
                        list.len()
                    ),
                ));
            }
            Ok(Some(list))
        }
        Some(v) => Err(invalid(
            "language",
            format!("expected a language or a list of them, got {v}"),
        )),
    }
}

/// Upstream `detect_language`: the decoder's first step from `decoder_start_token_id`, every
/// score but the language tokens' -inf, the argmax per row.
fn detect_language(
    model: &dyn TrainableModel,
    encoder_hidden: &Tensor,
    start: i64,
    lang_to_id: &[(String, i64)],
) -> Result<Vec<i64>> {
    let batch = encoder_hidden.size()[0];
    let device = encoder_hidden.device();
    let ids = Tensor::f_full([batch, 1], start, (Kind::Int64, device))?;
    let out = tch::no_grad(|| {
        model.forward(&ModelInputs {
            decoder_input_ids: Some(&ids),
            encoder_outputs: Some(encoder_hidden),
            ..ModelInputs::default()
        })
    })?;
    let logits = out.logits()?;
    let logits = logits.f_select(1, logits.size()[1] - 1)?;
    let vocab = logits.size()[1];
    let mut non_lang = vec![true; vocab as usize];
    for (_, id) in lang_to_id {
        if let Some(slot) = usize::try_from(*id).ok().and_then(|i| non_lang.get_mut(i)) {
            *slot = false;
        }
    }
    let mask = Tensor::f_from_slice(&non_lang)?
        .f_to_device(device)?
        .unsqueeze(0);
    let logits = logits.f_masked_fill(&mask, f64::NEG_INFINITY)?;
    Ok(Vec::<i64>::try_from(
        logits.f_argmax(-1, false)?.to_device(tch::Device::Cpu),
    )?)
}

/// Upstream `_retrieve_init_tokens`: each row's decoder prompt.
fn init_tokens(
    model: &dyn TrainableModel,
    model_config: &WhisperConfig,
    config: &GenerationConfig,
    encoder_hidden: &Tensor,
    return_timestamps: bool,
) -> Result<Vec<Vec<i64>>> {
    let batch = encoder_hidden.size()[0];
    let start = config.decoder_start_token_id.ok_or_else(|| {
        invalid("decoder_start_token_id", "Whisper's generate starts from `decoder_start_token_id` (<|startoftranscript|>); set it in the generation config")
    })?;
    let lang_to_id = id_map(config, "lang_to_id")?;
    let task_to_id = id_map(config, "task_to_id")?;
    let task = match config.other.get("task") {
        None | Some(Value::Null) => None,
        Some(Value::String(t)) => Some(t.clone()),
        Some(v) => return Err(invalid("task", format!("expected a string, got {v}"))),
    };
    let language = languages(config, batch)?;
    // `_set_language_and_task`'s checks.
    if config.other.get("is_multilingual") == Some(&Value::Bool(false))
        && (task.is_some() || language.is_some())
    {
        return Err(invalid(
            "language",
            "Cannot specify `task` or `language` for an English-only model. If the model is intended to be multilingual, pass `is_multilingual=True` to generate, or update the generation config.",
        ));
    }
    if language.is_some() && lang_to_id.is_none() {
        return Err(invalid(
            "language",
            "The generation config is outdated and is thus not compatible with the `language` argument to `generate`. Please update the generation config as per the instructions https://github.com/huggingface/transformers/issues/25084#issuecomment-1664398224",
        ));
    }
    if task.is_some() && task_to_id.is_none() {
        return Err(invalid(
            "task",
            "The generation config is outdated and is thus not compatible with the `task` argument to `generate`. Please update the generation config as per the instructions https://github.com/huggingface/transformers/issues/25084#issuecomment-1664398224",
        ));
    }
    let mut init: Vec<Option<i64>> = vec![Some(start)];
    // The legacy `forced_decoder_ids` ([[1, lang], [2, task], [3, notimestamps]]), read only
    // when neither task nor language is set.
    if task.is_none() && language.is_none() {
        let forced = config
            .other
            .get("forced_decoder_ids")
            .filter(|v| !v.is_null())
            .or_else(|| {
                model_config
                    .extra
                    .get("forced_decoder_ids")
                    .filter(|v| !v.is_null())
            });
        if let Some(forced) = forced {
            log::warn!(
                "Using custom `forced_decoder_ids` from the (generation) config. This is deprecated in favor of the `task` and `language` flags/config options."
            );
            let pairs: Vec<(i64, Option<i64>)> = forced
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|p| {
                            let p = p.as_array()?;
                            Some((p.first()?.as_i64()?, p.get(1).and_then(Value::as_i64)))
                        })
                        .collect()
                })
                .unwrap_or_default();
            if pairs.len() != forced.as_array().map_or(0, Vec::len) {
                return Err(invalid(
                    "forced_decoder_ids",
                    format!("{forced}: expected [index, token id or null] pairs"),
                ));
            }
            if pairs.first().is_some_and(|p| p.0 == 1) {
                let mut i = 1;
                let mut rest = pairs.as_slice();
                while let Some(((idx, tok), tail)) = rest.split_first() {
                    if *idx != i {
                        break;
                    }
                    init.push(*tok);
                    rest = tail;
                    i += 1;
                }
                if !rest.is_empty() {
                    return Err(invalid(
                        "forced_decoder_ids",
                        format!(
                            "You are using token ids in `forced_decoder_ids` that do not seem to correctly follow the prompt pattern of Whisper. Make sure that {rest:?} has an entry for all indices >= 1 and < {}.",
                            rest[0].0
                        ),
                    ));
                }
            }
        }
    }
    let lang_undefined = init.len() <= 1 || init[1].is_none();
    let mut rows: Vec<Vec<Option<i64>>> = vec![init; batch as usize];
    let lang_ids = match (&language, &lang_to_id) {
        (Some(langs), Some(map)) => Some(
            langs
                .iter()
                .map(|l| language_to_id(l, map))
                .collect::<Result<Vec<_>>>()?,
        ),
        (None, Some(map)) if lang_undefined => {
            Some(detect_language(model, encoder_hidden, start, map)?)
        }
        _ => None,
    };
    if let Some(ids) = lang_ids {
        for (row, id) in rows.iter_mut().zip(ids) {
            if row.len() > 1 {
                row[1] = Some(id);
            } else {
                row.push(Some(id));
            }
        }
    }
    let no_timestamps = int_field(config, "no_timestamps_token_id")?;
    for row in &mut rows {
        if let Some(task) = &task {
            let map = task_to_id.as_deref().unwrap_or_default();
            let id = TASK_IDS
                .contains(&task.as_str())
                .then(|| map.iter().find(|(k, _)| k == task).map(|(_, id)| *id))
                .flatten()
                .ok_or_else(|| {
                    invalid(
                        "task",
                        format!(
                            "The `{task}` task is not supported. The task should be one of `{}`",
                            python_list(TASK_IDS.iter().map(|t| t.to_string()))
                        ),
                    )
                })?;
            row.push(Some(id));
        } else if language.is_some()
            && let Some(map) = &task_to_id
            && !map.iter().any(|(_, id)| row.contains(&Some(*id)))
        {
            let transcribe = map
                .iter()
                .find(|(k, _)| k == "transcribe")
                .map(|(_, id)| *id);
            row.push(Some(transcribe.ok_or_else(|| {
                invalid("generation_config", "task_to_id has no `transcribe`")
            })?));
        }
        match no_timestamps {
            Some(id) if !return_timestamps && row.last() != Some(&Some(id)) => row.push(Some(id)),
            Some(id) if return_timestamps && row.last() == Some(&Some(id)) => {
                row.pop();
            }
            _ => {}
        }
    }
    Ok(rows
        .into_iter()
        .map(|r| r.into_iter().flatten().collect())
        .collect())
}

/// Upstream `WhisperForConditionalGeneration.generate(input_features, generation_config=...)`
/// on short-form audio: the generated ids `[batch, longest]` (no prompt, no end-of-sequence
/// token, rows padded with `pad_token_id`). `config` is the merged configuration (the model's
/// `generation_config` updated with the call's: `language`, `task` and the legacy
/// `forced_decoder_ids` are read from it).
pub fn whisper_generate(
    model: &dyn TrainableModel,
    model_config: &WhisperConfig,
    input_features: &Tensor,
    config: &GenerationConfig,
) -> Result<Tensor> {
    let frames = input_features.size().last().copied().unwrap_or(0);
    let segment = model_config.expected_seq_length();
    if frames > segment {
        return Err(invalid(
            "input_features",
            format!(
                "{frames} mel frames (> 30 seconds): long-form generation (the seek loop over {segment}-frame windows with timestamps) is not implemented here; cut the audio into clips of at most 30 s"
            ),
        ));
    }
    // Shorter inputs are padded to the segment with zeros (upstream's `F.pad`).
    let input_features = if frames < segment {
        input_features.f_constant_pad_nd([0, segment - frames])?
    } else {
        input_features.shallow_clone()
    };
    let return_timestamps = config.other.get("return_timestamps") == Some(&Value::Bool(true));
    if return_timestamps {
        return Err(invalid(
            "return_timestamps",
            "timestamp prediction (WhisperTimeStampLogitsProcessor and the segments) is not implemented here; generate without return_timestamps",
        ));
    }
    if config.do_sample == Some(true) {
        return Err(invalid(
            "do_sample",
            "Whisper's generate samples only through its `temperature` argument (upstream sets do_sample from it and ignores the configured one); the temperature fallback is not implemented here: decode greedily or with num_beams",
        ));
    }
    if config.num_return_sequences.is_some_and(|n| n != 1) {
        return Err(invalid(
            "num_return_sequences",
            "Whisper's num_return_sequences (rows repeated before the seek loop) is not implemented here; leave it at 1",
        ));
    }
    let mut gc = config.clone();
    gc.temperature = None;
    let encoder_hidden = tch::no_grad(|| model.encode(&input_features, None))?;
    let rows = init_tokens(model, model_config, &gc, &encoder_hidden, return_timestamps)?;
    let prompt_len = rows[0].len() as i64;
    if rows.iter().any(|r| r.len() as i64 != prompt_len) {
        return Err(invalid(
            "forced_decoder_ids",
            "the rows' decoder prompts differ in length",
        ));
    }
    let device = encoder_hidden.device();
    let flat: Vec<i64> = rows.concat();
    let decoder_input_ids = Tensor::f_from_slice(&flat)?
        .f_view([rows.len() as i64, prompt_len])?
        .f_to_device(device)?;
    // `_set_max_new_tokens_and_length`.
    let max_target = model_config.max_target_positions;
    let max_new = gc.max_new_tokens.unwrap_or(0);
    if max_new + prompt_len > max_target {
        return Err(invalid(
            "max_new_tokens",
            format!(
                "The length of `decoder_input_ids`, including special start tokens, prompt tokens, and previous tokens, is {prompt_len},  and `max_new_tokens` is {max_new}. Thus, the combined length of `decoder_input_ids` and `max_new_tokens` is: {}. This exceeds the `max_target_positions` of the Whisper model: {max_target}. You should either reduce the length of your prompt, or reduce the value of `max_new_tokens`, so that their combined length is less than {max_target}.",
                max_new + prompt_len
            ),
        ));
    }
    if gc.max_new_tokens.is_none() {
        let initial = (max_target / 2 - 1).min(prompt_len);
        gc.max_length = Some((gc.max_length.unwrap_or(20) + initial).min(max_target));
    }
    // Whisper's processors replace the configuration's suppressions.
    let mut processors = Vec::new();
    if let Some(ids) = gc.begin_suppress_tokens.take() {
        processors.push(LogitsProcessor::SuppressTokensAtBegin {
            ids,
            begin_index: prompt_len,
        });
    }
    if let Some(ids) = gc.suppress_tokens.take() {
        processors.push(LogitsProcessor::SuppressTokens(ids));
    }
    let out = tch::no_grad(|| {
        crate::generation::generate_from_encoder(
            model,
            encoder_hidden,
            decoder_input_ids,
            &gc,
            processors,
        )
    })?;
    let pad = gc.pad_token_id;
    let eos = match gc.eos_token_id.as_deref() {
        None => None,
        Some([one]) => Some(*one),
        Some(many) => {
            return Err(invalid(
                "eos_token_id",
                format!(
                    "{many:?}: Whisper's generate compares each row's last token with one end-of-sequence id"
                ),
            ));
        }
    };
    let timestamp_begin =
        int_field(&gc, "no_timestamps_token_id")?.map_or(model_config.vocab_size + 1, |id| id + 1);
    let generated = out
        .sequences
        .f_narrow(1, prompt_len, out.sequences.size()[1] - prompt_len)?;
    let mut seqs = Vec::new();
    for r in 0..generated.size()[0] {
        let mut row = Vec::<i64>::try_from(generated.get(r).to_device(tch::Device::Cpu))?;
        // Trailing padding (every pad id of the row counted, as upstream's), one kept when
        // it is the end-of-sequence id; then the end-of-sequence token.
        if let Some(pad) = pad
            && row.last() == Some(&pad)
        {
            let mut n = row.iter().filter(|&&t| t == pad).count();
            if Some(pad) == eos {
                n -= 1;
            }
            row.truncate(row.len() - n);
        }
        if eos.is_some() && row.last().copied() == eos {
            row.pop();
        }
        // `_retrieve_segment`: consecutive timestamp tokens would cut the segment and
        // re-decode the audio from the last one.
        if row
            .windows(2)
            .any(|w| w[0] >= timestamp_begin && w[1] >= timestamp_begin)
        {
            return Err(invalid(
                "input_features",
                "the model generated two consecutive timestamp tokens: upstream then cuts the segment there and decodes the audio again from the last timestamp (the seek loop), which is not implemented here",
            ));
        }
        seqs.push(row);
    }
    let longest = seqs.iter().map(Vec::len).max().unwrap_or(0);
    let fill = pad.ok_or_else(|| {
        invalid(
            "pad_token_id",
            "Whisper's generate pads its rows with pad_token_id; set it in the generation config",
        )
    })?;
    let mut flat = Vec::with_capacity(seqs.len() * longest);
    for row in &seqs {
        flat.extend_from_slice(row);
        flat.extend(std::iter::repeat_n(fill, longest - row.len()));
    }
    Ok(Tensor::f_from_slice(&flat)?
        .f_view([seqs.len() as i64, longest as i64])?
        .f_to_device(device)?)
}

/// Upstream `TO_LANGUAGE_CODE` (`tokenization_whisper.py`): language names (and aliases) to
/// codes, in upstream's order.
pub(crate) const TO_LANGUAGE_CODE: [(&str, &str); 112] = [
    ("english", "en"),
    ("chinese", "zh"),
    ("german", "de"),
    ("spanish", "es"),
    ("russian", "ru"),
    ("korean", "ko"),
    ("french", "fr"),
    ("japanese", "ja"),
    ("portuguese", "pt"),
    ("turkish", "tr"),
    ("polish", "pl"),
    ("catalan", "ca"),
    ("dutch", "nl"),
    ("arabic", "ar"),
    ("swedish", "sv"),
    ("italian", "it"),
    ("indonesian", "id"),
    ("hindi", "hi"),
    ("finnish", "fi"),
    ("vietnamese", "vi"),
    ("hebrew", "he"),
    ("ukrainian", "uk"),
    ("greek", "el"),
    ("malay", "ms"),
    ("czech", "cs"),
    ("romanian", "ro"),
    ("danish", "da"),
    ("hungarian", "hu"),
    ("tamil", "ta"),
    ("norwegian", "no"),
    ("thai", "th"),
    ("urdu", "ur"),
    ("croatian", "hr"),
    ("bulgarian", "bg"),
    ("lithuanian", "lt"),
    ("latin", "la"),
    ("maori", "mi"),
    ("malayalam", "ml"),
    ("welsh", "cy"),
    ("slovak", "sk"),
    ("telugu", "te"),
    ("persian", "fa"),
    ("latvian", "lv"),
    ("bengali", "bn"),
    ("serbian", "sr"),
    ("azerbaijani", "az"),
    ("slovenian", "sl"),
    ("kannada", "kn"),
    ("estonian", "et"),
    ("macedonian", "mk"),
    ("breton", "br"),
    ("basque", "eu"),
    ("icelandic", "is"),
    ("armenian", "hy"),
    ("nepali", "ne"),
    ("mongolian", "mn"),
    ("bosnian", "bs"),
    ("kazakh", "kk"),
    ("albanian", "sq"),
    ("swahili", "sw"),
    ("galician", "gl"),
    ("marathi", "mr"),
    ("punjabi", "pa"),
    ("sinhala", "si"),
    ("khmer", "km"),
    ("shona", "sn"),
    ("yoruba", "yo"),
    ("somali", "so"),
    ("afrikaans", "af"),
    ("occitan", "oc"),
    ("georgian", "ka"),
    ("belarusian", "be"),
    ("tajik", "tg"),
    ("sindhi", "sd"),
    ("gujarati", "gu"),
    ("amharic", "am"),
    ("yiddish", "yi"),
    ("lao", "lo"),
    ("uzbek", "uz"),
    ("faroese", "fo"),
    ("haitian creole", "ht"),
    ("pashto", "ps"),
    ("turkmen", "tk"),
    ("nynorsk", "nn"),
    ("maltese", "mt"),
    ("sanskrit", "sa"),
    ("luxembourgish", "lb"),
    ("myanmar", "my"),
    ("tibetan", "bo"),
    ("tagalog", "tl"),
    ("malagasy", "mg"),
    ("assamese", "as"),
    ("tatar", "tt"),
    ("hawaiian", "haw"),
    ("lingala", "ln"),
    ("hausa", "ha"),
    ("bashkir", "ba"),
    ("javanese", "jw"),
    ("sundanese", "su"),
    ("cantonese", "yue"),
    ("burmese", "my"),
    ("valencian", "ca"),
    ("flemish", "nl"),
    ("haitian", "ht"),
    ("letzeburgesch", "lb"),
    ("pushto", "ps"),
    ("panjabi", "pa"),
    ("moldavian", "ro"),
    ("moldovan", "ro"),
    ("sinhalese", "si"),
    ("castilian", "es"),
    ("mandarin", "zh"),
];
