//! Token ids of our tokenizers equal upstream's on a hamlet.txt paragraph
//! (`scripts/reference/models.py` → tokenizers.json): GPT-2 from vocab.json + merges.txt,
//! MiniLM and SmolLM2 from tokenizer.json. Exact equality, special tokens included.

use std::path::Path;
use tchtrain_testing::{assets, lock, temp_dir};

use anyhow::{Context, Result};
use tchtrain_models::AutoTokenizer;

fn expected(key: &str) -> Result<(String, Vec<u32>)> {
    let path = assets().join("reference/models/tokenizers.json");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("{} (run `cargo xtask setup`)", path.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text)?;
    let ids = v[key]
        .as_array()
        .context("ids")?
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect();
    Ok((
        v["paragraph"].as_str().context("paragraph")?.to_string(),
        ids,
    ))
}

#[test]
fn gpt2_bpe_from_vocab_and_merges() -> Result<()> {
    let _g = lock();
    let (text, ids) = expected("gpt2")?;
    let tok = AutoTokenizer::from_pretrained(assets().join("gpt2-tokenizer"))?;
    let tok = tok.tokenizer();
    let enc = tok
        .encode(text.as_str(), true)
        .map_err(anyhow::Error::msg)?;
    assert_eq!(enc.get_ids(), ids.as_slice());
    assert_eq!(tok.decode(&ids, false).map_err(anyhow::Error::msg)?, text);
    Ok(())
}

#[test]
fn minilm_and_smollm2_tokenizer_json() -> Result<()> {
    let _g = lock();
    for (key, dir) in [("minilm", "minilm"), ("smollm2", "smollm2-135m")] {
        let (text, ids) = expected(key)?;
        let tok = AutoTokenizer::from_pretrained(assets().join(dir))?;
        let tok = tok.tokenizer();
        let enc = tok
            .encode(text.as_str(), true)
            .map_err(anyhow::Error::msg)?;
        assert_eq!(enc.get_ids(), ids.as_slice(), "{key}");
    }
    Ok(())
}

#[test]
fn missing_tokenizer_files_are_typed_errors() {
    let _g = lock();
    let err = AutoTokenizer::from_pretrained(Path::new("/nonexistent/model")).unwrap_err();
    assert!(err.to_string().contains("/nonexistent/model"), "{err}");
    let empty = temp_dir("no-tokenizer");
    let err = AutoTokenizer::from_pretrained(empty.path()).unwrap_err();
    assert!(
        err.to_string().contains("tokenizer.json") && err.to_string().contains("vocab.json"),
        "{err}"
    );
}

/// `save_pretrained` writes what `from_pretrained` reads back: the same ids and the same
/// facts, for a tokenizer.json tokenizer and for GPT-2's vocab.json + merges.txt.
#[test]
fn save_pretrained_round_trips() -> Result<()> {
    let _g = lock();
    let (text, _) = expected("minilm")?;
    for dir in ["minilm", "smollm2-135m", "gpt2-tokenizer"] {
        let tok = AutoTokenizer::from_pretrained(assets().join(dir))?;
        let out = temp_dir(&format!("saved-{dir}"));
        tok.save_pretrained(out.path())?;
        let again = AutoTokenizer::from_pretrained(out.path())?;
        assert_eq!(again.info(), tok.info(), "{dir}");
        let ids = |t: &AutoTokenizerOutput| -> Result<Vec<u32>> {
            Ok(t.tokenizer()
                .encode(text.as_str(), true)
                .map_err(anyhow::Error::msg)?
                .get_ids()
                .to_vec())
        };
        assert_eq!(ids(&again)?, ids(&tok)?, "{dir}");
    }
    // GPT-2 from its vocabulary: upstream's special tokens.
    let gpt2 = AutoTokenizer::from_pretrained(assets().join("gpt2-tokenizer"))?;
    assert_eq!(
        gpt2.info()
            .all_special_ids
            .iter()
            .copied()
            .collect::<Vec<_>>(),
        [50256]
    );
    // MiniLM's facts from its tokenizer_config.json.
    let minilm = AutoTokenizer::from_pretrained(assets().join("minilm"))?;
    assert_eq!(minilm.info().pad_token_id, Some(0));
    assert_eq!(minilm.info().mask_token_id, Some(103));
    Ok(())
}

type AutoTokenizerOutput = tchtrain_models::PreTrainedTokenizerFast;

