//! The random forest: trained with hyper-parameters chosen by k-fold cross-validation,
//! seeded and reproducible, saved to a versioned, checksummed model file.

use std::path::Path;
use std::sync::Mutex;

use mmk_core::fasthash::FastMap;
use mmk_partitioner::{CoRunner, JobProfile, PartitionShape, PerfModel};
use serde::{Deserialize, Serialize};
use smartcore::ensemble::random_forest_regressor::{
    RandomForestRegressor, RandomForestRegressorParameters,
};
use smartcore::linalg::basic::matrix::DenseMatrix;
use thiserror::Error;

use crate::dataset::Dataset;
use crate::features::{FEATURE_NAMES, Features};
use mmk_core::rng::Rng;

pub type Forest = RandomForestRegressor<f64, f64, DenseMatrix<f64>, Vec<f64>>;

/// The first bytes of a model file.
pub const MAGIC: &[u8; 8] = b"MMKMODEL";
/// The model file format this build reads and writes. A file of another version is
/// refused: retrain it with `mmk-lab predictor train`.
pub const FORMAT_VERSION: u32 = 1;

#[derive(Debug, Error)]
pub enum ModelError {
    #[error("cannot read or write {path}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not an mmk model file")]
    NotAModel { path: String },
    #[error(
        "{path} is a model file of format version {found}; this mmk reads version {FORMAT_VERSION}: retrain it with `mmk-lab predictor train`"
    )]
    Version { path: String, found: u32 },
    #[error("{path} is corrupted: {why}")]
    Corrupt { path: String, why: String },
    #[error("{path} was trained on other features ({found}); retrain it with this mmk")]
    Features { path: String, found: String },
    #[error("training failed: {0}")]
    Train(String),
    #[error("cross-validation needs at least {need} rows; the dataset has {have}")]
    TooFewRows { need: usize, have: usize },
}

/// The forest's hyper-parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForestParams {
    pub n_trees: u16,
    /// None: grow until leaves are pure or hold `min_samples_leaf` rows.
    pub max_depth: Option<u16>,
    pub min_samples_leaf: u16,
    /// Features tried at each split.
    pub features_per_split: u16,
}

impl std::fmt::Display for ForestParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} trees, depth {}, leaf >= {}, {} features per split",
            self.n_trees,
            self.max_depth
                .map_or_else(|| "unlimited".to_owned(), |d| d.to_string()),
            self.min_samples_leaf,
            self.features_per_split
        )
    }
}

/// How to train.
#[derive(Debug, Clone)]
pub struct TrainOptions {
    pub seed: u64,
    pub folds: usize,
    /// The candidates cross-validation chooses from.
    pub grid: Vec<ForestParams>,
    /// Trees of the final forest (cross-validation may use fewer, to be quick).
    pub final_trees: u16,
}

impl TrainOptions {
    /// The standard search: 4 candidates, 3 folds, a final forest of 100 trees.
    pub fn standard(seed: u64) -> TrainOptions {
        let p = FEATURE_NAMES.len() as u16;
        let mut grid = Vec::new();
        for min_samples_leaf in [1, 3] {
            for features_per_split in [p / 3, p] {
                grid.push(ForestParams {
                    n_trees: 40,
                    max_depth: None,
                    min_samples_leaf,
                    features_per_split,
                });
            }
        }
        TrainOptions {
            seed,
            folds: 3,
            grid,
            final_trees: 100,
        }
    }
}

/// One candidate's cross-validated relative error.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CvScore {
    pub params: ForestParams,
    pub mre_pct: f64,
}

/// A trained predictor.
pub struct Predictor {
    pub params: ForestParams,
    pub cv: Vec<CvScore>,
    /// Rows it was trained on.
    pub rows: u64,
    pub seed: u64,
    forest: Forest,
    /// Answers to questions asked before: a planning pass asks the same ones for every
    /// candidate layout. Keyed by the encoded features' bits; cleared when full.
    memo: Mutex<FastMap<MemoKey, f64>>,
}

/// The encoded features' bits.
type MemoKey = [u64; FEATURE_NAMES.len()];

/// Entries the memo holds before it starts over.
const MEMO_MAX: usize = 1 << 16;

impl std::fmt::Debug for Predictor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Predictor")
            .field("params", &self.params)
            .field("rows", &self.rows)
            .field("seed", &self.seed)
            .finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
