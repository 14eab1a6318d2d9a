//! What GaLore and APOLLO share: upstream's choice of the projected parameters
//! (`trainer_optimizer._setup_low_rank_optimizer` with `trainer_utils.check_target_module_exists`),
//! the two param groups it builds, and the gradient projectors (galore_torch's
//! `GaLoreProjector`, apollo_torch's seeded random `GradientProjector`) whose matrices live in
//! the parameter's [`ParamState`] so that a resume is exact.
//!
//! State entries of a projected parameter: `ortho_matrix` (`ortho_matrix.0` and
//! `ortho_matrix.1` for `proj_type=full`), and for the random projector `projector_seed`, the
//! int64 seed of its next draw.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};
use tchtrain_training_args::StrOrList;

use crate::optimizer::check_non_negative;
use crate::{Error, GroupSpec, ParamState, Result, ffi};

/// State key of the projection matrix.
const ORTHO: &str = "ortho_matrix";
/// State keys of the two matrices of `proj_type=full`.
const ORTHO_FULL: [&str; 2] = ["ortho_matrix.0", "ortho_matrix.1"];
/// State key of the random projector's next seed.
const SEED: &str = "projector_seed";
/// apollo_torch's `ADV_DEFAULT`: how many draws `next_seed` advances.
const SEED_ADVANCE: i64 = 0xF;

/// Upstream's `proj_type`: which side of the gradient the projection reduces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProjType {
    /// The smaller side (`right` for tall gradients, `left` for wide ones; the default).
    Std,
    /// The larger side.
    ReverseStd,
    /// Always the columns: `grad @ P.T`.
    Right,
    /// Always the rows: `P.T @ grad`.
    Left,
    /// Both sides: `A.T @ grad @ B.T` (GaLore's SVD projector only).
    Full,
}

impl FromStr for ProjType {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "std" => Self::Std,
            "reverse_std" => Self::ReverseStd,
            "right" => Self::Right,
            "left" => Self::Left,
            "full" => Self::Full,
            _ => {
                return Err(Error::InvalidOptimArgValue {
                    key: "proj_type".into(),
                    value: s.into(),
                    expected: "one of std, reverse_std, right, left, full",
                });
            }
        })
    }
}

/// How a projection matrix is made (APOLLO's `proj`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProjectorKind {
    /// The leading singular vectors of the gradient (`torch.linalg.svd`), GaLore's projector.
    Svd,
    /// A Gaussian matrix of variance `1 / rank` from a seeded generator, APOLLO's default.
    Random,
}

/// The projection of one param group: upstream's group keys `rank`, `update_proj_gap`,
/// `scale` and `proj_type`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Projection {
    /// Rank of the projected gradient.
    pub rank: i64,
    /// The projection is recomputed every `update_proj_gap` steps (at steps 0, gap, 2 gap ...).
    pub update_proj_gap: u64,
    /// GaLore multiplies the projected-back update by it; APOLLO its update by its square root.
    pub scale: f64,
    /// Which side is projected.
    pub proj_type: ProjType,
}

impl Projection {
    /// Checks the values (upstream fails later, in the first step, with a Python error).
    pub(crate) fn validate(&self) -> Result<()> {
        if self.rank < 1 {
            return Err(Error::InvalidHyperparameter {
                name: "rank",
                value: self.rank as f64,
                expected: ">= 1",
            });
        }
        if self.update_proj_gap == 0 {
            return Err(Error::InvalidHyperparameter {
                name: "update_proj_gap",
                value: 0.0,
                expected: ">= 1",
            });
        }
        check_non_negative("scale", self.scale)
    }

    /// The side projected for a `rows x cols` gradient.
    fn side(&self, rows: i64, cols: i64) -> Side {
        match self.proj_type {
            ProjType::Std if rows >= cols => Side::Right,
            ProjType::Std => Side::Left,
            ProjType::ReverseStd if rows >= cols => Side::Left,
            ProjType::ReverseStd => Side::Right,
            ProjType::Right => Side::Right,
            ProjType::Left => Side::Left,
            ProjType::Full => Side::Full,
        }
    }

