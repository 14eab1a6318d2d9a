"""Reads a W&B run's transaction log (`run-<id>.wandb`: the LevelDB-style log of `wandb.proto`
`Record`s that wandb-core writes, and that `wandb sync` uploads) with the wandb package's own
message definitions, and folds it into what the run holds: the run record's fields, the config
and summary (every update applied in order), the metric definitions, the history rows and the
exit record. Timing values (`_timestamp`, `_runtime`, `_wandb.runtime`) are kept as keys with
the value replaced by "<time>". Used by wandb_callback.py on upstream's run and by
callbacks/tests/it/wandb.rs on ours.

Usage: python _wandb_records.py RUN_FILE    (prints the folded run as JSON)
"""

import json
import struct
import sys
import zlib

from google.protobuf.json_format import MessageToDict
from wandb.proto import wandb_internal_pb2 as pb

BLOCK = 32768
TIMING = {"_timestamp", "_runtime"}


def records(path):
    data = open(path, "rb").read()
    if data[:4] != b":W&B" or data[4:7] != b"\xe1\xbe\x00":
        raise ValueError(f"{path}: not a W&B transaction log (header {data[:7]!r})")
    pos, buf, out = 7, b"", []
    while pos < len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:
            if data[pos:pos + left] != b"\x00" * left:
                raise ValueError(f"{path}: block trailer at {pos} is not zero")
            pos += left
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk = data[pos + 7:pos + 7 + length]
        if len(chunk) != length:
            raise ValueError(f"{path}: record at {pos} is cut")
        check = zlib.crc32(chunk, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF
        if check != crc:
            raise ValueError(f"{path}: checksum of the record at {pos}")
        pos += 7 + length
        buf = chunk if kind in (1, 2) else buf + chunk
        if kind in (1, 4):
            r = pb.Record()
            r.ParseFromString(buf)
            out.append(r)
    return out


def path_of(item):
    return list(item.nested_key) if item.nested_key else [item.key]


def value(keys, text):
    return "<time>" if keys[-1] in TIMING or keys == ["_wandb", "runtime"] else json.loads(text)


def apply(tree, keys, v):
    for k in keys[:-1]:
        tree = tree.setdefault(k, {})
    tree[keys[-1]] = v


def fold(path):
    run, config, summary, metrics, history, exits, kinds = None, {}, {}, [], [], [], []
    for r in records(path):
        kind = r.WhichOneof("record_type")
        kinds.append(kind)
        if kind == "run":
            fields = MessageToDict(r.run, preserving_proto_field_name=True)
            for item in r.run.config.update:
                apply(config, path_of(item), value(path_of(item), item.value_json))
            run = {k: v for k, v in fields.items() if k in ("project", "display_name", "run_group", "job_type", "notes", "tags", "entity")}
        elif kind == "config":
            for item in r.config.update:
                apply(config, path_of(item), value(path_of(item), item.value_json))
        elif kind == "summary":
            for item in r.summary.update:
                apply(summary, path_of(item), value(path_of(item), item.value_json))
        elif kind == "metric":
            metrics.append(MessageToDict(r.metric, preserving_proto_field_name=True))
        elif kind == "history":
            row = {}
            for item in r.history.item:
                row["/".join(path_of(item))] = value(path_of(item), item.value_json)
            history.append({"step": r.history.step.num, "row": row})
        elif kind == "exit":
            exits.append({"exit_code": r.exit.exit_code})
    return {
        "run": run, "config": config, "summary": summary, "metrics": metrics, "history": history,
        "exit": exits, "has_header": kinds[:1] == ["header"],
    }


if __name__ == "__main__":
    print(json.dumps(fold(sys.argv[1]), indent=1, sort_keys=True))
