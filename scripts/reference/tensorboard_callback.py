"""Reference for callbacks/tests/it/handler_and_loggers.rs: what upstream's TensorBoardCallback
writes at the beginning of training, and what PyTorch's `SummaryWriter.add_hparams` writes for
`args.to_sanitized_dict()`, as TensorBoard reads them back.

Writes into OUT_DIR:
  tensorboard_callback.json  {"args": the TrainingArguments keyword arguments,
                              "model_config_json": model.config.to_json_string(),
                              "read": what `read(LOG_DIR)` returns for upstream's folder}

`python tensorboard_callback.py --read LOG_DIR` prints `read(LOG_DIR)` as JSON: the Rust test
reads its own event files with this same function and compares.

Usage: python tensorboard_callback.py OUT_DIR
       python tensorboard_callback.py --read LOG_DIR
"""

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path


def read(log_dir):
    """Every run under `log_dir` (the folder itself is ""; the hparams sub-run is "hparams"),
    as TensorBoard's EventAccumulator and the hparams plugin's protobufs see it: text summaries
    (tag -> [[step, text]]), scalars, and the hparams plugin data as dicts."""
    from google.protobuf import json_format
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    runs = {}
    for folder, _, files in sorted(os.walk(log_dir)):
        if not any(f.startswith("events.out.tfevents.") for f in files):
            continue
        run = os.path.relpath(folder, log_dir)
        run = "" if run == "." else "hparams"
        acc = EventAccumulator(folder, size_guidance={"scalars": 0, "tensors": 0})
        acc.Reload()
        tags = acc.Tags()
        hparams = {}
        try:
            contents = acc.PluginTagToContent("hparams")
        except KeyError:  # no hparams summaries in this run
            contents = {}
        for tag, content in sorted(contents.items()):
            data = plugin_data_pb2.HParamsPluginData.FromString(content)
            hparams[tag] = json_format.MessageToDict(data, preserving_proto_field_name=True)
        runs[run] = {
            "file_version": acc.file_version,
            "texts": {
                t: [[e.step, e.tensor_proto.string_val[0].decode()] for e in acc.Tensors(t)]
                for t in tags["tensors"]
            },
            "scalars": {t: [[e.step, e.value] for e in acc.Scalars(t)] for t in tags["scalars"]},
            "hparams": hparams,
        }
    return runs


if sys.argv[1] == "--read":
    print(json.dumps(read(sys.argv[2]), sort_keys=True))
    sys.exit(0)

OUT = Path(sys.argv[1])
OUT.mkdir(parents=True, exist_ok=True)
TMP = Path(tempfile.mkdtemp(prefix="tchtrain-tensorboard-reference-"))

import transformers  # noqa: E402
from torch.utils.tensorboard import SummaryWriter  # noqa: E402
from transformers import GPT2Config, TrainerControl, TrainerState, TrainingArguments  # noqa: E402
from transformers.integrations import TensorBoardCallback  # noqa: E402

# The default verbosity: `disable_tqdm` defaults to whether the log level is above WARNING.
transformers.logging.set_verbosity_warning()

ARGS = dict(
    output_dir="tensorboard_out",
    run_name="reference-run",
    learning_rate=3e-4,
    per_device_train_batch_size=4,
    gradient_accumulation_steps=2,
    num_train_epochs=2.0,
    logging_steps=5,
    lr_scheduler_type="cosine_with_min_lr",
    lr_scheduler_kwargs={"min_lr": 1e-06},
    label_names=["labels"],
    seed=7,
    report_to=["tensorboard"],
    use_cpu=True,
)


class Model:
    """What the callback reads of a model: its `config`."""

    def __init__(self, config):
        self.config = config


args = TrainingArguments(**ARGS)
config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=1000, num_labels=3)
log_dir = TMP / "runs"
callback = TensorBoardCallback()
callback.logging_dir = str(log_dir)
callback.on_train_begin(args, TrainerState(), TrainerControl(), model=Model(config))
# What transformers 4.x's callback also wrote (5.23 no longer does): the HParams dashboard.
callback.tb_writer.add_hparams(args.to_sanitized_dict(), metric_dict={}, run_name="hparams")
callback.on_train_end(args, TrainerState(), TrainerControl())

result = {"args": ARGS, "model_config_json": config.to_json_string(), "read": read(str(log_dir))}
(OUT / "tensorboard_callback.json").write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
shutil.rmtree(TMP, ignore_errors=True)
