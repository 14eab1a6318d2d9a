//! Data files as `datasets/data_files.py` (5.2) finds them in a folder or a hub repository:
//! fsspec's glob over the listing ([`resolve_pattern`]), the default split patterns
//! (`data/{split}-00000-of-00001.*`, `train.csv`, `train/...`: [`get_data_patterns`]), the
//! split → files map ([`DataFilesDict`]) and the packaged loader the files' extensions select
//! ([`infer_module_for_data_files`], `load.py`).
//!
//! Paths here are relative to the folder or repository root, `/`-separated, as the hub
//! lists them; matching the pattern `{base}/{pattern}` against `{base}/{path}` as fsspec does
//! is matching `pattern` against `path`.

use std::path::{Path, PathBuf};

use crate::glob::Glob;
use crate::{Error, Result};

/// datasets' `_ALL_ALLOWED_EXTENSIONS` (5.2): the extensions of every packaged loader, `.zip`
/// and Lance's metadata extensions. A file is a data file when one of its suffixes is here.
const ALL_ALLOWED_EXTENSIONS: &str = ".csv .tsv .json .jsonl .ndjson .parquet .geoparquet .gpq .arrow .txt .conll .conllu .tar .xml .hdf5 .h5 .eval .toml .md .lance .tsfile .vortex .fa .fasta .fna .ffn .faa .frn .afa .gb .gbk .genbank .fq .fastq .pdb .ent .cif .mmcif .PDB .ENT \
.blp .bmp .dib .bufr .cur .pcx .dcx .dds .ps .eps .fit .fits .fli .flc .ftc .ftu .gbr .gif .grib .png .apng .jp2 .j2k .jpc .jpf .jpx .j2c .icns .ico .im .iim .tif .tiff .jfif .jpe .jpg .jpeg .mpg .mpeg .msp .pcd .pxr .pbm .pgm .ppm .pnm .psd .bw .rgb .rgba .sgi .ras .tga .icb .vda .vst .webp .wmf .emf .xbm .xpm \
.BLP .BMP .DIB .BUFR .CUR .PCX .DCX .DDS .PS .EPS .FIT .FITS .FLI .FLC .FTC .FTU .GBR .GIF .GRIB .PNG .APNG .JP2 .J2K .JPC .JPF .JPX .J2C .ICNS .ICO .IM .IIM .TIF .TIFF .JFIF .JPE .JPG .JPEG .MPG .MPEG .MSP .PCD .PXR .PBM .PGM .PPM .PNM .PSD .BW .RGB .RGBA .SGI .RAS .TGA .ICB .VDA .VST .WEBP .WMF .EMF .XBM .XPM \
.aiff .au .avr .caf .flac .htk .svx .mat4 .mat5 .mpc2k .ogg .paf .pvf .raw .rf64 .sd2 .sds .ircam .voc .w64 .wav .nist .wavex .wve .xi .mp3 .opus .3gp .3g2 .avi .asf .flv .mp4 .mov .m4v .mkv .webm .f4v .wmv .wma .ogm .mxf .nut \
.AIFF .AU .AVR .CAF .FLAC .HTK .SVX .MAT4 .MAT5 .MPC2K .OGG .PAF .PVF .RAW .RF64 .SD2 .SDS .IRCAM .VOC .W64 .WAV .NIST .WAVEX .WVE .XI .MP3 .OPUS .3GP .3G2 .AVI .ASF .FLV .MP4 .MOV .M4V .MKV .WEBM .F4V .WMV .WMA .OGM .MXF .NUT \
.glb .gltf .ply .stl .GLB .GLTF .PLY .STL .pdf .PDF .nii .NII .zip .idx .manifest .txn";

/// The allowed extensions (`_ALL_ALLOWED_EXTENSIONS`), in upstream's order.
pub fn all_allowed_extensions() -> impl Iterator<Item = &'static str> {
    ALL_ALLOWED_EXTENSIONS.split_whitespace()
}

/// `_ALL_METADATA_FILENAMES`: files that describe other files rather than hold rows.
const METADATA_FILENAMES: &[&str] = &[
    "instruction.md",
    "latest_version_hint.json",
    "metadata.csv",
    "metadata.jsonl",
    "metadata.parquet",
    "task.toml",
];

