"""Reference for losses/tests/parity.rs: every loss of tchtrain-losses and its gradient.

Runs upstream's transformers.loss.loss_utils functions and trainer_pt_utils.LabelSmoother on
seeded random logits and labels (with ignore_index positions), with and without
num_items_in_batch, and records inputs, loss and d loss / d logits.

Usage: python losses.py OUT_DIR
Writes OUT_DIR/losses.safetensors (tensors named "<case>.<name>") and OUT_DIR/losses.json
(the cases: which function, scalar arguments, tensor names; and the loss_type that
PreTrainedModel derives from a few class names).
"""

import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors.torch import save_file
from transformers.loss.loss_utils import (
    LOSS_MAPPING,
    ForCausalLMLoss,
    ForMaskedLMLoss,
    ForQuestionAnsweringLoss,
    ForSequenceClassificationLoss,
    ForTokenClassification,
    fixed_cross_entropy,
)
from transformers.trainer_pt_utils import LabelSmoother

out_dir = Path(sys.argv[1])
torch.manual_seed(1234)
tensors: dict[str, torch.Tensor] = {}
cases: list[dict] = []


def labels_with_ignored(shape, high, frac=0.3, ignore=-100):
    labels = torch.randint(0, high, shape)
    drop = torch.rand(shape) < frac
    return labels.masked_fill(drop, ignore)


def record(name, function, inputs: dict, args: dict, fn, grad_of=("logits",)):
    """Run fn(**inputs) with grad on the float inputs named in grad_of, store everything."""
    leaves = {k: v.clone().requires_grad_(True) if k in grad_of else v for k, v in inputs.items()}
    loss = fn(leaves)
    loss.backward()
    for k, v in inputs.items():
        tensors[f"{name}.{k}"] = v.clone().contiguous()
    tensors[f"{name}.loss"] = loss.detach().reshape(1)
    for k in grad_of:
        tensors[f"{name}.grad_{k}"] = leaves[k].grad.contiguous()
    cases.append({"name": name, "function": function, "args": args, "inputs": list(inputs), "grads": list(grad_of)})


n_items = torch.tensor(37)  # a count from a larger accumulation window

# fixed_cross_entropy on [N, C]
for with_n in (False, True):
    logits = torch.randn(13, 6)
    target = labels_with_ignored((13,), 6)
    inputs = {"logits": logits, "target": target}
    if with_n:
        inputs["num_items_in_batch"] = n_items
    record(
        f"fixed_cross_entropy{'_n' if with_n else ''}", "fixed_cross_entropy", inputs, {"ignore_index": -100},
        lambda t: fixed_cross_entropy(t["logits"], t["target"], t.get("num_items_in_batch"), ignore_index=-100),
    )

# ForCausalLM: plain, num_items_in_batch, explicit shift_labels, bf16 logits (upcast), other ignore_index
vocab = 11
for variant in ("plain", "n", "shift_labels", "ignore_7"):
    logits = torch.randn(3, 7, vocab)
    ignore = 7 if variant == "ignore_7" else -100
    labels = labels_with_ignored((3, 7), vocab, ignore=ignore)
    inputs = {"logits": logits, "labels": labels}
    if variant == "n":
        inputs["num_items_in_batch"] = n_items
    if variant == "shift_labels":
        inputs["shift_labels"] = labels_with_ignored((3, 7), vocab)
    record(
        f"causal_lm_{variant}", "for_causal_lm_loss", inputs, {"vocab_size": vocab, "ignore_index": ignore},
        lambda t: ForCausalLMLoss(
            t["logits"], t["labels"], vocab_size=vocab, num_items_in_batch=t.get("num_items_in_batch"),
            ignore_index=ignore, shift_labels=t.get("shift_labels"),
        ),
    )

# ForMaskedLM
for with_n in (False, True):
    logits = torch.randn(2, 9, vocab)
    labels = labels_with_ignored((2, 9), vocab, frac=0.6)
    inputs = {"logits": logits, "labels": labels}
    if with_n:
        inputs["num_items_in_batch"] = n_items
    record(
        f"masked_lm{'_n' if with_n else ''}", "for_masked_lm_loss", inputs, {"vocab_size": vocab, "ignore_index": -100},
        lambda t: ForMaskedLMLoss(t["logits"], t["labels"], vocab_size=vocab, num_items_in_batch=t.get("num_items_in_batch")),
    )

# ForTokenClassification
for with_n in (False, True):
    logits = torch.randn(3, 8, 5)
    labels = labels_with_ignored((3, 8), 5)
    inputs = {"logits": logits, "labels": labels}
    if with_n:
        inputs["num_items_in_batch"] = n_items
    record(
        f"token_classification{'_n' if with_n else ''}", "for_token_classification", inputs, {"num_labels": 5},
        lambda t: ForTokenClassification(
            t["logits"], t["labels"], SimpleNamespace(num_labels=5), num_items_in_batch=t.get("num_items_in_batch")
        ),
    )

