//! Parity with transformers 5.23 (reference values from scripts/reference/trainer_callback.py):
//! DefaultFlowCallback decisions over a grid of arguments, EarlyStoppingCallback decisions,
//! and byte-identical trainer_state.json round trips, including one written by a real
//! Python Trainer run. All comparisons are exact: the decisions are booleans and integers,
//! and the JSON must match byte for byte.

use crate::common::{JsonExt, interval, reference_json, reference_text, save_strategy, temp_dir};
use tchtrain_callbacks::{
    CallbackHandler, CallbackState, DefaultFlowCallback, EarlyStoppingCallback, ExportableState,
    JsonMap, JsonValue, TrainerControl, TrainerState, dumps, loads,
};
use tchtrain_training_args::TrainingArguments;

fn flags(c: &TrainerControl) -> [bool; 5] {
    [
        c.should_log,
        c.should_evaluate,
        c.should_save,
        c.should_training_stop,
        c.should_epoch_stop,
    ]
}

fn ref_flags(e: &JsonValue) -> [bool; 5] {
    [
        e.bool("should_log"),
        e.bool("should_evaluate"),
        e.bool("should_save"),
        e.bool("should_training_stop"),
        e.bool("should_epoch_stop"),
    ]
}

/// The same loop as the reference script's `simulate` (Trainer._inner_training_loop's calls).
fn simulate(
    args: &TrainingArguments,
    max_steps: i64,
    num_epochs: i64,
    steps_per_epoch: i64,
) -> Vec<(String, i64, f64, [bool; 5])> {
    let mut handler = CallbackHandler::new(vec![Box::new(DefaultFlowCallback)]);
    let mut control = TrainerControl::default();
    let mut state = TrainerState::default();
    state.compute_steps(args, max_steps);
    state.max_steps = max_steps;
    state.num_train_epochs = num_epochs;
    let mut events = Vec::new();
    let empty = JsonMap::new();
    let after =
        |handler: &mut CallbackHandler, state: &TrainerState, control: &mut TrainerControl| {
            if control.should_log {
                handler.on_log(args, state, control, &empty).unwrap();
            }
            if control.should_evaluate {
                handler.on_evaluate(args, state, control, &empty).unwrap();
            }
            if control.should_save {
                handler.on_save(args, state, control).unwrap();
            }
        };
    handler.on_train_begin(args, &state, &mut control).unwrap();
    for epoch in 0..num_epochs {
        handler.on_epoch_begin(args, &state, &mut control).unwrap();
        for step in 0..steps_per_epoch {
            handler.on_step_begin(args, &state, &mut control).unwrap();
            state.global_step += 1;
            state.epoch = epoch as f64 + (step + 1) as f64 / steps_per_epoch as f64;
            handler.on_step_end(args, &state, &mut control).unwrap();
            events.push((
                "on_step_end".to_string(),
                state.global_step,
                state.epoch,
                flags(&control),
            ));
            after(&mut handler, &state, &mut control);
            if control.should_epoch_stop || control.should_training_stop {
                break;
            }
        }
        handler.on_epoch_end(args, &state, &mut control).unwrap();
        events.push((
            "on_epoch_end".to_string(),
            state.global_step,
            state.epoch,
            flags(&control),
        ));
        after(&mut handler, &state, &mut control);
        if control.should_training_stop {
            break;
        }
    }
    events
}