/// `FILES_TO_IGNORE`: never data files unless a pattern names them.
const FILES_TO_IGNORE: &[&str] = &[
    "README.md",
    "config.json",
    "dataset_info.json",
    "dataset_infos.json",
    "dummy_data.zip",
    "dataset_dict.json",
];

/// `SPLIT_PATTERN_SHARDED`: `data/train-00000-of-00002.parquet` and the like.
pub const SPLIT_PATTERN_SHARDED: &str =
    "data/{split}-[0-9][0-9][0-9][0-9][0-9]-of-[0-9][0-9][0-9][0-9][0-9]*.*";

/// `DEFAULT_SPLITS` with their `SPLIT_KEYWORDS`.
const SPLIT_KEYWORDS: &[(&str, &[&str])] = &[
    ("train", &["train", "training"]),
    ("validation", &["validation", "valid", "dev", "val"]),
    ("test", &["test", "testing", "eval", "evaluation"]),
];

/// Split name → patterns, in order (a Python dict).
pub type SplitPatterns = Vec<(String, Vec<String>)>;

/// The patterns datasets tries, in order, after the sharded one (`ALL_DEFAULT_PATTERNS`,
/// for fsspec >= 2023.12): logs, Harbor tasks, split in a folder name, split in a file name,
/// everything as `train`.
fn all_default_patterns() -> Vec<SplitPatterns> {
    const SEP: &str = "-._ 0-9"; // NON_WORDS_CHARS
    let by_keyword = |bases: &[&str]| -> SplitPatterns {
        SPLIT_KEYWORDS
            .iter()
            .map(|(split, keywords)| {
                let patterns = keywords
                    .iter()
                    .flat_map(|k| {
                        bases
                            .iter()
                            .map(move |b| b.replace("{keyword}", k).replace("{sep}", SEP))
                    })
                    .collect();
                (split.to_string(), patterns)
            })
            .collect()
    };
    let one = |split: &str, patterns: &[&str]| {
        vec![(
            split.to_string(),
            patterns.iter().map(|p| p.to_string()).collect(),
        )]
    };
    vec![
        one("logs", &["**/*.eval"]),
        one("test", &["**/task.toml", "**/instruction.md"]),
        by_keyword(&[
            "**/{keyword}/**",
            "**/{keyword}[{sep}]*/**",
            "**/*[{sep}]{keyword}/**",
            "**/*[{sep}]{keyword}[{sep}]*/**",
        ]),
        by_keyword(&["**/{keyword}[{sep}]*", "**/*[{sep}]{keyword}[{sep}]*"]),
        one("train", &["**"]),
    ]
}

/// Split → local data files, in upstream's order (`DataFilesDict`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DataFilesDict {
    splits: Vec<(String, Vec<PathBuf>)>,
}

impl DataFilesDict {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the files of `split` (replacing them, or appending the split).
    pub fn insert(&mut self, split: impl Into<String>, files: Vec<PathBuf>) {
        let split = split.into();
        match self.splits.iter_mut().find(|(s, _)| *s == split) {
            Some(entry) => entry.1 = files,
            None => self.splits.push((split, files)),
        }
    }

    /// The files of `split`.
    pub fn get(&self, split: &str) -> Option<&[PathBuf]> {
        self.splits
            .iter()
            .find(|(s, _)| s == split)
            .map(|(_, f)| f.as_slice())
    }

    /// The split names, in order.
    pub fn split_names(&self) -> impl Iterator<Item = &str> {
        self.splits.iter().map(|(s, _)| s.as_str())
    }

    /// `(split, files)` pairs, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &[PathBuf])> {
        self.splits.iter().map(|(s, f)| (s.as_str(), f.as_slice()))
    }

    /// The number of splits.
    pub fn len(&self) -> usize {
        self.splits.len()
    }

    /// Whether there is no split.
    pub fn is_empty(&self) -> bool {
        self.splits.is_empty()
    }
}

/// A packaged loader of `datasets` (`_PACKAGED_DATASETS_MODULES`) that tchtrain reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PackagedModule {
    /// `csv` (`.csv`; `.tsv` with `sep="\t"`).
    Csv {
        /// The field separator.
        sep: char,
    },
    /// `json` (`.json`, `.jsonl`, `.ndjson`).
    Json,
    /// `parquet` (`.parquet`, `.geoparquet`, `.gpq`).
    Parquet,
    /// `arrow` (`.arrow`).
    Arrow,
    /// `text` (`.txt`): one row per line.
    Text,
}