    /// The shape of the projected gradient of a `[rows, cols]` parameter.
    pub(crate) fn low_rank_shape(&self, shape: &[i64], kind: ProjectorKind) -> Vec<i64> {
        let (rows, cols) = (shape[0], shape[1]);
        let r = match kind {
            // `U[:, :rank]` / `Vh[:rank]` of the reduced SVD keep at most min(rows, cols).
            ProjectorKind::Svd => self.rank.min(rows.min(cols)),
            ProjectorKind::Random => self.rank,
        };
        match self.side(rows, cols) {
            Side::Right => vec![rows, r],
            Side::Left => vec![r, cols],
            Side::Full => vec![r, r],
        }
    }
}

/// Which factor of the SVD, or which random matrix, a projector keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Right,
    Left,
    Full,
}

/// The projector of one parameter (its matrices are in the parameter's state).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Projector<'a> {
    /// The group's projection.
    pub projection: &'a Projection,
    /// SVD or random.
    pub kind: ProjectorKind,
    /// The random projector's first seed (apollo_torch's `state["seed"]`).
    pub seed: u64,
}

impl Projector<'_> {
    /// `projector.project(grad, iter)`: recomputes the projection when there is none or
    /// `iter % update_proj_gap == 0`, then projects `grad` (2-D).
    pub(crate) fn project(&self, st: &mut ParamState, grad: &Tensor, iter: u64) -> Result<Tensor> {
        let shape = grad.size();
        let &[rows, cols] = shape.as_slice() else {
            return Err(Error::ShapeMismatch {
                param: 0,
                key: "grad (a projected parameter must be a matrix)".into(),
                expected: vec![-1, -1],
                found: shape,
            });
        };
        let side = self.projection.side(rows, cols);
        let present = match side {
            Side::Full => st.tensors.contains_key(ORTHO_FULL[0]),
            _ => st.tensors.contains_key(ORTHO),
        };
        if !present || iter.is_multiple_of(self.projection.update_proj_gap) {
            self.update(st, grad, side)?;
        }
        let k = rows.min(cols);
        Ok(match side {
            Side::Right => grad.f_matmul(&self.right_operand(&st.tensors[ORTHO], k)?.f_tr()?)?,
            Side::Left => self
                .left_operand(&st.tensors[ORTHO])?
                .f_tr()?
                .f_matmul(grad)?,
            Side::Full => {
                let a = self.left_operand(&st.tensors[ORTHO_FULL[0]])?;
                let b = self.right_operand(&st.tensors[ORTHO_FULL[1]], k)?;
                a.f_tr()?.f_matmul(grad)?.f_matmul(&b.f_tr()?)?
            }
        })
    }

    /// An SVD projector's `U[:, :rank]` (m x r) laid out as GaLore's is, a view of
    /// `torch.linalg.svd`'s column-major `U`: column-major, leading dimension m. The state
    /// keeps it contiguous (as a checkpoint loads it); the matmuls get this layout, because
    /// MKL rounds a product differently by its operands' layout on some CPUs (AMD EPYC:
    /// 6.9e-6 relative after 50 steps of `proj_type=full`). A random projector is contiguous
    /// in apollo_torch too.
    fn left_operand(&self, t: &Tensor) -> Result<Tensor> {
        let [m, r] = t.size()[..] else {
            return Ok(t.shallow_clone());
        };
        if self.kind != ProjectorKind::Svd || t.stride() == [1, m] {
            return Ok(t.shallow_clone());
        }
        let mut out = Tensor::f_empty([r, m], (t.kind(), t.device()))?.f_tr()?;
        out.f_copy_(t)?;
        Ok(out)
    }

    /// An SVD projector's `Vh[:rank]` (r x n) laid out as GaLore's is, a row slice of
    /// `torch.linalg.svd`'s column-major `Vh` (k x n, k = min(m, n) of the gradient): strides
    /// (1, k) (see [`left_operand`](Self::left_operand)).
    fn right_operand(&self, t: &Tensor, k: i64) -> Result<Tensor> {
        let [r, n] = t.size()[..] else {
            return Ok(t.shallow_clone());
        };
        if self.kind != ProjectorKind::Svd || t.stride() == [1, k] || k < r {
            return Ok(t.shallow_clone());
        }
        let mut out = Tensor::f_empty([n, k], (t.kind(), t.device()))?
            .f_tr()?
            .f_narrow(0, 0, r)?;
        out.f_copy_(t)?;
        Ok(out)
    }

    /// `projector.project_back(low_rank_grad)` of GaLore: back to the parameter's shape, times
    /// `scale`. The side follows upstream's test on the low-rank shape.
    pub(crate) fn project_back(&self, st: &ParamState, low: &Tensor) -> Result<Tensor> {
        let size = low.size();
        let (r0, r1) = (size[0], size[1]);
        let ortho = || {
            st.tensors.get(ORTHO).ok_or_else(|| Error::MissingState {
                param: 0,
                key: ORTHO.into(),
            })
        };
        // `low @ Vh[:r]` (the rows m of the gradient are low's) or `U[:, :r] @ low`.
        let right = |b: &Tensor| -> Result<Tensor> {
            let k = r0.min(b.size()[1]);
            Ok(low.f_matmul(&self.right_operand(b, k)?)?)
        };
        let left = |a: &Tensor| -> Result<Tensor> { Ok(self.left_operand(a)?.f_matmul(low)?) };
        let full = match self.projection.proj_type {
            ProjType::Std if r0 >= r1 => right(ortho()?)?,
            ProjType::Std => left(ortho()?)?,
            // "note this is different from std" (upstream)
            ProjType::ReverseStd if r0 <= r1 => left(ortho()?)?,
            ProjType::ReverseStd => right(ortho()?)?,
            ProjType::Right => right(ortho()?)?,
            ProjType::Left => left(ortho()?)?,
            ProjType::Full => {
                let get = |k: &str| {
                    st.tensors.get(k).ok_or_else(|| Error::MissingState {
                        param: 0,
                        key: k.into(),
                    })
                };
                let (a, b) = (get(ORTHO_FULL[0])?, get(ORTHO_FULL[1])?);
                let k = a.size()[0].min(b.size()[1]);
                self.left_operand(a)?
                    .f_matmul(low)?
                    .f_matmul(&self.right_operand(b, k)?)?
            }
        };
        Ok(full.f_mul_scalar(self.projection.scale)?)
    }

    /// `get_orthogonal_matrix` (and, for the random projector, `next_seed`).
    fn update(&self, st: &mut ParamState, grad: &Tensor, side: Side) -> Result<()> {
        let kind = grad.kind();
        let back = |t: Tensor| -> Result<Tensor> {
            // Contiguous, as a resumed state is: the matmuls then see the same layout.
            let t = if kind == Kind::Float {
                t
            } else {
                t.f_to_kind(kind)?
            };
            Ok(t.f_contiguous()?)
        };
        let rank = self.projection.rank;
        match self.kind {
            ProjectorKind::Svd => {
                let matrix = if kind == Kind::Float {
                    grad.shallow_clone()
                } else {
                    grad.f_to_kind(Kind::Float)?
                };
                // torch.svd is torch.linalg.svd(A, full_matrices=not some) with V = Vh.mH.
                let (u, _s, v) = matrix.f_svd(true, true)?;
                let vh = v.f_tr()?;
                let u_r = || u.f_narrow(1, 0, rank.min(u.size()[1]));
                let vh_r = || vh.f_narrow(0, 0, rank.min(vh.size()[0]));
                match side {
                    Side::Right => {
                        st.tensors.insert(ORTHO.into(), back(vh_r()?)?);
                    }
                    Side::Left => {
                        st.tensors.insert(ORTHO.into(), back(u_r()?)?);
                    }
                    Side::Full => {
                        st.tensors.insert(ORTHO_FULL[0].into(), back(u_r()?)?);
                        st.tensors.insert(ORTHO_FULL[1].into(), back(vh_r()?)?);
                    }
                }
            }
            ProjectorKind::Random => {
                let seed = match st.tensors.get(SEED) {
                    Some(t) => t.f_int64_value(&[])? as u64,
                    None => self.seed,
                };
                let size = grad.size();
                let shape = match side {
                    Side::Left => [size[0], rank],
                    Side::Right => [rank, size[1]],
                    Side::Full => {
                        return Err(Error::ConflictingOptions(
                            "APOLLO's random projection does not implement proj_type=full",
                        ));
                    }
                };
                let p = ffi::randn_seeded(seed, &shape)?
                    .f_to_device(grad.device())?
                    .f_div_scalar((rank as f64).sqrt())?;
                st.tensors.insert(ORTHO.into(), back(p)?);
                let next = next_seed(seed)?;
                st.tensors.insert(SEED.into(), Tensor::from(next as i64));
            }
        }
        Ok(())
    }

    /// Checks the projector entries of a loaded state against a `shape` parameter.
    pub(crate) fn validate(&self, index: usize, shape: &[i64], st: &ParamState) -> Result<()> {
        if shape.len() != 2 {
            return Ok(());
        }
        let (rows, cols) = (shape[0], shape[1]);
        let r = self.projection.low_rank_shape(shape, self.kind);
        let expect = |key: &str, expected: Vec<i64>| -> Result<()> {
            match st.tensors.get(key) {
                Some(t) if t.size() != expected => Err(Error::ShapeMismatch {
                    param: index,
                    key: key.into(),
                    expected,
                    found: t.size(),
                }),
                _ => Ok(()),
            }
        };
        match self.projection.side(rows, cols) {
            Side::Right => expect(ORTHO, vec![r[1], cols]),
            Side::Left => expect(ORTHO, vec![rows, r[0]]),
            Side::Full => {
                expect(ORTHO_FULL[0], vec![rows, r[0]])?;
                expect(ORTHO_FULL[1], vec![r[1], cols])
            }
        }
    }
}