/// Chat templates against transformers 5.23's `apply_chat_template`
/// (`scripts/reference/chat_templates.py` on SmolLM2's tokenizer): its own
/// `chat_template.jinja`, a Qwen2.5-style template with tools and tool calls given as
/// `tokenizer_config.json`'s string, named templates (`default` / `tool_use`) given as its
/// list and as saved files, `continue_final_message`, documents, template kwargs, and a
/// template exercising upstream's environment (tojson's options and float spelling, Python
/// string methods, namespace, loop controls, a generation block, reasoning aliases, null keys
/// dropped). Each case: the same text and token ids, or an error where upstream raises.
#[test]
fn chat_templates_render_as_upstream() -> Result<()> {
    let _g = lock();
    use tchtrain_models::ChatTemplateOptions;
    let root = assets().join("reference/chat_templates");
    let cases: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("cases.json"))
            .with_context(|| format!("{} (run `cargo xtask setup`)", root.display()))?,
    )?;
    let cases = cases.as_array().context("cases")?;
    assert_eq!(cases.len(), 15);
    for (i, case) in cases.iter().enumerate() {
        let folder = case["folder"].as_str().context("folder")?;
        let tok = AutoTokenizer::from_pretrained(root.join(folder))?;
        let o = &case["options"];
        let mut options = ChatTemplateOptions {
            add_generation_prompt: o["add_generation_prompt"].as_bool().unwrap_or(false),
            continue_final_message: match &o["continue_final_message"] {
                serde_json::Value::Bool(true) => Some("content".into()),
                serde_json::Value::String(field) => Some(field.clone()),
                _ => None,
            },
            tools: o["tools"].as_str().map(str::to_string),
            documents: o["documents"].as_str().map(str::to_string),
            chat_template: o["chat_template"].as_str().map(str::to_string),
            ..Default::default()
        };
        for (k, v) in o.as_object().context("options")? {
            if ![
                "add_generation_prompt",
                "continue_final_message",
                "tools",
                "documents",
                "chat_template",
            ]
            .contains(&k.as_str())
            {
                options.template_kwargs.insert(k.clone(), v.clone());
            }
        }
        let conversation = case["conversation"].as_str().context("conversation")?;
        let text = tok.apply_chat_template_text(conversation, &options);
        match case.get("error") {
            Some(error) => {
                let err = text.expect_err(&format!("case {i} ({folder}): upstream raised {error}"));
                eprintln!("case {i}: {err} (upstream: {error})");
            }
            None => {
                let text = text.with_context(|| format!("case {i} ({folder})"))?;
                assert_eq!(
                    text,
                    case["text"].as_str().context("text")?,
                    "case {i} ({folder})"
                );
                let ids: Vec<i64> = serde_json::from_value(case["input_ids"].clone())?;
                let row = tok.apply_chat_template(conversation, &options)?;
                assert_eq!(row.input_ids, ids, "case {i} ({folder}): ids");
                assert_eq!(row.attention_mask, Some(vec![1; ids.len()]));
            }
        }
    }
    // save_pretrained writes named templates as upstream's: chat_template.jinja and
    // additional_chat_templates/, the key out of tokenizer_config.json; they load back.
    let named = AutoTokenizer::from_pretrained(root.join("named"))?;
    let out = temp_dir("chat-templates");
    named.save_pretrained(out.path())?;
    for file in [
        "chat_template.jinja",
        "additional_chat_templates/tool_use.jinja",
    ] {
        assert_eq!(
            std::fs::read_to_string(out.path().join(file))?,
            std::fs::read_to_string(root.join("named_saved").join(file))?,
            "{file}"
        );
    }
    let config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
        out.path().join("tokenizer_config.json"),
    )?)?;
    assert!(config.get("chat_template").is_none());
    let again = AutoTokenizer::from_pretrained(out.path())?;
    assert_eq!(again.chat_template(), named.chat_template());
    // No template: a typed error naming the fix.
    let minilm = AutoTokenizer::from_pretrained(assets().join("minilm"))?;
    let err = minilm
        .apply_chat_template_text(
            r#"[{"role": "user", "content": "hi"}]"#,
            &ChatTemplateOptions::default(),
        )
        .expect_err("MiniLM has no chat template");
    assert!(err.to_string().contains("no chat template"), "{err}");
    Ok(())
}