impl PackagedModule {
    /// Upstream's module name: `csv`, `json`, `parquet`, `arrow`, `text`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Csv { .. } => "csv",
            Self::Json => "json",
            Self::Parquet => "parquet",
            Self::Arrow => "arrow",
            Self::Text => "text",
        }
    }

    /// `_MODULE_TO_EXTENSIONS[module]` (with `.zip`).
    fn extensions(self) -> &'static [&'static str] {
        match self {
            Self::Csv { .. } => &[".csv", ".tsv", ".zip"],
            Self::Json => &[".json", ".jsonl", ".ndjson", ".zip"],
            Self::Parquet => &[".parquet", ".geoparquet", ".gpq", ".zip"],
            Self::Arrow => &[".arrow", ".zip"],
            Self::Text => &[".txt", ".zip"],
        }
    }
}

/// What `_EXTENSION_TO_MODULE` maps an extension to: a loader read here, another packaged
/// loader (named), or `None` (not a loader's extension; `.zip` is handled apart).
fn module_for_extension(ext: &str) -> Option<std::result::Result<PackagedModule, &'static str>> {
    Some(Ok(match ext {
        ".csv" => PackagedModule::Csv { sep: ',' },
        ".tsv" => PackagedModule::Csv { sep: '\t' },
        ".json" | ".jsonl" | ".ndjson" => PackagedModule::Json,
        ".parquet" | ".geoparquet" | ".gpq" => PackagedModule::Parquet,
        ".arrow" => PackagedModule::Arrow,
        ".txt" => PackagedModule::Text,
        ".conll" | ".conllu" => return Some(Err("conll")),
        ".tar" => return Some(Err("webdataset")),
        ".xml" => return Some(Err("xml")),
        ".hdf5" | ".h5" => return Some(Err("hdf5")),
        ".eval" => return Some(Err("eval")),
        ".toml" | ".md" => return Some(Err("harbor")),
        ".lance" => return Some(Err("lance")),
        ".tsfile" => return Some(Err("tsfile")),
        ".vortex" => return Some(Err("vortex")),
        ".zip" | ".idx" | ".manifest" | ".txn" => return None,
        _ if all_allowed_extensions().any(|e| e == ext) => {
            return Some(Err(
                "a media folder loader (imagefolder, audiofolder, videofolder, pdb, ...)",
            ));
        }
        _ => return None,
    }))
}

/// The file name of a `/`-separated path.
fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// Whether a pattern has glob characters (`glob.has_magic`).
pub fn has_magic(pattern: &str) -> bool {
    pattern.contains(['*', '?', '['])
}

/// The files of `files` that `pattern` selects, as `resolve_pattern` does: fsspec's glob
/// (`*` within a name, `**` across folders, `?`, `[...]`), files only, sorted; without
/// `FILES_TO_IGNORE` (unless named), hidden files and folders (`.x`) and `__x` folders
/// unless the pattern names them; with `allowed_extensions`, only files with one of them
/// among their suffixes. An empty answer is upstream's `FileNotFoundError`.
pub fn resolve_pattern<'a>(
    pattern: &str,
    files: &'a [String],
    allowed_extensions: Option<&[&str]>,
) -> Result<Vec<&'a str>> {
    // `xjoin(base_path, pattern)` normalises a leading `./` away.
    let pattern = pattern.trim_start_matches("./");
    let glob = Glob::new(pattern)?;
    let pattern_base = basename(pattern);
    let mut out: Vec<&str> = files
        .iter()
        .map(String::as_str)
        .filter(|f| glob.matches(f))
        .filter(|f| {
            let name = basename(f);
            !(FILES_TO_IGNORE.contains(&name) && name != pattern_base)
        })
        .filter(|f| !inside_unrequested_special_dir(f, pattern))
        .filter(|f| !unrequested_hidden(f, pattern))
        .filter(|f| {
            allowed_extensions.is_none_or(|allowed| {
                basename(f)
                    .split('.')
                    .skip(1)
                    .any(|suffix| allowed.iter().any(|a| a.strip_prefix('.') == Some(suffix)))
            })
        })
        .collect();
    out.sort_unstable();
    Ok(out)
}

