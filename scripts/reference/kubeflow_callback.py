"""Reference for callbacks/tests/it/kubeflow.rs: the status updates upstream's
KubeflowCallback sends to the Kubeflow Trainer controller, captured by a local HTTP server
standing in for the controller's endpoint (KUBEFLOW_TRAINER_SERVER_URL), with a service-account
token file (KUBEFLOW_TRAINER_SERVER_TOKEN).

The callback is driven through on_train_begin, then four steps (on_step_end each, a log
after the second: numbers, a bool, a string), then on_train_end. Upstream sends a step's
update at most every 5 seconds; the reference sets the callback's _MIN_UPDATE_INTERVAL to 0
so that every step's update is sent (the Rust test sets the same interval), making the
captured sequence independent of the machine's speed. A second case has no token file: no
update is sent, and training goes on.

Writes OUT_DIR/kubeflow_callback.json: {"cases": [...]}, each case with
  name, token    whether a token file is given;
  max_steps, steps  [[global_step, epoch], ...] and logs {after_step: logs};
  requests       each POST: path, authorization, content_type, body (the raw JSON text, the
                 time and the remaining seconds, which depend on the clock, checked and replaced
                 by <time> and <seconds>).

Usage: python kubeflow_callback.py OUT_DIR
"""

import json
import os
import re
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

MAX_STEPS = 4
STEPS = [[1, 0.125], [2, 0.25], [3, 0.375], [4, 0.5]]
LOGS = {"2": {"loss": 2.5, "learning_rate": 0.0003, "grad_norm": 1.25, "epoch": 0.25, "note": "x", "flag": True,
              "num_input_tokens_seen": 512}}
TOKEN = "secret-service-account-token"

TIME = re.compile(r'"lastUpdatedTime": "([^"]+)"')
SECONDS = re.compile(r'"estimatedRemainingSeconds": (\d+)')


def normalize(body):
    """The clock-dependent values checked and replaced."""
    for t in TIME.findall(body):
        assert re.match(r"^20[0-9]{2}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{6})?\+00:00$", t), t
    body = TIME.sub('"lastUpdatedTime": "<time>"', body)
    return SECONDS.sub('"estimatedRemainingSeconds": "<seconds>"', body)


def serve():
    """A controller endpoint on 127.0.0.1 recording each POST."""
    requests = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"])).decode()
            requests.append({"path": self.path, "authorization": self.headers.get("Authorization"),
                             "content_type": self.headers.get("Content-Type"), "body": normalize(body)})
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, requests


def run(token):
    from transformers import TrainerControl, TrainerState, TrainingArguments
    from transformers.integrations import KubeflowCallback

    server, requests = serve()
    tmp = Path(tempfile.mkdtemp(prefix="tchtrain-kubeflow-reference-"))
    token_path = tmp / "token"
    if token:
        token_path.write_text(TOKEN + "\n")
    os.environ["KUBEFLOW_TRAINER_SERVER_URL"] = f"http://127.0.0.1:{server.server_address[1]}/status"
    os.environ["KUBEFLOW_TRAINER_SERVER_TOKEN"] = str(token_path)
    os.environ.pop("KUBEFLOW_TRAINER_SERVER_CA_CERT", None)
    args = TrainingArguments(output_dir=str(tmp / "out"), report_to=[], use_cpu=True)
    callback = KubeflowCallback()
    callback._MIN_UPDATE_INTERVAL = 0.0
    state, control = TrainerState(), TrainerControl()
    state.max_steps = MAX_STEPS
    callback.on_train_begin(args, state, control)
    for step, epoch in STEPS:
        state.global_step, state.epoch = step, epoch
        callback.on_step_end(args, state, control)
        if str(step) in LOGS:
            callback.on_log(args, state, control, logs=dict(LOGS[str(step)]))
    callback.on_train_end(args, state, control)
    server.shutdown()
    return requests


if __name__ == "__main__":
    OUT = Path(sys.argv[1])
    OUT.mkdir(parents=True, exist_ok=True)
    cases = []
    for name, token in [("with_a_token", True), ("without_a_token_file", False)]:
        cases.append({"name": name, "token": token, "max_steps": MAX_STEPS, "steps": STEPS, "logs": LOGS,
                      "token_text": TOKEN, "requests": run(token)})
    (OUT / "kubeflow_callback.json").write_text(json.dumps({"cases": cases}, indent=1))
