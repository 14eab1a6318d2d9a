"""Reference for Whisper (models/tests/it/audio.rs, trainer/tests/it/audio.rs): transformers
5.23's WhisperForConditionalGeneration on a tiny random checkpoint.

Usage: python whisper.py OUT_DIR

OUT_DIR/model/        the tiny model (d_model 16, 2 + 2 layers of 2 heads, FFN 24, 8 mel bins,
                      30 source positions (60 frames), 40 target positions, vocabulary 110
                      with <|endoftext|> 99, <|startoftranscript|> 100, languages 101-102,
                      translate 103, transcribe 104, <|notimestamps|> 109 (no timestamp
                      token below the vocabulary's end); dropout,
                      attention and activation dropout 0.1), drawn after `torch.manual_seed(0)`,
                      with a generation_config.json carrying `lang_to_id`, `task_to_id`,
                      `no_timestamps_token_id`, `suppress_tokens` and `begin_suppress_tokens`
OUT_DIR/forward.safetensors  in evaluation mode: `input_features` [3, 8, 60] (randn), `labels`
                      [3, 6] (rows 1 and 2 ending in -100), their `logits`, `loss`,
                      `encoder_last_hidden_state`, and `grad.<name>` of every parameter that gets
                      one (checkpoint names), the model loaded back (`from_pretrained` leaves the
                      encoder's positions trainable, as `requires_grad_(False)` is lost in loading)
OUT_DIR/generate.safetensors  `model.generate(input_features)` in evaluation mode on the forward's
                      `input_features`, each case's ids `<case>`: `en_transcribe` (language="en",
                      task="transcribe"), `detect` (no language: detected per row), `fr_translate_beams`
                      (language="french", task="translate", num_beams=3), `forced` (the legacy
                      `forced_decoder_ids` [[1, None], [2, 104]]), `max_new_5` (language="<|en|>",
                      max_new_tokens=5), `short` (language="en" on the first 45 frames, padded)
OUT_DIR/trainer/      `Trainer(model, args, train_dataset=rows 0-15, eval_dataset=rows 16-23,
                      data_collator=default_data_collator)` on `train.safetensors`'
                      `input_features` [24, 8, 60] and `labels` [24, 5] (-100 at the tails): 20
                      steps of batches of 4 at lr 1e-3 (dropout on), logged every 5, evaluated
                      every 10, seed 42: `log_history.json` and `model/` (saved)
"""

import copy
import json
import shutil
import sys
from pathlib import Path

import torch

import transformers as tf
from datasets import Dataset
from safetensors.torch import save_file

OUT = Path(sys.argv[1])


def config():
    return tf.WhisperConfig(
        vocab_size=110, num_mel_bins=8, d_model=16, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=24, decoder_ffn_dim=24,
        max_source_positions=30, max_target_positions=40, pad_token_id=99, bos_token_id=99,
        eos_token_id=99, decoder_start_token_id=100, begin_suppress_tokens=[5, 99],
        suppress_tokens=[7, 8], dropout=0.1, attention_dropout=0.1, activation_dropout=0.1, init_std=0.4,
    )


def generation_config():
    g = tf.GenerationConfig(
        decoder_start_token_id=100, bos_token_id=99, eos_token_id=99, pad_token_id=99,
        suppress_tokens=[7, 8], begin_suppress_tokens=[5, 99], max_length=40,
    )
    g.lang_to_id = {"<|en|>": 101, "<|fr|>": 102}
    g.task_to_id = {"translate": 103, "transcribe": 104}
    g.no_timestamps_token_id = 109
    g.is_multilingual = True
    return g


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = tf.WhisperForConditionalGeneration(config())
    model.generation_config = generation_config()
    model.save_pretrained(OUT / "model")

    # Forward and backward in evaluation mode, on the model as loaded (loading leaves the
    # encoder's positions trainable).
    model = tf.WhisperForConditionalGeneration.from_pretrained(OUT / "model")
    g = torch.Generator().manual_seed(1)
    features = torch.randn(3, 8, 60, generator=g)
    labels = torch.randint(0, 99, (3, 6), generator=g)
    labels[1, 4:] = -100
    labels[2, 2:] = -100
    model.eval()
    out = model(input_features=features, labels=labels)
    out.loss.backward()
    tensors = {
        "input_features": features, "labels": labels, "logits": out.logits.detach(),
        "loss": out.loss.detach(), "encoder_last_hidden_state": out.encoder_last_hidden_state.detach(),
    }
    for n, p in model.named_parameters():
        if p.grad is not None:
            tensors[f"grad.{n}"] = p.grad
    save_file(tensors, OUT / "forward.safetensors")

    model.zero_grad()
    cases = {
        "en_transcribe": dict(language="en", task="transcribe"),
        "detect": dict(),
        "fr_translate_beams": dict(language="french", task="translate", num_beams=3),
        "max_new_5": dict(language="<|en|>", max_new_tokens=5),
    }
    generated = {}
    with torch.no_grad():
        for name, kwargs in cases.items():
            generated[name] = model.generate(input_features=features, **kwargs).contiguous()
        forced = copy.deepcopy(model.generation_config)
        forced.forced_decoder_ids = [[1, None], [2, 104]]
        generated["forced"] = model.generate(input_features=features, generation_config=forced).contiguous()
        generated["short"] = model.generate(input_features=features[:, :, :45], language="en").contiguous()
    save_file(generated, OUT / "generate.safetensors")

    # 20 Trainer steps with dropout on.
    feats = torch.randn(24, 8, 60, generator=g)
    labs = torch.randint(0, 99, (24, 5), generator=g)
    for i in range(24):
        cut = 2 + i % 4
        labs[i, cut:] = -100
    save_file({"input_features": feats, "labels": labs}, OUT / "train.safetensors")

    def dataset(lo, hi):
        return Dataset.from_dict(
            {"input_features": feats[lo:hi].tolist(), "labels": labs[lo:hi].tolist()}
        ).with_format("torch")

    model = tf.WhisperForConditionalGeneration.from_pretrained(OUT / "model")
    args = tf.TrainingArguments(
        output_dir=str(OUT / "trainer_run"), per_device_train_batch_size=4,
        per_device_eval_batch_size=4, max_steps=20, learning_rate=1e-3, logging_steps=5,
        eval_strategy="steps", eval_steps=10, save_strategy="no", seed=42, use_cpu=True,
        report_to="none", disable_tqdm=True,
    )
    trainer = tf.Trainer(
        model=model, args=args, train_dataset=dataset(0, 16), eval_dataset=dataset(16, 24),
        data_collator=tf.default_data_collator,
    )
    trainer.train()
    (OUT / "trainer").mkdir(exist_ok=True)
    (OUT / "trainer" / "log_history.json").write_text(json.dumps(trainer.state.log_history, indent=1))
    trainer.save_model(str(OUT / "trainer" / "model"))
    shutil.rmtree(args.output_dir, ignore_errors=True)
    print("whisper", trainer.state.log_history[-2])


if __name__ == "__main__":
    main()