/// `_is_inside_unrequested_special_dir`: as many `__x` parent folders in the path as in the
/// pattern.
fn inside_unrequested_special_dir(path: &str, pattern: &str) -> bool {
    let parents = |p: &str| -> usize {
        let parts: Vec<&str> = p
            .split('/')
            .filter(|s| !s.is_empty() && *s != ".")
            .collect();
        parts[..parts.len().saturating_sub(1)]
            .iter()
            .filter(|s| s.starts_with("__"))
            .count()
    };
    parents(path) != parents(pattern)
}

/// `_is_unrequested_hidden_file_or_is_inside_unrequested_hidden_dir`: as many hidden parts
/// (`.x`, not all dots) in the path as in the pattern.
fn unrequested_hidden(path: &str, pattern: &str) -> bool {
    let hidden = |p: &str| {
        p.split('/')
            .filter(|s| s.starts_with('.') && !s.chars().all(|c| c == '.'))
            .count()
    };
    hidden(path) != hidden(pattern)
}

/// `_get_data_files_patterns` over a listing: the sharded pattern's splits if any file
/// matches it, else the first family of default patterns with a matching split (`None`:
/// upstream's `EmptyDatasetError`).
pub fn get_data_patterns(files: &[String]) -> Result<Option<SplitPatterns>> {
    let sharded = SPLIT_PATTERN_SHARDED.replace("{split}", "*");
    let matched = resolve_pattern(&sharded, files, None)?;
    if !matched.is_empty() {
        let mut splits: Vec<String> = Vec::new();
        for f in matched {
            let split = sharded_split_name(basename(f)).to_string();
            if !splits.contains(&split) {
                splits.push(split);
            }
        }
        if let Some(bad) = splits.iter().find(|s| !is_valid_split_name(s)) {
            return Err(Error::InvalidSplitName { split: bad.clone() });
        }
        let defaults: Vec<&str> = SPLIT_KEYWORDS.iter().map(|(s, _)| *s).collect();
        let mut others: Vec<String> = splits
            .iter()
            .filter(|s| !defaults.contains(&s.as_str()))
            .cloned()
            .collect();
        others.sort();
        let ordered = defaults
            .iter()
            .filter(|d| splits.iter().any(|s| s == *d))
            .map(|d| d.to_string())
            .chain(others);
        return Ok(Some(
            ordered
                .map(|s| {
                    let pattern = SPLIT_PATTERN_SHARDED.replace("{split}", &s);
                    (s, vec![pattern])
                })
                .collect(),
        ));
    }
    for family in all_default_patterns() {
        let mut found = Vec::new();
        for (split, patterns) in family {
            let mut any = false;
            for p in &patterns {
                if !resolve_pattern(p, files, None)?.is_empty() {
                    any = true;
                    break;
                }
            }
            if any {
                found.push((split, patterns));
            }
        }
        if !found.is_empty() {
            return Ok(Some(found));
        }
    }
    Ok(None)
}

/// The `{split}` of a file name matching `{split}-NNNNN-of-NNNNN*.*` (`string_to_dict`:
/// the greedy `(?P<split>.+)` ends at the last `-NNNNN-of-NNNNN`).
fn sharded_split_name(name: &str) -> &str {
    let b = name.as_bytes();
    let shard_at = |i: usize| {
        b.len() >= i + 15
            && b[i] == b'-'
            && b[i + 1..i + 6].iter().all(u8::is_ascii_digit)
            && &b[i + 6..i + 10] == b"-of-"
            && b[i + 10..i + 15].iter().all(u8::is_ascii_digit)
    };
    (1..b.len())
        .rev()
        .find(|&i| name.is_char_boundary(i) && shard_at(i))
        .map_or(name, |i| &name[..i])
}

/// `_split_re`: `^\w+(\.\w+)*$`.
pub fn is_valid_split_name(split: &str) -> bool {
    split
        .split('.')
        .all(|part| !part.is_empty() && part.chars().all(|c| c.is_alphanumeric() || c == '_'))
}