struct ModelFile {
    features: Vec<String>,
    params: ForestParams,
    cv: Vec<CvScore>,
    rows: u64,
    seed: u64,
    forest: Forest,
}

/// What `to_bytes` writes: the fields of [`ModelFile`], borrowed (the same encoding).
#[derive(Serialize)]
struct ModelFileRef<'a> {
    features: &'a [&'a str],
    params: ForestParams,
    cv: &'a [CvScore],
    rows: u64,
    seed: u64,
    forest: &'a Forest,
}

pub(crate) fn matrix(x: &[Vec<f64>]) -> Result<DenseMatrix<f64>, ModelError> {
    DenseMatrix::from_2d_vec(&x.to_vec()).map_err(|e| ModelError::Train(e.to_string()))
}

/// Fits one forest.
pub(crate) fn fit(
    x: &[Vec<f64>],
    y: &[f64],
    p: ForestParams,
    seed: u64,
) -> Result<Forest, ModelError> {
    let mut params = RandomForestRegressorParameters::default()
        .with_n_trees(usize::from(p.n_trees))
        .with_min_samples_leaf(usize::from(p.min_samples_leaf))
        .with_m(usize::from(p.features_per_split).clamp(1, FEATURE_NAMES.len()))
        .with_seed(seed);
    if let Some(d) = p.max_depth {
        params = params.with_max_depth(d);
    }
    RandomForestRegressor::fit(&matrix(x)?, &y.to_vec(), params)
        .map_err(|e| ModelError::Train(e.to_string()))
}

/// Mean relative error, percent.
pub(crate) fn mre_pct(pred: &[f64], actual: &[f64]) -> f64 {
    let n = actual.len().max(1) as f64;
    100.0
        * pred
            .iter()
            .zip(actual)
            .map(|(p, a)| (p - a).abs() / a)
            .sum::<f64>()
        / n
}

impl Predictor {
    /// Chooses the hyper-parameters by k-fold cross-validation (lowest mean relative
    /// error), then fits the final forest on every row.
    pub fn train(data: &Dataset, opts: &TrainOptions) -> Result<Predictor, ModelError> {
        let folds = opts.folds.max(2);
        let need = folds * 2;
        if data.rows.len() < need {
            return Err(ModelError::TooFewRows {
                need,
                have: data.rows.len(),
            });
        }
        let (x, y) = data.xy();
        let mut order: Vec<usize> = (0..x.len()).collect();
        Rng::new(opts.seed).shuffle(&mut order);
        let mut cv = Vec::new();
        for &params in &opts.grid {
            let mut errors = Vec::new();
            for k in 0..folds {
                let (mut tx, mut ty, mut vx, mut vy) = (vec![], vec![], vec![], vec![]);
                for (i, &r) in order.iter().enumerate() {
                    if i % folds == k {
                        vx.push(x[r].clone());
                        vy.push(y[r]);
                    } else {
                        tx.push(x[r].clone());
                        ty.push(y[r]);
                    }
                }
                let f = fit(&tx, &ty, params, opts.seed)?;
                let pred = f
                    .predict(&matrix(&vx)?)
                    .map_err(|e| ModelError::Train(e.to_string()))?;
                errors.push(mre_pct(&pred, &vy));
            }
            cv.push(CvScore {
                params,
                mre_pct: errors.iter().sum::<f64>() / errors.len() as f64,
            });
        }
        let best = cv
            .iter()
            .min_by(|a, b| a.mre_pct.total_cmp(&b.mre_pct))
            .map(|s| s.params)
            .ok_or_else(|| ModelError::Train("no candidate hyper-parameters".into()))?;
        let params = ForestParams {
            n_trees: opts.final_trees.max(1),
            ..best
        };
        let forest = fit(&x, &y, params, opts.seed)?;
        Ok(Predictor {
            params,
            cv,
            rows: x.len() as u64,
            seed: opts.seed,
            forest,
            memo: Mutex::default(),
        })
    }

    /// A copy, through the model file's bytes (smartcore's forest has no `Clone`).
    pub fn try_clone(&self) -> Result<Predictor, ModelError> {
        Predictor::from_bytes(&self.to_bytes()?, "(copy)")
    }

    /// Predictions for encoded rows.
    pub fn predict(&self, x: &[Vec<f64>]) -> Result<Vec<f64>, ModelError> {
        self.forest
            .predict(&matrix(x)?)
            .map_err(|e| ModelError::Train(e.to_string()))
    }