/// Upstream's multilingual tokenizers (`scripts/reference/multilingual_tokenizers.py`): the
/// setup's mBART tokenizer (mBART-cc25's vocabulary and codes: `tokens </s> lang`) and an
/// mBART-50 layout (`lang tokens </s>`), with `src_lang` / `tgt_lang` set as
/// run_translation.py sets them: sources and `text_target`s give upstream's ids exactly.
#[test]
fn multilingual_tokenizers_place_language_codes_as_upstream() -> Result<()> {
    let _g = lock();
    let dir = assets().join("reference/multilingual_tokenizers");
    let text = std::fs::read_to_string(dir.join("multilingual_tokenizers.json"))
        .with_context(|| format!("{} (run `cargo xtask setup`)", dir.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text)?;
    let sources = [
        "UN Chief Says There Is No Military Solution in Syria",
        "Hello, world!",
        "",
    ];
    let targets = [
        "Şeful ONU declară că nu există o soluţie militară în Siria",
        "Bună ziua!",
        "x",
    ];
    let ids = |v: &serde_json::Value| -> Vec<Vec<i64>> {
        v.as_array()
            .map(|rows| {
                rows.iter()
                    .map(|r| {
                        r.as_array()
                            .map(|r| r.iter().filter_map(|x| x.as_i64()).collect())
                            .unwrap_or_default()
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    for (case, folder) in [
        ("mbart", assets().join("mbart-tokenizer")),
        ("mbart50", dir.join("mbart50")),
    ] {
        let mut tok = AutoTokenizer::from_pretrained(&folder)?;
        assert!(tok.language_codes().is_some(), "{case}");
        for run in v[case].as_array().context("runs")? {
            let (src, tgt) = (
                run["src_lang"].as_str().context("src")?,
                run["tgt_lang"].as_str().context("tgt")?,
            );
            tok.set_src_lang(src)?;
            tok.set_tgt_lang(tgt)?;
            let ours: Vec<Vec<i64>> = sources
                .iter()
                .map(|s| tok.encode(s, true))
                .collect::<Result<_, _>>()?;
            assert_eq!(ours, ids(&run["sources"]), "{case} {src} sources");
            let target = tok.target_tokenizer()?;
            let ours: Vec<Vec<i64>> = targets
                .iter()
                .map(|t| {
                    target
                        .encode(*t, true)
                        .map(|e| e.get_ids().iter().map(|&i| i64::from(i)).collect())
                })
                .collect::<Result<_, _>>()
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            assert_eq!(ours, ids(&run["targets"]), "{case} {tgt} targets");
        }
    }
    // A code the vocabulary lacks is refused by name.
    let mut tok = AutoTokenizer::from_pretrained(assets().join("mbart-tokenizer"))?;
    let err = tok
        .set_src_lang("xx_YY")
        .expect_err("unknown code")
        .to_string();
    assert!(err.contains("`xx_YY`"), "{err}");
    // A tokenizer without language codes refuses them.
    let mut gpt2 = AutoTokenizer::from_pretrained(assets().join("gpt2-tokenizer"))?;
    assert!(gpt2.language_codes().is_none());
    assert!(gpt2.set_src_lang("en_XX").is_err());
    Ok(())
}

/// `AutoTokenizer` picks the class upstream's does (`scripts/reference/auto_tokenizer.py`):
/// a `qwen2` folder naming `GPT2Tokenizer` (or `PreTrainedTokenizerFast`, or nothing) gets
/// `Qwen2Tokenizer`'s pipeline over GPT-2's vocabulary (digits split one by one, NFC, the
/// folder's added tokens kept, `<|endoftext|>` its padding token), a `qwen3` one the
/// `GPT2Tokenizer` it names, a `llama` one its own `tokenizer.json`: the same ids as
/// upstream on hamlet.txt's first 3000 characters and on a line of digits, contractions, a
/// decomposed accent and an added token; the same padding token.
#[test]
fn auto_tokenizer_picks_upstreams_class() -> Result<()> {
    let _g = lock();
    let dir = assets().join("reference/auto_tokenizer");
    let v: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("ids.json"))
            .with_context(|| format!("{} (run `cargo xtask setup`)", dir.display()))?,
    )?;
    let text = std::fs::read_to_string(assets().join("text/hamlet.txt"))?;
    let hamlet: String = text.chars().take(3000).collect();
    let line = v["line"].as_str().context("line")?;
    let ids = |x: &serde_json::Value| -> Vec<i64> {
        x.as_array()
            .map(|a| a.iter().filter_map(serde_json::Value::as_i64).collect())
            .unwrap_or_default()
    };
    for (case, class) in [
        ("qwen2_vocab_merges", "Qwen2Tokenizer"),
        ("qwen2_json", "Qwen2Tokenizer"),
        ("qwen2_json_added", "Qwen2Tokenizer"),
        ("qwen3_vocab_merges", "GPT2Tokenizer"),
        ("qwen3_5_json", "Qwen3_5Tokenizer"),
        ("qwen3_5_text_json", "TokenizersBackend"),
        ("llama_json", "TokenizersBackend"),
    ] {
        let expected = &v[case];
        assert_eq!(expected["class"], class, "{case}: the reference's class");
        let tok = AutoTokenizer::from_pretrained(dir.join(case))?;
        assert_eq!(
            tok.encode(&hamlet, true)?,
            ids(&expected["hamlet"]),
            "{case}: hamlet ids"
        );
        assert_eq!(
            tok.encode(line, true)?,
            ids(&expected["line"]),
            "{case}: line ids"
        );
        assert_eq!(
            tok.info().pad_token_id,
            expected["pad_token_id"].as_i64(),
            "{case}: pad token"
        );
    }
    assert_eq!(
        tchtrain_models::tokenizer_class(Some("qwen2"), Some("GPT2Tokenizer")).as_deref(),
        Some("Qwen2Tokenizer")
    );
    assert_eq!(
        tchtrain_models::tokenizer_class(Some("qwen3"), Some("GPT2TokenizerFast")).as_deref(),
        Some("GPT2Tokenizer")
    );
    assert_eq!(
        tchtrain_models::tokenizer_class(Some("qwen3_moe"), None).as_deref(),
        Some("Qwen2Tokenizer")
    );
    Ok(())
}