# ForSequenceClassification: problem type inferred from num_labels and label dtype, or given
seq_cases = [
    ("single", 4, None, torch.randint(0, 4, (6,))),
    ("single_n", 4, None, torch.randint(0, 4, (6,))),
    ("regression_1", 1, None, torch.randn(6)),
    ("regression_3", 3, "regression", torch.randn(6, 3)),
    ("multi_label", 3, None, (torch.rand(6, 3) > 0.5).float()),
    ("multi_label_given", 4, "multi_label_classification", (torch.rand(6, 4) > 0.5).float()),
]
for tag, num_labels, problem_type, labels in seq_cases:
    logits = torch.randn(6, num_labels)
    inputs = {"logits": logits, "labels": labels}
    if tag.endswith("_n"):
        inputs["num_items_in_batch"] = torch.tensor(9)
    config = SimpleNamespace(num_labels=num_labels, problem_type=problem_type)
    extra = {"num_items_in_batch": inputs["num_items_in_batch"]} if "num_items_in_batch" in inputs else {}
    record(
        f"sequence_classification_{tag}", "for_sequence_classification_loss", inputs,
        {"num_labels": num_labels, "problem_type": problem_type},
        lambda t, config=config, extra=extra: ForSequenceClassificationLoss(t["labels"], t["logits"], config, **extra),
    )
    cases[-1]["inferred_problem_type"] = config.problem_type

# ForQuestionAnswering: positions past the end are ignored, negative ones clamp to 0; [B, 1] squeezed
for tag in ("plain", "n", "column"):
    start_logits = torch.randn(5, 9)
    end_logits = torch.randn(5, 9)
    start_positions = torch.tensor([0, 3, 12, -2, 8])
    end_positions = torch.tensor([4, 9, 5, 8, 30])
    if tag == "column":
        start_positions, end_positions = start_positions[:, None], end_positions[:, None]
    inputs = {"start_logits": start_logits, "end_logits": end_logits,
              "start_positions": start_positions, "end_positions": end_positions}
    if tag == "n":
        inputs["num_items_in_batch"] = torch.tensor(4)
    extra = {"num_items_in_batch": inputs["num_items_in_batch"]} if tag == "n" else {}
    record(
        f"question_answering_{tag}", "for_question_answering_loss", inputs, {},
        lambda t, extra=extra: ForQuestionAnsweringLoss(
            t["start_logits"], t["end_logits"], t["start_positions"], t["end_positions"], **extra
        ),
        grad_of=("start_logits", "end_logits"),
    )

# LabelSmoother
for tag, eps, shift, with_n in (
    ("plain", 0.1, False, False), ("shift", 0.1, True, False), ("n", 0.2, False, True), ("shift_n", 0.05, True, True),
):
    logits = torch.randn(3, 7, vocab)
    labels = labels_with_ignored((3, 7), vocab)
    inputs = {"logits": logits, "labels": labels}
    if with_n:
        inputs["num_items_in_batch"] = n_items
    smoother = LabelSmoother(epsilon=eps)
    record(
        f"label_smoother_{tag}", "label_smoother", inputs, {"epsilon": eps, "shift_labels": shift, "ignore_index": -100},
        lambda t, smoother=smoother, shift=shift: smoother(
            {"logits": t["logits"]}, t["labels"], shift_labels=shift, num_items_in_batch=t.get("num_items_in_batch")
        ),
    )

# loss_type derived from class names (PreTrainedModel.__init__)
loss_groups = f"({'|'.join(LOSS_MAPPING)})"
class_names = ["BertForMaskedLM", "LlamaForCausalLM", "GPT2LMHeadModel", "BertForSequenceClassification",
               "BertForTokenClassification", "BertForQuestionAnswering", "T5ForConditionalGeneration",
               "ViTForImageClassification", "Wav2Vec2ForCTC", "DetrForObjectDetection", "BertModel",
               "ForCausalLM", "RTDetrV2ForObjectDetection", "MyForMaskedLMForCausalLM"]
loss_types = {}
for name in class_names:
    if name in LOSS_MAPPING:
        loss_types[name] = name
    else:
        found = re.findall(loss_groups, name)
        loss_types[name] = found[0] if found else None

save_file(tensors, str(out_dir / "losses.safetensors"))
(out_dir / "losses.json").write_text(json.dumps(
    {"torch_version": torch.__version__, "cases": cases, "loss_mapping_keys": list(LOSS_MAPPING),
     "loss_types": loss_types}, indent=2,
))
print(f"losses: {len(cases)} cases")
