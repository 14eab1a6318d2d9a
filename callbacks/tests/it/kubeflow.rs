//! KubeflowCallback against upstream's (scripts/reference/kubeflow_callback.py: transformers'
//! KubeflowCallback driven through the same steps and logs, its POSTs captured by a local
//! HTTP server standing in for the Kubeflow Trainer controller). Ours posts to a loopback
//! server here and must send the same requests: path, bearer token, content type and the
//! JSON text byte for byte (the time and the remaining seconds, which follow the clock,
//! checked and set aside); without a token file neither sends anything.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tchtrain_callbacks::{
    JsonMap, JsonValue, KubeflowCallback, KubeflowSettings, TrainerCallback, TrainerControl,
    TrainerState, dumps,
};
use tchtrain_training_args::TrainingArguments;

use crate::common::{at, script_reference, temp_dir};

/// A loopback endpoint answering 200 to each POST; the requests as the reference records them.
fn controller() -> (String, Arc<Mutex<Vec<JsonValue>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/status", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut request_line = String::new();
            reader.read_line(&mut request_line).unwrap();
            let mut headers = Vec::new();
            loop {
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                if line.trim().is_empty() {
                    break;
                }
                let (k, v) = line.split_once(':').unwrap();
                headers.push((k.trim().to_lowercase(), v.trim().to_string()));
            }
            let header = |name: &str| {
                headers
                    .iter()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.clone())
            };
            let length: usize = header("content-length").unwrap().parse().unwrap();
            let mut body = vec![0u8; length];
            reader.read_exact(&mut body).unwrap();
            let mut entry = JsonMap::new();
            entry.insert("path", request_line.split(' ').nth(1).unwrap().to_string());
            entry.insert("authorization", header("authorization").unwrap());
            entry.insert("content_type", header("content-type").unwrap());
            entry.insert("body", normalize(&String::from_utf8(body).unwrap()));
            record.lock().unwrap().push(JsonValue::Object(entry));
            let mut stream = stream;
            stream
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                .unwrap();
        }
    });
    (url, seen)
}

/// The reference's `normalize`: the time and the remaining seconds checked and replaced.
fn normalize(body: &str) -> String {
    let mut out = body.to_string();
    let time_key = "\"lastUpdatedTime\": \"";
    if let Some(start) = out.find(time_key).map(|i| i + time_key.len()) {
        let end = start + out[start..].find('"').unwrap();
        let time = &out[start..end];
        assert!(
            time.len() >= 25 && time.ends_with("+00:00") && time.as_bytes()[10] == b'T',
            "{time}"
        );
        out.replace_range(start..end, "<time>");
    }
    let seconds_key = "\"estimatedRemainingSeconds\": ";
    if let Some(start) = out.find(seconds_key).map(|i| i + seconds_key.len()) {
        let end = start + out[start..].find(|c: char| !c.is_ascii_digit()).unwrap();
        assert!(end > start, "{body}");
        out.replace_range(start..end, "\"<seconds>\"");
    }
    out
}