    /// One prediction; `None` only if the forest refuses the row (it does not for rows of
    /// [`FEATURE_NAMES`]' width).
    pub fn predict_one(&self, f: &Features) -> Option<f64> {
        let row = f.to_vec();
        let mut key: MemoKey = [0; FEATURE_NAMES.len()];
        for (k, v) in key.iter_mut().zip(&row) {
            *k = v.to_bits();
        }
        if let Some(v) = self
            .memo
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
        {
            return Some(*v);
        }
        let m = DenseMatrix::from_2d_vec(&vec![row]).ok()?;
        let v = self.forest.predict(&m).ok()?.first().copied()?;
        let mut memo = self.memo.lock().unwrap_or_else(|p| p.into_inner());
        if memo.len() >= MEMO_MAX {
            memo.clear();
        }
        memo.insert(key, v);
        Some(v)
    }

    /// The cross-validated relative error of the chosen parameters, in percent (the
    /// search runs with fewer trees than the final forest; the rest of the parameters
    /// match).
    pub fn cv_error_pct(&self) -> Option<f64> {
        let p = self.params;
        self.cv
            .iter()
            .filter(|c| {
                c.params.max_depth == p.max_depth
                    && c.params.min_samples_leaf == p.min_samples_leaf
                    && c.params.features_per_split == p.features_per_split
            })
            .map(|c| c.mre_pct)
            .reduce(f64::min)
    }

    /// Each feature's importance (mean impurity decrease, normalized to sum to 1), most
    /// important first.
    pub fn importances(&self) -> Result<Vec<(&'static str, f64)>, ModelError> {
        let imp = self
            .forest
            .compute_feature_importances()
            .map_err(|e| ModelError::Train(e.to_string()))?;
        let mut v: Vec<(&'static str, f64)> = FEATURE_NAMES.iter().copied().zip(imp).collect();
        v.sort_by(|a, b| b.1.total_cmp(&a.1));
        Ok(v)
    }

    /// The model file's bytes: magic, format version, payload length and FNV-1a checksum,
    /// then the payload (postcard).
    pub fn to_bytes(&self) -> Result<Vec<u8>, ModelError> {
        let file = ModelFileRef {
            features: &FEATURE_NAMES,
            params: self.params,
            cv: &self.cv,
            rows: self.rows,
            seed: self.seed,
            forest: &self.forest,
        };
        let payload = postcard::to_allocvec(&file).map_err(|e| ModelError::Train(e.to_string()))?;
        let mut out = Vec::with_capacity(payload.len() + 28);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        out.extend_from_slice(&fnv1a(&payload).to_le_bytes());
        out.extend_from_slice(&payload);
        Ok(out)
    }

    /// Reads a model file's bytes; `path` names it in errors.
    pub fn from_bytes(bytes: &[u8], path: &str) -> Result<Predictor, ModelError> {
        let path = path.to_owned();
        if bytes.len() < 28 || &bytes[..8] != MAGIC {
            return Err(ModelError::NotAModel { path });
        }
        let word = |r: std::ops::Range<usize>| {
            bytes[r]
                .iter()
                .rev()
                .fold(0u64, |a, b| a << 8 | u64::from(*b))
        };
        let version = word(8..12) as u32;
        if version != FORMAT_VERSION {
            return Err(ModelError::Version {
                path,
                found: version,
            });
        }
        let len = word(12..20);
        let sum = word(20..28);
        let payload = &bytes[28..];
        if payload.len() as u64 != len {
            return Err(ModelError::Corrupt {
                path,
                why: format!(
                    "{} bytes of model where the header says {len}",
                    payload.len()
                ),
            });
        }
        if fnv1a(payload) != sum {
            return Err(ModelError::Corrupt {
                path,
                why: "the checksum does not match".into(),
            });
        }
        let file: ModelFile = postcard::from_bytes(payload).map_err(|e| ModelError::Corrupt {
            path: path.clone(),
            why: e.to_string(),
        })?;
        if file.features != FEATURE_NAMES {
            return Err(ModelError::Features {
                path,
                found: file.features.join(","),
            });
        }
        check_trees(payload).map_err(|why| ModelError::Corrupt {
            path: path.clone(),
            why,
        })?;
        Ok(Predictor {
            params: file.params,
            cv: file.cv,
            rows: file.rows,
            seed: file.seed,
            forest: file.forest,
            memo: Mutex::default(),
        })
    }

    /// Writes the model file (through a temporary file and a rename: a crash leaves the
    /// old file or the new one, never half of one).
    pub fn save(&self, path: &Path) -> Result<(), ModelError> {
        let io = |source| ModelError::Io {
            path: path.display().to_string(),
            source,
        };
        let bytes = self.to_bytes()?;
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, bytes).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    }

