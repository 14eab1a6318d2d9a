//! `cargo xtask <command>`: the project's automation, std only, never linking tch.
//!
//! * `setup` — provision torch 2.13.0 (+ transformers 5.23.0 for reference values) in a
//!   per-user virtualenv, point cargo at it, fetch the offline assets, generate the
//!   reference values. Idempotent.
//! * `test` — `setup`, then the whole test suite, with one summary line.
//! * `bench` — `setup`, then benchmarks side by side with PyTorch / transformers.
//! * `demo` — `setup`, then the main training job (MiniLM fine-tuned on Rotten Tomatoes
//!   sentiment; `--clm`: SmolLM2-135M fine-tuned on hamlet.txt).
//! * `e2e` — `setup`, then the example scripts against upstream-equivalent Python drivers
//!   (same flags, same data, 1 and 2 ranks), with tables of per-step differences.
//! * `launch` — torchrun for one node: starts N ranks of a command, stops all if one fails.
//! * `fuzz` — `setup`, then a bounded libFuzzer run of every parser's fuzz target.
//! * `codegen` — regenerate the generated sources from the pinned Python packages
//!   (`--check`: fail when a committed one is stale; `test` runs the check).

mod bench;
mod build_examples;
mod clean_cache;
mod cmd;
mod codegen;
mod demo;
mod demo_lora;
mod demo_sentiment;
mod disk;
mod e2e;
mod fuzz;
mod gpu_bundle;
mod json;
mod launch;
mod paths;
mod setup;
mod signal;
mod soak;
mod soak_ranks;
mod test;
mod test_jobs;

use std::process::ExitCode;

const USAGE: &str = "\
usage: cargo xtask <command> [options]