#[test]
fn default_flow_decisions_match_upstream_for_the_whole_grid() {
    let reference = reference_json("default_flow.json");
    let cases = reference.at("cases").as_array().unwrap();
    assert!(cases.len() > 200, "the grid has {} cases", cases.len());
    let mut events_checked = 0;
    for (i, case) in cases.iter().enumerate() {
        let cfg = case.at("config");
        let post = case.at("args");
        // The arguments as upstream holds them after __post_init__ (eval_steps fallback included).
        let args = TrainingArguments {
            logging_strategy: interval(cfg.str("logging_strategy")),
            logging_steps: post.f64("logging_steps"),
            logging_first_step: cfg.bool("logging_first_step"),
            eval_strategy: interval(cfg.str("eval_strategy")),
            eval_steps: post.at("eval_steps").as_f64(),
            eval_delay: post.f64("eval_delay"),
            save_strategy: save_strategy(cfg.str("save_strategy")),
            save_steps: post.f64("save_steps"),
            max_steps: cfg.i64("max_steps"),
            num_train_epochs: cfg.f64("num_train_epochs"),
            ..TrainingArguments::default()
        };
        let max_steps = case.i64("max_steps");

        let mut state = TrainerState::default();
        state.compute_steps(&args, max_steps);
        let steps = case.at("state_steps");
        assert_eq!(
            [
                state.logging_steps as f64,
                state.eval_steps as f64,
                state.save_steps as f64
            ],
            [
                steps.f64("logging_steps"),
                steps.f64("eval_steps"),
                steps.f64("save_steps")
            ],
            "case {i}: compute_steps for {}",
            dumps(cfg, None, true)
        );

        let got = simulate(
            &args,
            max_steps,
            case.i64("num_train_epochs"),
            cfg.i64("steps_per_epoch"),
        );
        let want = case.at("events").as_array().unwrap();
        assert_eq!(
            got.len(),
            want.len(),
            "case {i}: number of events for {}",
            dumps(cfg, None, true)
        );
        for (g, w) in got.iter().zip(want) {
            let w_event = (
                w.str("event").to_string(),
                w.i64("global_step"),
                w.f64("epoch"),
                ref_flags(w),
            );
            assert_eq!(*g, w_event, "case {i}: {}", dumps(cfg, None, true));
            events_checked += 1;
        }
    }
    assert!(
        events_checked > 2000,
        "only {events_checked} events compared"
    );
}

#[test]
fn early_stopping_decisions_match_upstream() {
    let reference = reference_json("early_stopping.json");
    for case in reference.at("cases").as_array().unwrap() {
        let args = TrainingArguments {
            eval_strategy: interval("steps"),
            eval_steps: Some(1.0),
            save_steps: 1.0,
            load_best_model_at_end: true,
            metric_for_best_model: Some(case.str("metric_for_best_model").to_string()),
            greater_is_better: case.at("greater_is_better").as_bool(),
            ..TrainingArguments::default()
        };
        let es = EarlyStoppingCallback::new(case.i64("patience"), case.f64("threshold"));
        let mut handler = CallbackHandler::new(vec![Box::new(DefaultFlowCallback), Box::new(es)]);
        let mut state = TrainerState::default();
        let mut control = TrainerControl::default();
        handler.on_train_begin(&args, &state, &mut control).unwrap();
        let key = case.str("metric_key");
        for (i, step) in case.at("steps").as_array().unwrap().iter().enumerate() {
            state.global_step = i as i64 + 1;
            let value = step.f64("value");
            let mut metrics = JsonMap::new();
            metrics.insert(key, value);
            metrics.insert("eval_runtime", 0.5);
            assert_eq!(
                state.best_metric.map(f64::to_bits),
                step.at("best_metric_before").as_f64().map(f64::to_bits)
            );
            handler
                .on_evaluate(&args, &state, &mut control, &metrics)
                .unwrap();
            let cb = handler.get::<EarlyStoppingCallback>().unwrap();
            let what = format!(
                "{} step {i} value {value}",
                case.str("metric_for_best_model")
            );
            assert_eq!(
                cb.early_stopping_patience_counter,
                step.i64("counter"),
                "{what}"
            );
            assert_eq!(
                control.should_training_stop,
                step.bool("should_training_stop"),
                "{what}"
            );
            // Trainer._determine_best_metric runs after on_evaluate.
            let wanted = args.metric_for_best_model.as_deref().unwrap();
            let wanted = if wanted.starts_with("eval_") {
                wanted.to_string()
            } else {
                format!("eval_{wanted}")
            };
            if let Some(v) = metrics.get(&wanted).and_then(JsonValue::as_f64) {
                let greater = args.greater_is_better == Some(true);
                let best = state.best_metric.unwrap_or(if greater {
                    f64::NEG_INFINITY
                } else {
                    f64::INFINITY
                });
                state.best_metric = Some(best);
                if (greater && v > best) || (!greater && v < best) {
                    state.best_metric = Some(v);
                    state.best_global_step = Some(state.global_step);
                }
            }
        }
        let cb = handler.get::<EarlyStoppingCallback>().unwrap();
        assert_eq!(
            dumps(&cb.state().to_json(), None, true),
            dumps(case.at("state"), None, true)
        );
    }
}