/// `DataFilesDict.from_patterns` over a listing: each split's patterns resolved in order
/// (files matching two patterns appear twice, as upstream), with `allowed_extensions`; a
/// glob matching nothing adds nothing, a plain path matching nothing is an error naming it
/// under `base` (how the caller shows the root).
pub fn resolve_split_patterns(
    patterns: &SplitPatterns,
    files: &[String],
    allowed_extensions: Option<&[&str]>,
    base: &str,
) -> Result<Vec<(String, Vec<String>)>> {
    let mut out = Vec::with_capacity(patterns.len());
    for (split, split_patterns) in patterns {
        let mut resolved = Vec::new();
        for p in split_patterns {
            let found = resolve_pattern(p, files, allowed_extensions)?;
            if found.is_empty() && !has_magic(p) {
                return Err(Error::DataFilesNotFound {
                    detail: format!("Unable to find '{}/{}'", base.trim_end_matches('/'), p),
                });
            }
            resolved.extend(found.into_iter().map(str::to_string));
        }
        out.push((split.clone(), resolved));
    }
    Ok(out)
}

/// `infer_module_for_data_files`: per split, the most common extension among the files'
/// suffixes (ties: `.parquet`, `.lance`, `.vortex`, `.arrow`, `.jsonl`, `.json`, `.csv`, then
/// the larger name; metadata files last) that a loader reads; every split must agree.
/// `path` names the dataset in the errors.
pub fn infer_module_for_data_files(
    data_files: &[(String, Vec<String>)],
    path: &str,
) -> Result<PackagedModule> {
    type Inferred = Option<std::result::Result<PackagedModule, String>>;
    let per_split: Vec<(&str, Inferred)> = data_files
        .iter()
        .map(|(split, files)| (split.as_str(), infer_module_for_files(files)))
        .collect();
    let first = per_split.first().map(|(_, m)| m.clone()).unwrap_or(None);
    if per_split.iter().any(|(_, m)| *m != first) {
        let got: Vec<String> = per_split
            .iter()
            .map(|(s, m)| format!("'{s}': {}", describe(m)))
            .collect();
        return Err(Error::DataFileFormat {
            detail: format!(
                "Couldn't infer the same data file format for all splits. Got {{{}}}",
                got.join(", ")
            ),
        });
    }
    match first {
        Some(Ok(module)) => Ok(module),
        Some(Err(other)) => Err(Error::DataFileFormat {
            detail: format!(
                "the data files of {path} are for datasets' '{other}' loader, which tchtrain does not read (it reads parquet, arrow, csv, json and text files)"
            ),
        }),
        None => Err(Error::DataFilesNotFound {
            detail: format!("No (supported) data files found in {path}"),
        }),
    }
}

fn describe(m: &Option<std::result::Result<PackagedModule, String>>) -> String {
    match m {
        Some(Ok(module)) => format!("'{}'", module.name()),
        Some(Err(other)) => format!("'{other}'"),
        None => "None".into(),
    }
}

/// `infer_module_for_data_files_list` for one split.
fn infer_module_for_files(files: &[String]) -> Option<std::result::Result<PackagedModule, String>> {
    // (extension, is metadata file) → count, in first-seen order.
    let mut counter: Vec<((String, bool), usize)> = Vec::new();
    for f in files {
        let name = basename(f);
        let is_metadata = METADATA_FILENAMES.contains(&name);
        for suffix in name.split('.').skip(1) {
            let key = (format!(".{}", suffix.to_lowercase()), is_metadata);
            match counter.iter_mut().find(|(k, _)| *k == key) {
                Some((_, n)) => *n += 1,
                None => counter.push((key, 1)),
            }
        }
    }
    let rank = |((ext, is_metadata), count): &((String, bool), usize)| {
        let favourites = [
            ".parquet", ".lance", ".vortex", ".arrow", ".jsonl", ".json", ".csv",
        ]
        .map(|f| ext == f);
        (!is_metadata, *count, favourites, ext.clone())
    };
    counter.sort_by_key(|entry| std::cmp::Reverse(rank(entry)));
    for ((ext, _), _) in &counter {
        if let Some(module) = module_for_extension(ext) {
            return Some(module.map_err(str::to_string));
        }
        if ext == ".zip" {
            return Some(Err("zip archives (datasets looks inside them)".into()));
        }
    }
    None
}

/// `DataFilesDict.filter(extensions=_MODULE_TO_EXTENSIONS[module])`: the files whose path
/// matches `.*(ext1|ext2|...)(\..+)?$`.
pub fn filter_extensions(
    data_files: Vec<(String, Vec<String>)>,
    module: PackagedModule,
) -> Vec<(String, Vec<String>)> {
    let keep = |f: &str| {
        module.extensions().iter().any(|ext| {
            f.match_indices(ext).any(|(i, _)| {
                let rest = &f[i + ext.len()..];
                rest.is_empty() || (rest.starts_with('.') && rest.len() > 1)
            })
        })
    };
    data_files
        .into_iter()
        .map(|(split, files)| {
            let files = files.into_iter().filter(|f| keep(f)).collect();
            (split, files)
        })
        .collect()
}

