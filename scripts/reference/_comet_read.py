"""Reads a Comet offline experiment archive (`COMET_START_ONLINE=false`: the zip that `comet
upload` sends) with the comet_ml package's own code, for comet_callback.py and
callbacks/tests/it/comet.rs: `experiment.json` and every line of `messages.json` are validated
against the JSON schemas the package ships for the upload (comet_ml.schemas, as the uploader
does), every metric, parameter and log_other message is rebuilt with the package's message classes, and the
archive is summarised by `comet offline --csv` (comet_ml.scripts.comet_offline).

What the Python SDK logs of its own Python process (the script's source and file name, the
installed Python and OS packages, console output, host details, the interpreter's command
line as `run_arg_<i>` parameters (source `cli`), sampled system metrics
`sys.*` and `process duration`, the model's Python repr as its graph) is set aside, not
validated (the SDK's own host details fail its schema where the IP is unknown): the result
holds the message types set aside, not their contents.

Prints JSON: {"archive_name": "<offline_id>.zip" or "<offline_id>-<suffix>.zip" with the
key and the suffix's length in place of their text, "experiment": experiment.json without
its id and times, "messages": [{"type", "payload"}] in file order without ids and
timestamps, "set_aside": the sorted types set aside, "csv": the `comet offline --csv` rows
of the param, metric and log_other sections}.

Usage: python _comet_read.py ARCHIVE.zip
"""

import argparse
import contextlib
import csv
import io
import json
import os
import re
import sys
import zipfile

from comet_ml import schemas
from comet_ml.messages import LogOtherMessage, MetricMessage, ParameterMessage
from comet_ml.offline_utils import extract_experiment_key_from_offline_file
from comet_ml.scripts import comet_offline

VALIDATORS = {
    "parameter_msg": schemas.get_parameter_msg_validator(),
    "metric_msg": schemas.get_metric_msg_validator(),
    "log_other": schemas.get_log_other_msg_validator(),
}
PYTHON_PROCESS = {"file_name", "file_upload", "installed_packages", "os_packages", "standard_output",
                  "system_details", "graph"}


def python_process(message):
    payload = message["payload"]
    if message["type"] in PYTHON_PROCESS:
        return True
    if message["type"] == "metric_msg":
        name = payload["metric"]["metricName"]
        return name.startswith("sys.") or name == "process duration"
    if message["type"] == "log_other":
        return payload["key"].startswith("sys.")
    if message["type"] == "parameter_msg":
        return (payload.get("param") or payload.get("params"))["source"] == "cli"
    return False


def rebuilt(message):
    kind, payload = message["type"], message["payload"]
    if kind == "metric_msg":
        out = MetricMessage.from_message_dict(payload).to_message_dict()
    elif kind == "parameter_msg":
        out = ParameterMessage.from_message_dict(payload).to_message_dict()
    else:
        out = LogOtherMessage.from_db_message_dict(payload).to_message_dict()
    return {k: v for k, v in out.items() if k not in ("message_id", "local_timestamp")}


def read(path):
    name = os.path.basename(path)
    with zipfile.ZipFile(path) as archive:
        experiment = json.loads(archive.read("experiment.json"))
        schemas.get_experiment_file_validator().validate(experiment)
        lines = archive.read("messages.json").decode("utf-8").splitlines()
    key = experiment["offline_id"]
    assert extract_experiment_key_from_offline_file(path) == key, (name, key)
    assert re.fullmatch(r"[0-9a-f]{32}", key), key
    shape = re.sub(r"^[0-9a-f]{32}", "<offline_id>", name)
    shape = re.sub(r"-([A-Za-z]+)\.zip$", lambda m: "-<%d letters>.zip" % len(m.group(1)), shape)
    messages, set_aside, set_aside_names, ids = [], set(), set(), []
    for line in lines:
        message = json.loads(line)
        ids.append(message["payload"].get("message_id"))
        if python_process(message):
            set_aside.add(message["type"])
            payload = message["payload"]
            named = payload.get("metric") or payload.get("param") or payload.get("params") or {}
            set_aside_names.add(named.get("metricName") or named.get("paramName") or payload.get("key"))
            continue
        VALIDATORS[message["type"]].validate(message["payload"])
        messages.append({"type": message["type"], "payload": rebuilt(message)})
    assert ids == sorted(ids) and len(set(ids)) == len(ids), "message ids must increase"
    rows = io.StringIO()
    with contextlib.redirect_stdout(rows):
        comet_offline.main(["--csv", "--no-header", "--section", "param", "--section", "metric",
                            "--section", "log_other", path])
    csv_rows = [r[3:] for r in csv.reader(io.StringIO(rows.getvalue())) if r[5] not in set_aside_names]
    return {
        "archive_name": shape,
        "experiment": {k: v for k, v in experiment.items() if k not in ("offline_id", "start_time", "stop_time")},
        "messages": messages,
        "set_aside": sorted(set_aside),
        "csv": csv_rows,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("archive")
    print(json.dumps(read(parser.parse_args().archive), sort_keys=True))
