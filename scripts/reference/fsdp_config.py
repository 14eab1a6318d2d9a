"""Reference for integrations/fsdp: TrainingArguments(fsdp=..., fsdp_config=...).fsdp_plugin_args
(transformers 5.23 `_process_fsdp_args`) for a set of option combinations, or the error; and
whether accelerate's `FullyShardedDataParallelPlugin(**fsdp_plugin_args)` (what the Trainer
builds in `create_accelerator_and_postprocess`) accepts them, or its error.

Usage: python fsdp_config.py OUT_DIR  (writes OUT_DIR/fsdp_config.json)
"""

import json
import sys
import tempfile
from pathlib import Path

from accelerate.utils import FullyShardedDataParallelPlugin
from transformers import TrainingArguments

CASES = [
    ("bool_default", {"fsdp": True}),
    ("legacy_full_shard_offload", {"fsdp": "full_shard offload auto_wrap"}),
    ("legacy_shard_grad_op", {"fsdp": "shard_grad_op"}),
    ("v1_no_shard", {"fsdp": "no_shard", "fsdp_config": {"version": 1}}),
    ("v2_no_shard_rejected", {"fsdp": "no_shard"}),
    ("transformer_wrap", {"fsdp": True, "fsdp_config": {"transformer_layer_cls_to_wrap": "GPT2Block", "fsdp_state_dict_type": "SHARDED_STATE_DICT"}}),
    ("size_wrap", {"fsdp": True, "fsdp_config": {"auto_wrap_policy": "SIZE_BASED_WRAP", "min_num_params": 1000000, "cpu_ram_efficient_loading": "true"}}),
    ("bad_wrap_policy", {"fsdp": True, "fsdp_config": {"auto_wrap_policy": "EVERYTHING"}}),
    ("v1_prefetch", {"fsdp": True, "fsdp_config": {"version": 1, "backward_prefetch": "backward_pre", "forward_prefetch": True, "limit_all_gathers": "false", "activation_checkpointing": True}}),
    ("v2_reshard_false", {"fsdp": True, "fsdp_config": {"reshard_after_forward": "false", "activation_checkpointing": "yes"}}),
    ("unknown_option", {"fsdp": "full_shard sideways"}),
    ("size_wrap_float", {"fsdp": True, "fsdp_config": {"auto_wrap_policy": "SIZE_BASED_WRAP", "min_num_params": 1e6}}),
    ("v2_local_state_dict", {"fsdp": True, "fsdp_config": {"state_dict_type": "LOCAL_STATE_DICT"}}),
    ("v1_local_state_dict", {"fsdp": True, "fsdp_config": {"version": 1, "state_dict_type": "LOCAL_STATE_DICT"}}),
]

out = []
for name, kwargs in CASES:
    with tempfile.TemporaryDirectory() as d:
        try:
            args = TrainingArguments(output_dir=d, use_cpu=True, report_to="none", **kwargs)
            result = {"plugin_args": args.fsdp_plugin_args}
        except (ValueError, KeyError) as e:
            result = {"error": str(e)}
        if "plugin_args" in result:
            try:
                FullyShardedDataParallelPlugin(**result["plugin_args"])
                result["plugin"] = "ok"
            except ValueError as e:
                result["plugin_error"] = str(e)
            except RuntimeError as e:
                # FSDP v1's default `sync_module_states` needs an accelerator device.
                result["plugin_error_without_gpu"] = str(e)
    out.append({"name": name, "kwargs": kwargs, "result": result})
Path(sys.argv[1], "fsdp_config.json").write_text(json.dumps(out, indent=2))