#[test]
fn early_stopping_requires_metric_and_eval_strategy() {
    let state = TrainerState {
        max_steps: 3,
        ..Default::default()
    };
    let mut control = TrainerControl::default();
    let mut cb = EarlyStoppingCallback::default();
    let no_metric = TrainingArguments {
        eval_strategy: interval("steps"),
        ..TrainingArguments::default()
    };
    let err = tchtrain_callbacks::TrainerCallback::on_train_begin(
        &mut cb,
        &no_metric,
        &state,
        &mut control,
    )
    .unwrap_err();
    assert!(err.to_string().contains("metric_for_best_model"), "{err}");
    let no_eval = TrainingArguments {
        metric_for_best_model: Some("loss".into()),
        ..TrainingArguments::default()
    };
    let err = tchtrain_callbacks::TrainerCallback::on_train_begin(
        &mut cb,
        &no_eval,
        &state,
        &mut control,
    )
    .unwrap_err();
    assert!(err.to_string().contains("eval_strategy"), "{err}");
}

#[test]
fn python_trainer_state_files_round_trip_byte_identically() {
    for name in [
        "trainer_state.json",
        "trainer_state_final.json",
        "trainer_state_odd.json",
        "trainer_state_default.json",
    ] {
        let text = reference_text(name);
        let state =
            TrainerState::from_json_str(&text, name).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            state.to_json_string(),
            text,
            "{name} re-serialised differently"
        );
        // And through the file functions.
        let dir = temp_dir(&format!("roundtrip-{name}"));
        let path = dir.join("trainer_state.json");
        state.save_to_json(&path).unwrap();
        let again = TrainerState::load_from_json(&path).unwrap();
        assert_eq!(
            again.to_json_string(),
            text,
            "{name} after save_to_json + load_from_json"
        );
        assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
    }
    // A fresh state is upstream's `TrainerState()` ("epoch": 0 and "total_flos": 0 as ints).
    assert_eq!(
        TrainerState::default().to_json_string(),
        reference_text("trainer_state_default.json")
    );
}

#[test]
fn python_trainer_state_values_are_read() {
    let state = TrainerState::load_from_json(
        crate::common::reference_dir().join("trainer_state_final.json"),
    )
    .unwrap();
    assert_eq!(state.global_step, 12);
    assert_eq!(state.max_steps, 12);
    assert_eq!(
        (state.logging_steps, state.eval_steps, state.save_steps),
        (2, 3, 3)
    );
    assert_eq!(state.train_batch_size, Some(4));
    assert_eq!(state.epoch, 1.5);
    assert_eq!(state.best_global_step, Some(12));
    assert_eq!(
        state.best_model_checkpoint.as_deref(),
        Some("run/checkpoint-12")
    );
    let evals: Vec<&JsonMap> = state
        .log_history
        .iter()
        .filter(|e| e.contains_key("eval_loss"))
        .collect();
    assert_eq!(evals.len(), 4);
    assert_eq!(
        state.best_metric,
        evals[3].get("eval_loss").and_then(JsonValue::as_f64)
    );
    assert_eq!(state.log_history[0].get("step"), Some(&JsonValue::Int(1)));

    // Restoring the stateful callbacks: EarlyStoppingCallback arguments and TrainerControl flags.
    let mut handler = CallbackHandler::new(vec![
        Box::new(DefaultFlowCallback),
        Box::new(EarlyStoppingCallback::default()),
    ]);
    let mut control = TrainerControl::default();
    let not_found = handler
        .load_callback_state(&state.stateful_callbacks, &mut control)
        .unwrap();
    assert!(not_found.is_empty());
    let es = handler.get::<EarlyStoppingCallback>().unwrap();
    assert_eq!(
        (es.early_stopping_patience, es.early_stopping_threshold),
        (3, 1e-05)
    );
    assert!(control.should_save && control.should_training_stop && !control.should_log);
}

