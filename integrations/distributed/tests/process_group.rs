//! Real multi-process runs on 127.0.0.1: each test re-launches this test binary as N
//! ranks (torchrun's environment variables), the ranks run c10d collectives through
//! `ProcessGroup`, and the parent checks every rank exited cleanly. Fault cases: a rank
//! that dies, a rank that never joins; both end in a typed error within the timeout.

use std::net::TcpListener;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use tch::{Device, Kind, Tensor};
use tchtrain_distributed::{
    Backend, BucketReduction, DistributedDataParallel, DistributedEnv, Error, ProcessGroup,
    ReduceOp, ShardReducer,
};

const ROLE: &str = "TCHTRAIN_TEST_ROLE";

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Spawns `ranks` copies of this binary running only `test`, as ranks of `world` on `port`.
fn launch(test: &str, ranks: &[i32], world: i32, port: u16) -> Vec<Child> {
    ranks
        .iter()
        .map(|&rank| {
            Command::new(std::env::current_exe().unwrap())
                // `--include-ignored`: the GPU tests are ignored unless asked for.
                .args(["--exact", test, "--nocapture", "--test-threads", "1"])
                .arg("--include-ignored")
                .envs(DistributedEnv::vars_for(rank, world, "127.0.0.1", port))
                .env(ROLE, "rank")
                // The ranks' own `test result` lines would be counted by the summary:
                // stdout is dropped, stderr (panic messages) stays visible.
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect()
}

/// Waits for every child (killing all of them past `limit`) and asserts success.
fn wait_all(mut children: Vec<Child>, limit: Duration) {
    let start = Instant::now();
    let mut codes = vec![None; children.len()];
    while codes.iter().any(Option::is_none) {
        for (i, c) in children.iter_mut().enumerate() {
            if codes[i].is_none() {
                codes[i] = c.try_wait().unwrap().map(|s| s.success());
            }
        }
        if start.elapsed() > limit {
            for c in &mut children {
                let _ = c.kill();
            }
            panic!("ranks did not finish within {limit:?}: {codes:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        codes.iter().all(|c| *c == Some(true)),
        "a rank failed: {codes:?}"
    );
}

fn is_rank() -> bool {
    std::env::var(ROLE).is_ok()
}

fn env() -> DistributedEnv {
    DistributedEnv::from_env().unwrap().expect("WORLD_SIZE > 1")
}

fn values(t: &Tensor) -> Vec<f64> {
    Vec::<f64>::try_from(t.to_kind(Kind::Double).flatten(0, -1)).unwrap()
}

/// Every collective on `pg`'s device, with values checked for any world size `W`
/// (`S = 0 + 1 + .. + (W - 1)`, `T = 1 + .. + W`).
fn check_collectives(pg: &mut ProcessGroup) {
    let dev = pg.device();
    let w = pg.world_size();
    let (wf, r) = (f64::from(w), f64::from(pg.rank()));
    let (sum_r, sum_r1) = (wf * (wf - 1.0) / 2.0, wf * (wf + 1.0) / 2.0);
    let on = |v: &[f64]| Tensor::from_slice(v).to_device(dev);

    let mut t = on(&[r, 10.0 * r, 1.0]);
    pg.all_reduce(&mut t, ReduceOp::Sum).unwrap();
    assert_eq!(values(&t), vec![sum_r, 10.0 * sum_r, wf]);
    let mut t = on(&[r]);
    pg.all_reduce(&mut t, ReduceOp::Avg).unwrap();
    assert_eq!(values(&t), vec![sum_r / wf]);
    let mut t = on(&[r, -r]);
    pg.all_reduce(&mut t, ReduceOp::Max).unwrap();
    assert_eq!(values(&t), vec![wf - 1.0, 0.0]);

    let root = w - 1;
    let mut t = if pg.rank() == root {
        Tensor::from_slice(&[7.0f32, 8.0]).to_device(dev)
    } else {
        Tensor::zeros([2], (Kind::Float, dev))
    };
    pg.broadcast(&mut t, root).unwrap();
    assert_eq!(values(&t), vec![7.0, 8.0]);

    let input = on(&[r, r + 0.5]);
    let mut out = Tensor::zeros([2 * i64::from(w)], (Kind::Double, dev));
    pg.all_gather_into(&mut out, &input).unwrap();
    let gathered: Vec<f64> = (0..2 * w).map(|i| f64::from(i) / 2.0).collect();
    assert_eq!(values(&out), gathered);

    // Every rank contributes [0, 1, .., 2W - 1] * (r + 1); rank k receives chunk k times T.
    let input = Tensor::arange(2 * i64::from(w), (Kind::Float, dev)) * (r + 1.0);
    let expected: Vec<f64> = (0..2).map(|i| sum_r1 * (2.0 * r + f64::from(i))).collect();
    let mut out = Tensor::zeros([2], (Kind::Float, dev));
    pg.reduce_scatter(&mut out, &input, ReduceOp::Sum).unwrap();
    assert_eq!(values(&out), expected);
    let mut out2 = Tensor::zeros([2], (Kind::Float, dev));
    pg.reduce_scatter_via_all_reduce(&mut out2, &input, ReduceOp::Sum)
        .unwrap();
    assert_eq!(values(&out2), expected);

    assert_eq!(
        pg.all_reduce_scalar(r + 1.0, ReduceOp::Sum).unwrap(),
        sum_r1
    );
    // A wrong-sized output is a typed error, not an engine crash.
    let mut bad = Tensor::zeros([2 * i64::from(w) - 1], (Kind::Double, dev));
    assert!(matches!(
        pg.all_gather_into(&mut bad, &on(&[r, r])),
        Err(Error::InvalidTensor { .. })
    ));
    pg.barrier().unwrap();
}

#[test]
fn collectives_on_three_ranks() {
    if !is_rank() {
        return wait_all(
            launch("collectives_on_three_ranks", &[0, 1, 2], 3, free_port()),
            Duration::from_secs(120),
        );
    }
    let mut pg = ProcessGroup::new_gloo(&env(), Duration::from_secs(60)).unwrap();
    assert_eq!(pg.world_size(), 3);
    assert_eq!((pg.backend(), pg.device()), (Backend::Gloo, Device::Cpu));
    check_collectives(&mut pg);
}

/// The collectives over NCCL, one rank per visible GPU (at most 4): in this process when
/// there is one GPU (a world of 1), else launched as ranks.
#[test]
#[ignore = "needs a CUDA device and the `cuda` feature: cargo xtask test --gpu"]
fn nccl_collectives_on_every_gpu() {
    let gpus = i32::try_from(tch::Cuda::device_count().min(4)).unwrap();
    let env = if is_rank() {
        env()
    } else if gpus >= 2 {
        let ranks: Vec<i32> = (0..gpus).collect();
        return wait_all(
            launch("nccl_collectives_on_every_gpu", &ranks, gpus, free_port()),
            Duration::from_secs(180),
        );
    } else {
        DistributedEnv {
            rank: 0,
            world_size: 1,
            local_rank: 0,
            local_world_size: 1,
            master_addr: "127.0.0.1".into(),
            master_port: free_port(),
        }
    };
    let mut pg = ProcessGroup::new_nccl(&env, Duration::from_secs(60)).unwrap();
    assert_eq!(pg.backend(), Backend::Nccl);
    assert_eq!(
        pg.device(),
        Device::Cuda(usize::try_from(env.local_rank).unwrap())
    );
    check_collectives(&mut pg);
}

/// NCCL asked for where it cannot run is a typed error naming the fix: without the `cuda`
/// feature, the feature; with it, the device `LOCAL_RANK` names when this process does not
/// see it (here one past the last visible device, so it holds on any machine).
#[test]
fn nccl_without_its_device_is_a_typed_error() {
    let count = tch::Cuda::device_count();
    let env = DistributedEnv {
        rank: 0,
        world_size: 1,
        local_rank: i32::try_from(count).unwrap(),
        local_world_size: 1,
        master_addr: "127.0.0.1".into(),
        master_port: free_port(),
    };
    let err = ProcessGroup::new(Backend::Nccl, &env, Duration::from_secs(5)).unwrap_err();
    let Error::BackendUnavailable { backend, detail } = &err else {
        panic!("expected BackendUnavailable, got {err}");
    };
    assert_eq!(backend, "nccl");
    if Backend::Nccl.is_built() {
        assert!(
            detail.contains(&format!("sees {count} CUDA device(s)")),
            "{err}"
        );
    } else {
        assert!(detail.contains("`cuda` feature"), "{err}");
    }
    assert!(err.to_string().contains("ddp_backend='gloo'"), "{err}");
}

#[test]
fn backend_names_and_defaults() {
    assert_eq!(Backend::parse("gloo").unwrap(), Backend::Gloo);
    assert_eq!(Backend::parse("nccl").unwrap(), Backend::Nccl);
    assert_eq!(Backend::Nccl.as_str(), "nccl");
    let err = Backend::parse("mpi").unwrap_err();
    assert!(
        matches!(&err, Error::BackendUnavailable { backend, .. } if backend == "mpi"),
        "{err}"
    );
    assert_eq!(Backend::default_for(Device::Cpu), Backend::Gloo);
    // A CUDA device gets NCCL exactly when this build has it.
    let cuda = Backend::default_for(Device::Cuda(0));
    assert_eq!(cuda == Backend::Nccl, Backend::Nccl.is_built());
    assert_eq!(Backend::Nccl.is_built(), cfg!(feature = "cuda"));
}

#[test]
fn a_dead_peer_is_an_error_within_the_timeout() {
    if !is_rank() {
        return wait_all(
            launch(
                "a_dead_peer_is_an_error_within_the_timeout",
                &[0, 1],
                2,
                free_port(),
            ),
            Duration::from_secs(120),
        );
    }
    let env = env();
    let mut pg = ProcessGroup::new_gloo(&env, Duration::from_secs(5)).unwrap();
    pg.barrier().unwrap();
    if pg.rank() == 1 {
        // Dies without a word, as a crashed rank would.
        std::process::exit(0);
    }
    std::thread::sleep(Duration::from_millis(300));
    let start = Instant::now();
    let mut t = Tensor::from_slice(&[1.0f32]);
    let err = pg.all_reduce(&mut t, ReduceOp::Sum).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Collective {
                op: "all_reduce",
                rank: 0,
                ..
            }
        ),
        "{err}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "took {:?}",
        start.elapsed()
    );
}

#[test]
fn a_rank_that_never_joins_is_a_rendezvous_error() {
    if !is_rank() {
        // World of 2, only rank 0 launched.
        return wait_all(
            launch(
                "a_rank_that_never_joins_is_a_rendezvous_error",
                &[0],
                2,
                free_port(),
            ),
            Duration::from_secs(120),
        );
    }
    let start = Instant::now();
    let err = ProcessGroup::new_gloo(&env(), Duration::from_secs(3)).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Rendezvous {
                rank: 0,
                world_size: 2,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("127.0.0.1:"), "{err}");
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "took {:?}",
        start.elapsed()
    );
}

/// Two ranks, each with half of a batch, after DDP's gradient average hold exactly the
/// gradient of the mean loss over the whole batch (computed here in one process too), and
/// parameters that started different are equal after the initial broadcast. Through torch's
/// reducer: one bucket in the first iteration, then rebuilt (a tiny cap: one bucket per
/// parameter); a backward with `sync` false keeps this rank's own gradients (`no_sync`);
/// a backward the reducer was not prepared for is reduced after it.
#[test]
fn ddp_average_equals_full_batch_gradient() {
    if !is_rank() {
        return wait_all(
            launch(
                "ddp_average_equals_full_batch_gradient",
                &[0, 1],
                2,
                free_port(),
            ),
            Duration::from_secs(120),
        );
    }
    let env = env();
    let mut pg = ProcessGroup::new_gloo(&env, Duration::from_secs(60)).unwrap();
    let r = pg.rank();
    // Rank-dependent init: the broadcast must make them equal to rank 0's.
    let init = |seed: i64| {
        Tensor::arange(12, (Kind::Float, tch::Device::Cpu)).reshape([3, 4]) / 10.0 + seed as f64
    };
    let w = init(i64::from(r)).set_requires_grad(true);
    let b = Tensor::zeros([3], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
    let ddp = DistributedDataParallel::new(
        &mut pg,
        vec![w.shallow_clone(), b.shallow_clone()],
        Some(1e-6),
        false,
    )
    .unwrap();
    // DDP without find_unused_parameters: everything in one bucket until the rebuild.
    assert_eq!(ddp.num_buckets(), 1);
    assert_eq!(values(&w), values(&init(0)));

    let x = Tensor::arange(16, (Kind::Float, tch::Device::Cpu)).reshape([4, 4]) / 7.0 - 1.0;
    let loss_of = |rows: &Tensor| {
        (rows.matmul(&w.tr()) + &b)
            .tanh()
            .square()
            .mean(Kind::Float)
    };
    let mine = x.narrow(0, i64::from(r) * 2, 2);
    let zero_grads = || {
        for p in [&w, &b] {
            let _ = p.grad().zero_();
        }
    };

    // Reference: the same parameters, the whole batch, one process; and this rank's half.
    let w2 = init(0).set_requires_grad(true);
    let b2 = Tensor::zeros([3], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
    let reference = |rows: &Tensor| {
        for p in [&w2, &b2] {
            let mut g = p.grad();
            if g.defined() {
                let _ = g.zero_();
            }
        }
        (rows.matmul(&w2.tr()) + &b2)
            .tanh()
            .square()
            .mean(Kind::Float)
            .backward();
        [values(&w2.grad()), values(&b2.grad())].concat()
    };
    let full = reference(&x);
    let local = reference(&mine);
    let grads = || [values(&w.grad()), values(&b.grad())].concat();
    let close = |got: &[f64], want: &[f64], what: &str| {
        for (a, e) in got.iter().zip(want) {
            assert!((a - e).abs() <= 1e-6, "{what}: {a} vs {e}");
        }
    };

    for iteration in 0..2 {
        let loss = loss_of(&mine);
        ddp.prepare_for_backward(&[&loss], true).unwrap();
        loss.backward();
        ddp.finish_backward().unwrap();
        close(&grads(), &full, &format!("reducer, iteration {iteration}"));
        // The first synchronised backward recorded the order; the next one rebuilt.
        assert_eq!(ddp.num_buckets(), if iteration == 0 { 1 } else { 2 });
        zero_grads();
    }

    let loss = loss_of(&mine);
    ddp.prepare_for_backward(&[&loss], false).unwrap();
    loss.backward();
    close(&grads(), &local, "no_sync");
    zero_grads();

    loss_of(&mine).backward();
    ddp.all_reduce_gradients(&mut pg).unwrap();
    close(&grads(), &full, "after the backward");
}

/// DDP's `find_unused_parameters`: rank 0's loss uses `a` and `b`, rank 1's only `a`, and no
/// rank uses `c`. Without it, the backward leaves the bucket unreduced on both ranks and
/// the check after it is an error naming the setting; with it, `b`'s gradient is rank 0's
/// halved on both ranks (rank 1 counts zeros), and `c` keeps none. The same through the
/// reduction after a backward the reducer was not prepared for.
#[test]
fn unused_parameters_count_as_zeros_with_find_unused_parameters() {
    if !is_rank() {
        return wait_all(
            launch(
                "unused_parameters_count_as_zeros_with_find_unused_parameters",
                &[0, 1],
                2,
                free_port(),
            ),
            Duration::from_secs(120),
        );
    }
    let env = env();
    let mut pg = ProcessGroup::new_gloo(&env, Duration::from_secs(60)).unwrap();
    let r = pg.rank();
    let param =
        |v: f64| (Tensor::ones([2], (Kind::Float, Device::Cpu)) * v).set_requires_grad(true);
    let (a, b, c) = (param(1.0), param(2.0), param(3.0));
    let step = |ddp: &DistributedDataParallel, pg: &mut ProcessGroup, prepared: bool| {
        for p in [&a, &b] {
            let mut g = p.grad();
            if g.defined() {
                let _ = g.zero_();
            }
        }
        let loss = if r == 0 {
            (&a * &b).sum(Kind::Float)
        } else {
            (&a * 3.0).sum(Kind::Float)
        };
        if !prepared {
            loss.backward();
            return ddp.all_reduce_gradients(pg);
        }
        ddp.prepare_for_backward(&[&loss], true)?;
        loss.backward();
        ddp.finish_backward()
    };
    let params = || vec![a.shallow_clone(), b.shallow_clone(), c.shallow_clone()];
    let strict = DistributedDataParallel::new(&mut pg, params(), None, false).unwrap();
    let err = step(&strict, &mut pg, true).unwrap_err().to_string();
    assert!(err.contains("find_unused_parameters"), "{err}");
    // A fresh reducer: the first one is left in the middle of its iteration.
    drop(strict);
    let strict = DistributedDataParallel::new(&mut pg, params(), None, false).unwrap();
    if r == 1 {
        // Rank 1 never reaches the collective: only rank 0 goes on with `find_unused`.
        let err = step(&strict, &mut pg, false).unwrap_err().to_string();
        assert!(err.contains("find_unused_parameters"), "{err}");
    }
    drop(strict);
    let ddp = DistributedDataParallel::new(&mut pg, params(), None, true).unwrap();
    for prepared in [true, false] {
        step(&ddp, &mut pg, prepared).unwrap();
        // d(a*b)/db = a = 1 on rank 0, nothing on rank 1: the average is 0.5.
        assert_eq!(values(&b.grad()), [0.5, 0.5], "prepared: {prepared}");
        // d/da: b = 2 on rank 0, 3 on rank 1.
        assert_eq!(values(&a.grad()), [2.5, 2.5], "prepared: {prepared}");
        assert!(
            !c.grad().defined(),
            "a parameter no rank used keeps no gradient"
        );
    }
}

/// The sharded engine's overlapped reduction on 2 ranks: four float32 parameters in
/// buckets of at most 48 bytes (reverse order: `d` and `c` together, then `b`, then `a`),
/// reduced in bfloat16 with a pre-division by 2, a sum and a post-division by 3. Rank 1's
/// loss leaves `b` unused, so on rank 1 the buckets from `b` on start only at `finish`,
/// while rank 0 starts all three during the backward; the collectives still pair up.
/// Every gradient equals the same arithmetic done by hand on the whole flattened
/// gradient (bit for bit: each element is one sum of two), `b`'s on rank 1 included (made
/// from zeros there); a backward that is not armed reduces nothing; a reduction dtype
/// narrower than writing back allows is refused.
#[test]
fn shard_reducer_reduces_buckets_during_the_backward() {
    if !is_rank() {
        return wait_all(
            launch(
                "shard_reducer_reduces_buckets_during_the_backward",
                &[0, 1],
                2,
                free_port(),
            ),
            Duration::from_secs(120),
        );
    }
    let env = env();
    let mut pg = ProcessGroup::new_gloo(&env, Duration::from_secs(60)).unwrap();
    let r = pg.rank();
    let param = |n: i64, v: f64| {
        (Tensor::arange(n, (Kind::Float, Device::Cpu)) / 7.0 + v).set_requires_grad(true)
    };
    let (a, b, c, d) = (param(8, 0.1), param(6, 0.2), param(5, 0.3), param(3, 0.4));
    let params = [
        a.shallow_clone(),
        b.shallow_clone(),
        c.shallow_clone(),
        d.shallow_clone(),
    ];
    let reduction = BucketReduction {
        pre_divide: Some(2.0),
        post_divide: Some(3.0),
        op: ReduceOp::Sum,
        kind: Some(Kind::BFloat16),
    };
    let reducer = ShardReducer::new(&mut pg, &params, 48, reduction).unwrap();
    assert_eq!(reducer.num_buckets(), 3);
    let scale = 1.0 + f64::from(r) / 3.0;
    let loss_of = || {
        let x = (a.square() * scale).sum(Kind::Float)
            + (c.sin() * &d.sum(Kind::Float)).sum(Kind::Float);
        if r == 0 {
            x + (b.exp() * 0.7).sum(Kind::Float)
        } else {
            x
        }
    };
    let grads = || -> Vec<Tensor> {
        params
            .iter()
            .map(|p| {
                let g = p.grad();
                if g.defined() {
                    g.flatten(0, -1)
                } else {
                    Tensor::zeros([p.numel() as i64], (Kind::Float, Device::Cpu))
                }
            })
            .collect()
    };
    let clear = || {
        for p in &params {
            let mut g = p.grad();
            if g.defined() {
                let _ = g.zero_();
            }
        }
    };

    // By hand: this rank's gradients, flattened, through the same arithmetic.
    loss_of().backward();
    let local = Tensor::cat(&grads(), 0);
    let mut expected = local.to_kind(Kind::BFloat16) / 2.0;
    pg.all_reduce(&mut expected, ReduceOp::Sum).unwrap();
    let expected = (expected / 3.0).to_kind(Kind::Float);
    clear();

    reducer.arm().unwrap();
    loss_of().backward();
    let started = reducer.finish().unwrap();
    // Rank 0 starts every bucket inside the backward; rank 1 only the one before `b`.
    assert_eq!(
        started,
        if r == 0 { 3 } else { 1 },
        "buckets started during the backward"
    );
    let got = Tensor::cat(&grads(), 0);
    assert_eq!(values(&got), values(&expected), "reduced gradients");
    assert!(b.grad().defined(), "b's gradient is made on rank {r}");
    clear();

    // Not armed: a plain local backward.
    loss_of().backward();
    let plain = Tensor::cat(&grads(), 0);
    let want = local.shallow_clone();
    if r == 1 {
        // `b` (elements 8..14) keeps the zeros it was cleared to.
        let _ = want.narrow(0, 8, 6).zero_();
    }
    assert_eq!(
        values(&plain),
        values(&want),
        "an unarmed backward reduces nothing"
    );

    let narrowing = BucketReduction {
        kind: Some(Kind::Float),
        ..reduction
    };
    let halves = [Tensor::zeros([4], (Kind::BFloat16, Device::Cpu)).set_requires_grad(true)];
    let err = ShardReducer::new(&mut pg, &halves, 48, narrowing)
        .unwrap_err()
        .to_string();
    assert!(err.contains("rounded"), "{err}");
}