/// apollo_torch's `next_seed(seed)`: the last of 15 `randint(0, 2**63 - 1)` draws of a
/// generator seeded with `seed`.
fn next_seed(seed: u64) -> Result<u64> {
    let draws = ffi::randint_seeded(seed, 0, i64::MAX, SEED_ADVANCE)?;
    Ok(draws.f_int64_value(&[SEED_ADVANCE - 1])? as u64)
}

/// `optim_target_modules` as upstream prints it (a Python `str` or `list`).
struct TargetsRepr<'a>(&'a StrOrList);

impl fmt::Display for TargetsRepr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            StrOrList::One(s) => f.write_str(s),
            StrOrList::List(l) => {
                let items: Vec<String> = l.iter().map(|s| format!("'{s}'")).collect();
                write!(f, "[{}]", items.join(", "))
            }
        }
    }
}

/// `re.fullmatch(pattern, key)`.
fn fullmatch(optim: &str, pattern: &str, key: &str) -> Result<bool> {
    let re = regex::Regex::new(&format!("^(?:{pattern})$")).map_err(|e| {
        Error::InvalidOptimizerSetup {
            name: optim.into(),
            detail: format!("`optim_target_modules` entry `{pattern}` is not a valid regex: {e}"),
        }
    })?;
    Ok(re.is_match(key))
}