#[test]
fn stateful_callbacks_are_written_as_upstream_does() {
    // The first checkpoint of the Python run: rebuild its stateful_callbacks from live objects.
    let python =
        TrainerState::load_from_json(crate::common::reference_dir().join("trainer_state.json"))
            .unwrap();
    let py_es = python
        .stateful_callbacks
        .get("EarlyStoppingCallback")
        .unwrap();
    let py_es =
        EarlyStoppingCallback::from_state(&CallbackState::from_json(py_es, "test").unwrap())
            .unwrap();
    let py_control = python.stateful_callbacks.get("TrainerControl").unwrap();
    let py_control =
        TrainerControl::from_state(&CallbackState::from_json(py_control, "test").unwrap()).unwrap();

    let handler = CallbackHandler::new(vec![
        Box::new(DefaultFlowCallback),
        Box::new(EarlyStoppingCallback::new(3, 1e-5)),
    ]);
    let mut state = TrainerState::with_stateful_callbacks(
        handler.exportable_states(&TrainerControl::default()),
    );
    let mut handler = handler;
    handler
        .get_mut::<EarlyStoppingCallback>()
        .unwrap()
        .early_stopping_patience_counter = py_es.early_stopping_patience_counter;
    state.update_stateful_callbacks(handler.exportable_states(&py_control));
    assert_eq!(
        dumps(
            &JsonValue::Object(state.stateful_callbacks.clone()),
            Some(2),
            true
        ),
        dumps(
            &JsonValue::Object(python.stateful_callbacks.clone()),
            Some(2),
            true
        )
    );

    // Two callbacks of one class are stored as a list, as upstream's __post_init__ does.
    let two = CallbackHandler::new(vec![
        Box::new(DefaultFlowCallback),
        Box::new(EarlyStoppingCallback::new(1, 0.0)),
        Box::new(EarlyStoppingCallback::new(3, 0.5)),
    ]);
    let state =
        TrainerState::with_stateful_callbacks(two.exportable_states(&TrainerControl::default()));
    let odd =
        TrainerState::load_from_json(crate::common::reference_dir().join("trainer_state_odd.json"))
            .unwrap();
    let mut expected = odd.stateful_callbacks.clone();
    // The reference's second callback has a counter of 2.
    if let Some(JsonValue::Array(list)) = expected.get_mut("EarlyStoppingCallback") {
        list[1] = EarlyStoppingCallback::new(3, 0.5).state().to_json();
    }
    assert_eq!(
        dumps(&JsonValue::Object(state.stateful_callbacks), None, true),
        dumps(&JsonValue::Object(expected), None, true)
    );
}

#[test]
fn control_state_matches_upstream() {
    let control = TrainerControl {
        should_training_stop: true,
        should_save: true,
        ..TrainerControl::default()
    };
    assert_eq!(
        dumps(&control.state().to_json(), Some(2), true) + "\n",
        reference_text("control_state.json")
    );
    let back = TrainerControl::from_state(&control.state()).unwrap();
    assert_eq!(back, control);
}

#[test]
fn reference_files_parse_with_python_semantics() {
    // NaN in the reference is read as a float, ints stay ints.
    let es = reference_json("early_stopping.json");
    let nan_case = &es.at("cases").as_array().unwrap()[3];
    let v = nan_case.at("steps").as_array().unwrap()[1].at("value");
    assert!(matches!(v, JsonValue::Float(f) if f.is_nan()));
    assert!(loads("[1, 1.0]").unwrap().as_array().unwrap()[0].as_i64() == Some(1));
}