#[test]
fn kubeflow_callback_sends_what_upstream_sends() {
    let reference = script_reference("kubeflow_callback");
    for case in at(&reference, "cases").as_array().unwrap() {
        let name = at(case, "name").as_str().unwrap();
        let work = temp_dir(&format!("kubeflow-{name}"));
        let token = work.join("token");
        if at(case, "token") == &JsonValue::Bool(true) {
            std::fs::write(
                &token,
                format!("{}\n", at(case, "token_text").as_str().unwrap()),
            )
            .unwrap();
        }
        let (url, seen) = controller();
        let settings = KubeflowSettings::from_lookup(|k| match k {
            "KUBEFLOW_TRAINER_SERVER_URL" => Some(url.clone()),
            "KUBEFLOW_TRAINER_SERVER_TOKEN" => Some(token.display().to_string()),
            _ => None,
        })
        .unwrap();
        let mut callback = KubeflowCallback::with_settings(KubeflowSettings {
            min_update_interval: Duration::ZERO,
            ..settings
        });
        let args = TrainingArguments::default();
        let mut control = TrainerControl::default();
        let mut state = TrainerState {
            max_steps: at(case, "max_steps").as_i64().unwrap(),
            ..TrainerState::default()
        };
        callback
            .on_train_begin(&args, &state, &mut control)
            .unwrap();
        for step in at(case, "steps").as_array().unwrap() {
            let step = step.as_array().unwrap();
            state.global_step = step[0].as_i64().unwrap();
            state.epoch = step[1].as_f64().unwrap();
            callback.on_step_end(&args, &state, &mut control).unwrap();
            if let Some(logs) = at(case, "logs")
                .as_object()
                .unwrap()
                .get(&state.global_step.to_string())
            {
                callback
                    .on_log(&args, &state, &mut control, logs.as_object().unwrap())
                    .unwrap();
            }
        }
        callback.on_train_end(&args, &state, &mut control).unwrap();
        let ours = JsonValue::Array(seen.lock().unwrap().clone());
        let theirs = at(case, "requests");
        if let (Some(a), Some(b)) = (ours.as_array(), theirs.as_array()) {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                assert_eq!(
                    dumps(x, None, true),
                    dumps(y, None, true),
                    "{name}: request {i}"
                );
            }
            assert_eq!(a.len(), b.len(), "{name}: requests");
        }
        let _ = std::fs::remove_dir_all(&work);
    }
}

/// Over HTTPS, the controller's certificate is checked against KUBEFLOW_TRAINER_SERVER_CA_CERT
/// (a real TLS server on 127.0.0.1, `scripts/reference/_https_controller.py`): with the CA the
/// updates arrive; without it (the system's roots do not know the test CA) the handshake fails
/// and, as upstream, training goes on without a report.
#[test]
fn kubeflow_callback_checks_the_controllers_certificate_against_the_ca_file() {
    use std::process::{Command, Stdio};
    let work = temp_dir("kubeflow-https");
    let mut server = Command::new(crate::common::venv_python())
        .arg(crate::common::repo().join("scripts/reference/_https_controller.py"))
        .arg(&work)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut port = String::new();
    BufReader::new(server.stdout.take().unwrap())
        .read_line(&mut port)
        .unwrap();
    let url = format!("https://127.0.0.1:{}/status", port.trim());
    std::fs::write(work.join("token"), "t0ken").unwrap();
    let args = TrainingArguments::default();
    let mut control = TrainerControl::default();
    let state = TrainerState {
        max_steps: 2,
        ..TrainerState::default()
    };
    for with_ca in [false, true] {
        let mut callback = KubeflowCallback::with_settings(
            KubeflowSettings::from_lookup(|k| match k {
                "KUBEFLOW_TRAINER_SERVER_URL" => Some(url.clone()),
                "KUBEFLOW_TRAINER_SERVER_TOKEN" => Some(work.join("token").display().to_string()),
                "KUBEFLOW_TRAINER_SERVER_CA_CERT" if with_ca => {
                    Some(work.join("ca.pem").display().to_string())
                }
                _ => None,
            })
            .unwrap(),
        );
        callback
            .on_train_begin(&args, &state, &mut control)
            .unwrap();
        callback.on_train_end(&args, &state, &mut control).unwrap();
    }
    let _ = server.kill();
    let _ = server.wait();
    let log = std::fs::read_to_string(work.join("requests.jsonl")).unwrap_or_default();
    let requests: Vec<JsonValue> = log
        .lines()
        .map(|l| tchtrain_callbacks::loads(l).unwrap())
        .collect();
    assert_eq!(requests.len(), 2, "{log}");
    let progress: Vec<i64> = requests
        .iter()
        .map(|r| {
            at(at(at(r, "body"), "trainerStatus"), "progressPercentage")
                .as_i64()
                .unwrap()
        })
        .collect();
    assert_eq!(progress, [0, 100]);
    assert_eq!(
        at(&requests[0], "authorization").as_str(),
        Some("Bearer t0ken")
    );
    let _ = std::fs::remove_dir_all(&work);
}