/// Upstream's `check_target_module_exists(optim_target_modules, key)`: a string is a regex
/// matched against the whole name; a list matches a name it holds, a name containing one of
/// its entries, or a name one of its entries (as a regex) matches whole.
pub fn check_target_module_exists(optim: &str, targets: &StrOrList, key: &str) -> Result<bool> {
    match targets {
        StrOrList::One(pattern) => fullmatch(optim, pattern, key),
        StrOrList::List(list) => {
            if list.iter().any(|t| t == key || key.contains(t.as_str())) {
                return Ok(true);
            }
            for t in list {
                if fullmatch(optim, t, key)? {
                    return Ok(true);
                }
            }
            Ok(false)
        }
    }
}

/// The parameter names upstream's `_setup_low_rank_optimizer` projects: `{module}.weight` for
/// every `nn.Linear` module (`linear_modules`, registration order) that `optim_target_modules`
/// selects, or all of them for `"all-linear"` (`"all_linear"`). Non-linear modules are never
/// targets (upstream warns and skips them).
///
/// Errors as upstream: no `optim_target_modules`, or no linear module selected.
///
/// ```
/// use tchtrain_optim::low_rank_target_names;
/// use tchtrain_training_args::StrOrList;
///
/// let linears = ["q_proj".to_string(), "lm_head".to_string()];
/// let targets = StrOrList::List(vec!["proj".into()]);
/// assert_eq!(low_rank_target_names("galore_adamw", Some(&targets), &linears)?, ["q_proj.weight"]);
/// # Ok::<(), tchtrain_optim::Error>(())
/// ```
pub fn low_rank_target_names(
    optim: &str,
    optim_target_modules: Option<&StrOrList>,
    linear_modules: &[String],
) -> Result<Vec<String>> {
    let Some(targets) = optim_target_modules else {
        return Err(Error::InvalidOptimizerSetup {
            name: optim.into(),
            detail: format!("You need to define `optim_target_modules` to use {optim} optimizers"),
        });
    };
    let all_linear = matches!(targets, StrOrList::One(s) if s.replace('_', "-") == "all-linear");
    let mut names = Vec::new();
    for module in linear_modules {
        if all_linear || check_target_module_exists(optim, targets, module)? {
            names.push(format!("{module}.weight"));
        }
    }
    if names.is_empty() {
        return Err(Error::InvalidOptimizerSetup {
            name: optim.into(),
            detail: format!(
                "No target modules found for {optim} ({}).",
                TargetsRepr(targets)
            ),
        });
    }
    Ok(names)
}