commands:
  setup [--verify] [--libtorch DIR]
        provision torch 2.13.0 + transformers 5.23.0 in a per-user virtualenv,
        write .cargo/libtorch.toml, fetch offline assets, generate reference values.
        --verify        re-hash every asset against assets/manifest.json
        --libtorch DIR  build against this libtorch (a folder with lib/ and include/)
                        instead of the virtualenv's torch
  test [--gpu] [-- CARGO_TEST_ARGS...]
        setup, then `cargo test --workspace` (unit, integration, doc, parity and
        multi-process tests, the fuzz targets' replay of their seeds and seeded
        mutations; built with every crate's `cuda` feature when libtorch has CUDA;
        the binaries run side by side, TCHTRAIN_TEST_JOBS at a time, the longest in
        shards), `e2e --short`, and a summary line
        --gpu           also the tests that need a CUDA device (NCCL collectives, the
                        Trainer on one GPU: ZeRO-3 with offload over NCCL)
  bench [--micro] [--repeat N] [--threads N] [--jobs A,B] [--precisions fp32,bf16] [--ranks N]
        setup, release builds of the bench examples, then N rounds (default 2) alternating
        our Trainer, upstream's Python Trainer (scripts/bench/bench_trainer.py) and a bare
        tch loop on tiny GPT-2, GPT-2 6x384 and MiniLM classification in fp32 / bf16:
        tokens/s, median step, peak RSS, ratios, matmul FLOP/s against a measured peak
        (BENCHMARKS.md)
        --ranks N       each side on N processes, DDP over Gloo (ours under `launch`,
                        upstream's under torchrun; no bare loop): tokens/s summed over
                        the ranks, step times the slowest rank's
        --micro         the micro-benchmarks instead: optimizer step time on 30M
                        parameters and collator tokens/s vs torch / transformers
        --repeat N      rounds; medians over rounds
        --threads N     intra-op threads on every side (default: the core count,
                        libtorch's default)
  demo [--steps N] [--batch-size N] [--max-seq-length N]
        setup, a release build of the run_classification and plot_log_history
        examples, then the main job into target/demo/: MiniLM-L6 fine-tuned on the
        Rotten Tomatoes reviews, fresh vs rotten (default 120 steps x 16 reviews x
        <= 64 tokens, CPU), accuracy on a seeded 10% held-out split before and
        after, progress bars, TensorBoard logs, the saved model reloaded and
        evaluated again, train/loss_lr.png (loss and learning rate vs step);
        fails unless the accuracy after is at least 0.6 and rose
  demo --clm [--steps N] [--block-size N] [--batch-size N]
        setup, a release build of the run_clm example, then into target/demo/:
        evaluate SmolLM2-135M on the held-out 5% of hamlet.txt, fine-tune it on
        the rest (default 30 steps x 4 rows x 128 tokens, CPU), reload the saved
        checkpoint and evaluate it again, and sample a continuation of a prompt
        before and after; fails unless the evaluation loss decreased
  demo --lora [--steps N] [--block-size N] [--batch-size N] [--length N]
        setup, release builds of run_clm and run_generation, then into
        target/demo-lora/: SmolLM2-135M's evaluation loss on the held-out 5% of
        hamlet.txt and a sampled continuation of a fixed prompt; a LoRA adapter
        (r 16 on every linear layer, TRL's flags) trained on the rest (default 30
        steps x 4 rows x 128 tokens); the loss and the continuation again from the
        saved adapter folder; fails unless the loss decreased and the folder holds
        the adapter alone
  e2e [--short] [--case NAME[,NAME...]]
        setup, a dev build of the run_clm and run_classification examples, then each
        parity case: our binary and an upstream-equivalent Python driver
        (scripts/e2e/, upstream's script steps on the pinned transformers / datasets /
        torch) with the same flags and data into target/e2e/<case>/, on 1 or 2 ranks
        (xtask launch / torchrun, Gloo), OMP_NUM_THREADS=2; prints per case the logged
        steps (loss, rel diff of loss, grad_norm, learning rate) and the final metrics;
        fails when any relative difference exceeds 1e-6. Cases: clm-txt,
        clm-txt-2ranks, clm-parquet, classification-parquet, clm-smollm2, clm-dataset-name,
        trl-sft, trl-dpo, trl-reward (TRL's own scripts)
        --short         the short form `test` runs (clm-txt-2ranks and
                        classification-parquet, fewer steps)
        --case NAME     only these cases
  launch [--nproc-per-node N] [--nnodes M --node-rank R] [--master-port P] [--master-addr A]
         [--max-restarts N] -- COMMAND [ARGS...]
        torchrun's static launch: starts N copies of COMMAND with RANK, LOCAL_RANK,
        WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT (and
        OMP_NUM_THREADS=1 unless set), prefixes their output lines with `[rank N]`; when
        one fails, stops the others (SIGTERM, SIGKILL after --term-timeout) and fails
        naming it. On several nodes, run it on each with the same --nnodes, --master-addr
        (node 0's address) and --master-port, and its own --node-rank
        --nproc-per-node N   processes on this node (default 1)
        --nnodes M           nodes (default 1; a fixed number, no elastic range)
        --node-rank R        this node (0..M-1; default 0)
        --master-addr A      rendezvous address (default 127.0.0.1)
        --master-port P      rendezvous port (default 29500; 0 picks a free port)
        --standalone         127.0.0.1 and a free port
        --term-timeout S     seconds between SIGTERM and SIGKILL (default 30)
        --max-restarts N     restart a failed worker group up to N times (default 0;
                             one node): TORCHELASTIC_RESTART_COUNT counts them, the
                             example scripts resume from the last checkpoint
        --monitor-interval S seconds between looks at the ranks (default 0.1)
  fuzz [--runs N] [--seed N] [--sanitizer address|none] [--dev] [TARGET...]
        setup, then every fuzz target under fuzz/ (one per parser of outside
        input) built with cargo fuzz (nightly; cargo-fuzz is installed into the
        cache once; release with AddressSanitizer unless --dev / --sanitizer none)
        and run for N inputs each (default 5000, fixed seed 1) from the seeds in
        fuzz/corpus/<target>/; fails on a crash, with the reproducer under
        target/fuzz/artifacts/<target>/. `test` runs the same targets without
        libFuzzer (fuzz/tests/it: seeds and seeded mutations, no nightly build).
  codegen [--check]
        setup, then regenerate the generated sources from the pinned Python packages
        (training-args/src/field_table.rs from transformers' HfArgumentParser);
        --check writes nothing and fails when a committed file is stale (`test`
        runs the check before the tests)
  soak [--kills N] [--seed S]
        setup, then the Trainer's crash test at length: a run saving every step killed
        with SIGKILL N times (default 100) at seeded random moments, each relaunch
        resuming from the newest checkpoint, the chain then resumed and compared with an
        uninterrupted run; prints kills, unloadable checkpoints and the most steps a kill
        lost. Not part of `test` (minutes)
  soak --ranks N [--kills K] [--hangs H] [--seed S] [--strategy zero2|ddp|both]
       [--steps STEPS] [--script RUN_CLM]
        setup, build run_clm, then per strategy (default both) an uninterrupted N-rank
        run (tiny GPT-2, a checkpoint every step) and the same run under
        `launch --max-restarts` with K random ranks SIGKILLed (default 50) and H
        SIGSTOPped (noticed through ddp_timeout) at random moments; fails unless every
        fault restarted the group once, every newest checkpoint loads, every loss logged
        after a resume and the final weights equal the uninterrupted run's; prints the
        faults by moment, unloadable checkpoints and lost steps
  gpu-bundle [--torch VERSION] [--out DIR] [--max-mb N]
        the device check for a GPU machine without Rust or network: the torch VERSION
        wheel's libtorch (default 2.11.0, a CUDA build) unpacked into the cache, tch's
        C++ checked against its headers (ops it lacks stubbed with an error), a copy of
        the working tree built in release against it with the `cuda` feature, then DIR
        (default target/gpu-bundle): the stripped run_clm, scripts/gpu/gpu_check.py,
        hamlet.txt, SmolLM2's config and tokenizer, MANIFEST.json; fails over N MiB
        (default 56). There: `python gpu_check.py --out OUT`
  gpu-check [--bundle DIR] [--out DIR] [-- GPU_CHECK_ARGS...]
        the bundle's gpu_check.py here, the CPU dry run of the device check (our binary on
        the bundle's libtorch, a tiny model, the table it prints on the GPU)
  clean-cache [--all] [NAME...]
        list what the project keeps in the cache folder (the virtualenv, assets,
        the tokenized-dataset cache, the fuzz build folder, cargo-fuzz) and the
        `tchtrain-*` folders killed runs left in the temporary folder (`tmp`),
        with sizes; with names (or --all) remove those parts
  help  this text

environment:
  TCHTRAIN_CACHE_DIR  cache folder (default: $XDG_CACHE_HOME/tchtrain or ~/.cache/tchtrain)
  TCHTRAIN_PYTHON     base python (>= 3.10) used to create the virtualenv (default: python3)
  TCHTRAIN_E2E        `0` skips the e2e short form in `test`
  TCHTRAIN_TEST_JOBS  test binaries `test` runs at once (default 2, at most the cores)
  TCHTRAIN_FUZZ_RUNS  inputs the replay test makes per fuzz target in `test` (default
                      5000; 0 replays the committed seeds only); TCHTRAIN_FUZZ_SEED their
                      seed (default 1)
  TCHTRAIN_FUZZ_BUILD_MB  cap on the fuzz build folder (default 16384); over it, the
                      folder is cleared before the next fuzz build
  TCHTRAIN_DATASETS_CACHE_MB  cap on the tokenized-dataset cache (default 4096; least
                      recently used files go first)
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((command, rest)) = args.split_first() else {
        eprint!("{USAGE}");
        return ExitCode::from(2);
    };
    let result = match command.as_str() {
        "setup" => setup::Options::parse(rest).and_then(|o| setup::run(&o).map(|_| ())),
        "test" => test::run(rest),
        "bench" => bench::run(rest),
        "demo" => demo::run(rest),
        "e2e" => e2e::run(rest),
        "launch" => launch::run(rest),
        "fuzz" => fuzz::run(rest),
        "codegen" => codegen::run(rest),
        "clean-cache" => clean_cache::run(rest),
        "soak" => soak::run(rest),
        "gpu-bundle" => gpu_bundle::bundle(rest),
        "gpu-check" => gpu_bundle::check(rest),
        "help" | "--help" | "-h" => {
            print!("{USAGE}");
            Ok(())
        }
        other => Err(format!(
            "unknown command `{other}`; known commands: setup, test, bench, demo, e2e, launch, fuzz, codegen, clean-cache, soak, gpu-bundle, gpu-check, help"
        )),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("xtask error: {message}");
            ExitCode::FAILURE
        }
    }
}
