"""Reads an emissions file as codecarbon 3.3 does, for callbacks/tests/it/codecarbon.rs and the
Trainer's trackers test: upstream's CodeCarbonCallback runs once more into the same folder
(its EmissionsTracker appends a row only when the file's header is the one it writes, and backs
the file up otherwise), then pandas reads the file back.

As a module: `append_and_read(folder, output_file)`; as a script:
`python _codecarbon_read.py FOLDER [OUTPUT_FILE]` prints the JSON.

Returns {"header": [...], "rows": [{column: text}], "backups": [names], "parsed": [{column:
value as pandas parses it}]}; the rows are the file's text cells (csv module), the last one
upstream's.
"""

import csv
import io
import json
import math
import os
import sys
from pathlib import Path


def run_upstream(folder, seconds=0.3):
    """Upstream's callback through its Trainer events, writing into `folder`."""
    import time

    from transformers import TrainerControl, TrainerState, TrainingArguments
    from transformers.integrations import CodeCarbonCallback

    args = TrainingArguments(output_dir=str(folder), report_to=[], use_cpu=True)
    state, control = TrainerState(), TrainerControl()
    callback = CodeCarbonCallback()
    callback.on_init_end(args, state, control)
    callback.on_train_begin(args, state, control)
    time.sleep(seconds)
    callback.on_train_end(args, state, control)


def read(folder, output_file="emissions.csv"):
    import pandas as pd

    path = Path(folder) / output_file
    text = path.read_text()
    rows = list(csv.reader(io.StringIO(text)))
    header, body = rows[0], rows[1:]
    parsed = pd.read_csv(path).to_dict(orient="records")

    def clean(v):
        if isinstance(v, float) and math.isnan(v):
            return None
        return v.item() if hasattr(v, "item") else v

    return {
        "header": header,
        "rows": [dict(zip(header, r)) for r in body],
        "backups": sorted(p.name for p in Path(folder).iterdir() if p.name.startswith(output_file) and p.name != output_file),
        "parsed": [{k: clean(v) for k, v in r.items()} for r in parsed],
    }


def append_and_read(folder, output_file="emissions.csv"):
    os.environ["CODECARBON_OUTPUT_FILE"] = output_file
    run_upstream(folder)
    return read(folder, output_file)


if __name__ == "__main__":
    folder = sys.argv[1]
    name = sys.argv[2] if len(sys.argv) > 2 else "emissions.csv"
    print(json.dumps(append_and_read(folder, name)))