/// Upstream's two groups `[{"params": non_target}, {"params": target, **optim_kwargs}]` from
/// the parameters of `groups` (their lr / weight decay are dropped, as upstream's handler
/// replaces the Trainer's decay groups). The targets come in `target_names` order; a name
/// absent from the groups (a tied weight) is skipped, as upstream's `named_parameters()` filter.
pub(crate) fn low_rank_groups(groups: Vec<GroupSpec>, target_names: &[String]) -> [GroupSpec; 2] {
    let mut rest = Vec::new();
    let mut targets: Vec<Option<(String, Tensor)>> = target_names.iter().map(|_| None).collect();
    for (name, t) in groups.into_iter().flat_map(|g| g.params) {
        match target_names.iter().position(|n| *n == name) {
            Some(i) => targets[i] = Some((name, t)),
            None => rest.push((name, t)),
        }
    }
    [
        GroupSpec::new(rest),
        GroupSpec::new(targets.into_iter().flatten().collect()),
    ]
}

/// Reads `key` as an integer (Python `int(value)`), if present.
pub(crate) fn int_arg(
    args: &std::collections::BTreeMap<String, String>,
    key: &str,
) -> Result<Option<i64>> {
    args.get(key)
        .map(|v| {
            let cleaned: String = v.trim().chars().filter(|&c| c != '_').collect();
            cleaned
                .parse::<i64>()
                .map_err(|_| Error::InvalidOptimArgValue {
                    key: key.into(),
                    value: v.clone(),
                    expected: "an integer",
                })
        })
        .transpose()
}