    pub fn load(path: &Path) -> Result<Predictor, ModelError> {
        let bytes = std::fs::read(path).map_err(|source| ModelError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Predictor::from_bytes(&bytes, &path.display().to_string())
    }
}

/// Checks the trees of a model file's payload before anything walks them: smartcore follows
/// a tree's child indices and split features without bounds checks, so a file whose
/// checksum matches but whose trees are malformed (made by hand, or by another build)
/// would panic or loop for ever at the first prediction. Each split must name a feature of
/// [`FEATURE_NAMES`] and two children after it in its tree.
fn check_trees(payload: &[u8]) -> Result<(), String> {
    let file: ShapeFile = postcard::from_bytes(payload).map_err(|e| e.to_string())?;
    let forest = file.forest.forest_regressor.ok_or("it holds no forest")?;
    let features = FEATURE_NAMES.len();
    if forest.num_features != Some(features) {
        return Err(format!(
            "its forest has {:?} features, not {features}",
            forest.num_features
        ));
    }
    let trees = forest.trees.unwrap_or_default();
    if trees.is_empty() {
        return Err("its forest has no trees".into());
    }
    for (t, tree) in trees.iter().enumerate() {
        let len = tree.nodes.len();
        if len == 0 {
            return Err(format!("tree {t} has no nodes"));
        }
        for (i, node) in tree.nodes.iter().enumerate() {
            let child = |c: Option<usize>| c.is_some_and(|c| c > i && c < len);
            let split = node.true_child.is_some();
            if split && !(child(node.true_child) && child(node.false_child)) {
                return Err(format!("tree {t}, node {i}: a child out of place"));
            }
            if (split || node.split_score.is_some()) && node.split_feature >= features {
                return Err(format!(
                    "tree {t}, node {i}: feature {} of {features}",
                    node.split_feature
                ));
            }
        }
    }
    Ok(())
}

/// A model file as smartcore 0.7 lays its forest out (`RandomForestRegressor`,
/// `BaseForest`, `BaseTree`, `Node`), read only by [`check_trees`]. Should smartcore's
/// layout change, valid files stop loading, which the tests see.
#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
#[allow(dead_code)]
struct ShapeFile {
    features: Vec<String>,
    params: ForestParams,
    cv: Vec<CvScore>,
    rows: u64,
    seed: u64,
    forest: ShapeRegressor,
}

#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
struct ShapeRegressor {
    forest_regressor: Option<ShapeForest>,
}

#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
#[allow(dead_code)]
struct ShapeForest {
    trees: Option<Vec<ShapeTree>>,
    num_features: Option<usize>,
    samples: Option<Vec<Vec<bool>>>,
}

/// `BaseTree`; its last fields are `PhantomData`, which take no bytes.
#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
#[allow(dead_code)]
struct ShapeTree {
    nodes: Vec<ShapeNode>,
    parameters: Option<ShapeTreeParams>,
    depth: u16,
    root_mass: f64,
}

#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
#[allow(dead_code)]
struct ShapeTreeParams {
    max_depth: Option<u16>,
    min_samples_leaf: usize,
    min_samples_split: usize,
    seed: Option<u64>,
    splitter: ShapeSplitter,
}

#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
enum ShapeSplitter {
    Random,
    Best,
}

#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
#[allow(dead_code)]
struct ShapeNode {
    output: f64,
    split_feature: usize,
    split_value: Option<f64>,
    split_score: Option<f64>,
    true_child: Option<usize>,
    false_child: Option<usize>,
}

fn fnv1a(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325, |h, x| {
        (h ^ u64::from(*x)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

impl PerfModel for Predictor {
    fn estimate(
        &self,
        job: &JobProfile,
        partition: &PartitionShape,
        mps_share: u8,
        co_runners: &[CoRunner],
    ) -> f64 {
        self.predict_one(&Features::of(job, partition, mps_share, co_runners))
            .unwrap_or(1e-3)
            .clamp(1e-3, 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::groundtruth;

    fn quick() -> TrainOptions {
        TrainOptions {
            seed: 3,
            folds: 2,
            grid: vec![
                ForestParams {
                    n_trees: 5,
                    max_depth: Some(8),
                    min_samples_leaf: 1,
                    features_per_split: 8,
                },
                ForestParams {
                    n_trees: 5,
                    max_depth: Some(8),
                    min_samples_leaf: 4,
                    features_per_split: 24,
                },
            ],
            final_trees: 8,
        }
    }

    #[test]
    fn training_is_reproducible_and_a_saved_model_predicts_the_same() {
        let data = groundtruth::generate(240, 1);
        let a = Predictor::train(&data, &quick()).unwrap();
        let b = Predictor::train(&data, &quick()).unwrap();
        assert_eq!(a.cv, b.cv);
        assert_eq!(a.cv.len(), 2);
        let (x, _) = data.xy();
        let pa = a.predict(&x).unwrap();
        assert_eq!(pa, b.predict(&x).unwrap());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.mmk");
        a.save(&path).unwrap();
        let c = Predictor::load(&path).unwrap();
        assert_eq!(c.params, a.params);
        assert_eq!(c.predict(&x).unwrap(), pa);
        let imp = c.importances().unwrap();
        assert_eq!(imp.len(), FEATURE_NAMES.len());
        assert!((imp.iter().map(|(_, v)| v).sum::<f64>() - 1.0).abs() < 1e-9);
    }

    #[test]
    fn malformed_trees_are_refused_before_a_prediction_walks_them() {
        let p = Predictor::train(&groundtruth::generate(60, 2), &quick()).unwrap();
        let good = p.to_bytes().unwrap();
        let with = |f: &dyn Fn(&mut ShapeFile)| {
            let mut shape: ShapeFile = postcard::from_bytes(&good[28..]).unwrap();
            f(&mut shape);
            let payload = postcard::to_allocvec(&shape).unwrap();
            let mut out = good[..12].to_vec();
            out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
            out.extend_from_slice(&fnv1a(&payload).to_le_bytes());
            out.extend_from_slice(&payload);
            Predictor::from_bytes(&out, "m.mmk")
                .err()
                .map(|e| e.to_string())
        };
        fn root(s: &mut ShapeFile) -> &mut ShapeNode {
            let forest = s.forest.forest_regressor.as_mut().unwrap();
            &mut forest.trees.as_mut().unwrap()[0].nodes[0]
        }
        assert_eq!(with(&|_| {}), None, "the same layout as smartcore's");
        // smartcore would index its matrix out of bounds (found by predictor/tests/fuzz.rs).
        assert_eq!(
            with(&|s| root(s).split_feature = 640).as_deref(),
            Some("m.mmk is corrupted: tree 0, node 0: feature 640 of 24")
        );
        // A prediction would go round for ever.
        assert_eq!(
            with(&|s| root(s).false_child = Some(0)).as_deref(),
            Some("m.mmk is corrupted: tree 0, node 0: a child out of place")
        );
        assert_eq!(
            with(&|s| root(s).true_child = Some(1 << 40)).as_deref(),
            Some("m.mmk is corrupted: tree 0, node 0: a child out of place")
        );
        let no_trees = |s: &mut ShapeFile| {
            s.forest.forest_regressor.as_mut().unwrap().trees = None;
        };
        assert_eq!(
            with(&no_trees).as_deref(),
            Some("m.mmk is corrupted: its forest has no trees")
        );
    }

    #[test]
    fn bad_model_files_are_refused_with_the_reason() {
        let data = groundtruth::generate(60, 2);
        let p = Predictor::train(&data, &quick()).unwrap();
        let good = p.to_bytes().unwrap();
        let err = |b: &[u8]| Predictor::from_bytes(b, "m.mmk").unwrap_err().to_string();
        assert_eq!(err(b"hello"), "m.mmk is not an mmk model file");
        let mut v2 = good.clone();
        v2[8] = 2;
        assert!(
            err(&v2).contains("format version 2; this mmk reads version 1"),
            "{}",
            err(&v2)
        );
        let mut flipped = good.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 0xff;
        assert_eq!(
            err(&flipped),
            "m.mmk is corrupted: the checksum does not match"
        );
        assert!(err(&good[..good.len() - 10]).contains("is corrupted"));
        assert!(Predictor::from_bytes(&good, "m.mmk").is_ok());
        let e = Predictor::train(&groundtruth::generate(3, 1), &quick()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "cross-validation needs at least 4 rows; the dataset has 3"
        );
    }
}