/// The files under a local folder, as `/`-separated paths relative to it (following
/// symlinks to files), sorted.
pub fn list_local_files(root: &Path) -> Result<Vec<String>> {
    fn walk(dir: &Path, prefix: &str, out: &mut Vec<String>) -> std::io::Result<()> {
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let rel = if prefix.is_empty() {
                name
            } else {
                format!("{prefix}/{name}")
            };
            let path = entry.path();
            if entry.file_type()?.is_dir() {
                walk(&path, &rel, out)?;
            } else if path.is_file() {
                out.push(rel);
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(root, "", &mut out).map_err(|e| Error::io("listing", root, e))?;
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    /// The extension list equals the installed datasets' (scripts/reference/hub_datasets.py).
    #[test]
    fn allowed_extensions_are_datasets_own() {
        let path = tchtrain_testing::reference_dir("hub_datasets").join("hub_datasets.json");
        let reference: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let theirs: Vec<&str> = reference["all_allowed_extensions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e.as_str().unwrap())
            .collect();
        assert_eq!(all_allowed_extensions().collect::<Vec<_>>(), theirs);
    }

    #[test]
    fn hidden_special_and_ignored_files_need_naming() {
        let f = files(&[
            ".hidden.csv",
            "__pycache__/a.csv",
            "README.md",
            "a.csv",
            ".dir/b.csv",
        ]);
        assert_eq!(resolve_pattern("**", &f, None).unwrap(), ["a.csv"]);
        assert_eq!(resolve_pattern(".*", &f, None).unwrap(), [".hidden.csv"]);
        assert_eq!(
            resolve_pattern("__*/*", &f, None).unwrap(),
            ["__pycache__/a.csv"]
        );
        assert_eq!(
            resolve_pattern("README.md", &f, None).unwrap(),
            ["README.md"]
        );
        assert_eq!(resolve_pattern(".dir/*", &f, None).unwrap(), [".dir/b.csv"]);
    }

    #[test]
    fn sharded_split_names_and_their_order() {
        assert_eq!(sharded_split_name("train-00000-of-00002.parquet"), "train");
        assert_eq!(
            sharded_split_name("my-split-00001-of-00003.csv"),
            "my-split"
        );
        let f = files(&[
            "data/random-00000-of-00001.csv",
            "data/test-00000-of-00001.csv",
            "data/train-00000-of-00001.csv",
        ]);
        let p = get_data_patterns(&f).unwrap().unwrap();
        let names: Vec<&str> = p.iter().map(|(s, _)| s.as_str()).collect();
        assert_eq!(names, ["train", "test", "random"]);
        let f = files(&["data/bad-name-00000-of-00001.csv"]);
        assert!(matches!(
            get_data_patterns(&f),
            Err(Error::InvalidSplitName { .. })
        ));
    }

    #[test]
    fn module_inference_counts_suffixes_and_breaks_ties_as_upstream() {
        let m = |list: &[&str]| infer_module_for_files(&files(list));
        assert_eq!(
            m(&["a.csv", "b.txt"]),
            Some(Ok(PackagedModule::Csv { sep: ',' }))
        );
        assert_eq!(
            m(&["a.txt", "b.txt", "c.csv"]),
            Some(Ok(PackagedModule::Text))
        );
        assert_eq!(
            m(&["a.csv.bz2"]),
            Some(Ok(PackagedModule::Csv { sep: ',' }))
        );
        assert_eq!(m(&["a.tsv"]), Some(Ok(PackagedModule::Csv { sep: '\t' })));
        assert_eq!(
            m(&["a.parquet", "b.json"]),
            Some(Ok(PackagedModule::Parquet))
        );
        assert_eq!(m(&["a.py"]), None);
        assert!(matches!(m(&["a.png"]), Some(Err(_))));
        let split = |s: &str, f: &[&str]| (s.to_string(), files(f));
        let err = infer_module_for_data_files(
            &[split("train", &["a.csv"]), split("test", &["b.json"])],
            "x",
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("Couldn't infer the same data file format"),
            "{err}"
        );
    }
}
