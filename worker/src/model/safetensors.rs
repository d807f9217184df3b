//! HF checkpoints: a directory with config.json, model.safetensors (or shards listed in
//! model.safetensors.index.json), tokenizer.json and tokenizer_config.json.
//!
//! Shards are memory-mapped; tensors are converted to f32 on demand.
//!
//! Model files are untrusted input: the `safetensors` crate bounds the header (100 MB, inside
//! the file) and checks that every tensor's byte range lies in the file, follows the previous
//! one and matches its shape × dtype size (with overflow checks); on top of that a tensor with a
//! zero dimension is refused, naming it.

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};

use super::config::HfConfig;
use super::source::{missing_tensor, HostWeight, WeightSource};
use crate::error::{Result, WorkerError};

const CONFIG_FILE: &str = "config.json";
const SINGLE_FILE: &str = "model.safetensors";
const INDEX_FILE: &str = "model.safetensors.index.json";
const TOKENIZER_FILE: &str = "tokenizer.json";
const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";

struct Shard {
    path: PathBuf,
    mmap: Mmap,
}

struct TensorEntry {
    shard: usize,
    tensor: ShardTensor,
}

/// A tensor's entry in a safetensors file's header, checked against the file.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardTensor {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    /// Absolute byte range in the file.
    pub start: usize,
    pub end: usize,
}

/// Reads and checks the header of the safetensors file `bytes` (named `path` in errors): its
/// tensors, sorted by name.
pub fn shard_tensors(path: &Path, bytes: &[u8]) -> Result<Vec<ShardTensor>> {
    let (header_len, metadata) = SafeTensors::read_metadata(bytes)
        .map_err(|e| WorkerError::ModelFile(format!("{}: invalid safetensors: {e}", path.display())))?;
    let data_start = 8 + header_len;
    let mut out = Vec::new();
    for (name, info) in metadata.tensors() {
        if info.shape.contains(&0) {
            return Err(WorkerError::ModelFile(format!(
                "{}: tensor {name}: a dimension is 0 (shape {:?})",
                path.display(),
                info.shape
            )));
        }
        // read_metadata checked the offsets against the file: no overflow, inside the file.
        out.push(ShardTensor {
            name,
            dtype: info.dtype,
            shape: info.shape.clone(),
            start: data_start + info.data_offsets.0,
            end: data_start + info.data_offsets.1,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// A tensor of the file `bytes` converted to f32 (an error for non-float dtypes).
pub fn shard_tensor_f32(path: &Path, bytes: &[u8], t: &ShardTensor) -> Result<HostWeight> {
    let name = &t.name;
    let raw = bytes
        .get(t.start..t.end)
        .ok_or_else(|| WorkerError::ModelFile(format!("{}: tensor {name} lies outside the file", path.display())))?;
    let data = to_f32(t.dtype, raw).ok_or_else(|| {
        WorkerError::Unsupported(format!(
            "{}: tensor {name}: dtype {} (supported: F32, F16, BF16, F64)",
            path.display(),
            t.dtype
        ))
    })?;
    HostWeight::new(data, t.shape.clone())
        .map_err(|e| WorkerError::ModelFile(format!("{}: tensor {name}: {e}", path.display())))
}

/// An HF-layout checkpoint directory.
pub struct HfCheckpoint {
    dir: PathBuf,
    config: serde_json::Value,
    shards: Vec<Shard>,
    tensors: HashMap<String, TensorEntry>,
}

impl std::fmt::Debug for HfCheckpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HfCheckpoint")
            .field("dir", &self.dir)
            .field("shards", &self.shards.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl HfCheckpoint {
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        let config_path = dir.join(CONFIG_FILE);
        let config_text = std::fs::read_to_string(&config_path)
            .map_err(|e| WorkerError::ModelFile(format!("{}: cannot read: {e}", config_path.display())))?;
        let config: serde_json::Value = serde_json::from_str(&config_text)
            .map_err(|e| WorkerError::ModelFile(format!("{}: invalid JSON: {e}", config_path.display())))?;
        if !config.is_object() {
            return Err(WorkerError::ModelFile(format!("{}: expected a JSON object", config_path.display())));
        }

        let (shard_files, indexed) = shard_files(&dir)?;
        let mut shards = Vec::with_capacity(shard_files.len());
        let mut tensors = HashMap::new();
        for path in shard_files {
            let shard_idx = shards.len();
            let shard = map_shard(path)?;
            for tensor in shard_tensors(&shard.path, &shard.mmap)? {
                let name = tensor.name.clone();
                if tensors.insert(name.clone(), TensorEntry { shard: shard_idx, tensor }).is_some() {
                    return Err(WorkerError::ModelFile(format!(
                        "{}: tensor {name} is in more than one shard",
                        dir.display()
                    )));
                }
            }
            shards.push(shard);
        }
        // Every tensor the index promises must be in the shard it names.
        for (name, file) in &indexed {
            match tensors.get(name) {
                Some(e) if shards[e.shard].path.file_name() == Some(std::ffi::OsStr::new(file)) => {}
                Some(_) => {
                    return Err(WorkerError::ModelFile(format!(
                        "{}: tensor {name} is not in {file}, the shard {INDEX_FILE} names",
                        dir.display()
                    )))
                }
                None => {
                    return Err(WorkerError::ModelFile(format!(
                        "{}: tensor {name} listed in {INDEX_FILE} is missing from {file}",
                        dir.display()
                    )))
                }
            }
        }
        Ok(Self { dir, config, shards, tensors })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// config.json as parsed.
    pub fn config(&self) -> &serde_json::Value {
        &self.config
    }

    /// `model_type` from config.json (e.g. "qwen3", "qwen3_moe", "llama").
    pub fn model_type(&self) -> Result<&str> {
        HfConfig(&self.config).model_type()
    }

    /// `architectures` from config.json (e.g. ["Qwen3ForCausalLM"]); empty when absent.
    pub fn architectures(&self) -> Vec<String> {
        self.config
            .get("architectures")
            .and_then(|v| v.as_array())
            .map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect())
            .unwrap_or_default()
    }

    /// tokenizer.json in the checkpoint directory, when present.
    pub fn tokenizer_json_path(&self) -> Option<PathBuf> {
        Some(self.dir.join(TOKENIZER_FILE)).filter(|p| p.is_file())
    }

    /// tokenizer_config.json in the checkpoint directory, when present.
    pub fn tokenizer_config_path(&self) -> Option<PathBuf> {
        Some(self.dir.join(TOKENIZER_CONFIG_FILE)).filter(|p| p.is_file())
    }

    /// The stored dtype and shape of a tensor, without converting it.
    pub fn tensor_meta(&self, name: &str) -> Option<(Dtype, &[usize])> {
        self.tensors.get(name).map(|e| (e.tensor.dtype, e.tensor.shape.as_slice()))
    }
}

impl WeightSource for HfCheckpoint {
    fn get(&self, name: &str) -> Result<HostWeight> {
        let entry = self.tensors.get(name).ok_or_else(|| missing_tensor(&self.dir, name))?;
        let shard = &self.shards[entry.shard];
        shard_tensor_f32(&shard.path, &shard.mmap, &entry.tensor)
    }

    fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.tensors.keys().cloned().collect();
        names.sort();
        names
    }
}

fn to_f32(dtype: Dtype, bytes: &[u8]) -> Option<Vec<f32>> {
    Some(match dtype {
        Dtype::F32 => bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
        Dtype::F16 => bytes.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
        Dtype::BF16 => bytes.chunks_exact(2).map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
        Dtype::F64 => bytes
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as f32)
            .collect(),
        _ => return None,
    })
}

/// (tensor name, shard file name) pairs from model.safetensors.index.json.
type IndexedTensors = Vec<(String, String)>;

/// The safetensors files of a checkpoint (the single file, or the shards named by the index),
/// and the index's tensor → shard file map (empty for a single file).
fn shard_files(dir: &Path) -> Result<(Vec<PathBuf>, IndexedTensors)> {
    let single = dir.join(SINGLE_FILE);
    if single.is_file() {
        return Ok((vec![single], Vec::new()));
    }
    let index_path = dir.join(INDEX_FILE);
    if !index_path.is_file() {
        return Err(WorkerError::ModelFile(format!("{}: neither {SINGLE_FILE} nor {INDEX_FILE} found", dir.display())));
    }
    let text = std::fs::read_to_string(&index_path)
        .map_err(|e| WorkerError::ModelFile(format!("{}: cannot read: {e}", index_path.display())))?;
    let index: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| WorkerError::ModelFile(format!("{}: invalid JSON: {e}", index_path.display())))?;
    let weight_map = index
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| WorkerError::ModelFile(format!("{}: no weight_map object", index_path.display())))?;
    let mut files = BTreeSet::new();
    let mut indexed = Vec::with_capacity(weight_map.len());
    for (tensor, file) in weight_map {
        let file = file.as_str().ok_or_else(|| {
            WorkerError::ModelFile(format!("{}: weight_map[{tensor}] is not a file name", index_path.display()))
        })?;
        // Shard names are plain file names in the same directory.
        if file.contains('/') || file.contains('\\') || file == ".." {
            return Err(WorkerError::ModelFile(format!(
                "{}: shard name {file:?} is not a plain file name",
                index_path.display()
            )));
        }
        files.insert(file.to_string());
        indexed.push((tensor.clone(), file.to_string()));
    }
    if files.is_empty() {
        return Err(WorkerError::ModelFile(format!("{}: empty weight_map", index_path.display())));
    }
    Ok((files.into_iter().map(|f| dir.join(f)).collect(), indexed))
}

fn map_shard(path: PathBuf) -> Result<Shard> {
    let file =
        File::open(&path).map_err(|e| WorkerError::ModelFile(format!("{}: cannot open: {e}", path.display())))?;
    // SAFETY: read-only map of a model file that is not expected to change while loaded.
    let mmap = unsafe { Mmap::map(&file) }
        .map_err(|e| WorkerError::ModelFile(format!("{}: cannot map: {e}", path.display())))?;
    Ok(Shard { path, mmap })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_assets::TempDir;
    use safetensors::tensor::TensorView;

    fn write_shard(path: &Path, tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)]) {
        let views: Vec<(String, TensorView<'_>)> = tensors
            .iter()
            .map(|(n, dt, shape, data)| (n.to_string(), TensorView::new(*dt, shape.clone(), data).unwrap()))
            .collect();
        safetensors::serialize_to_file(views, None, path).unwrap();
    }

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn write_config(dir: &Path) {
        std::fs::write(
            dir.join(CONFIG_FILE),
            r#"{"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "hidden_size": 8,
                "rms_norm_eps": 1e-6, "tie_word_embeddings": true, "rope_scaling": null}"#,
        )
        .unwrap();
    }

    #[test]
    fn single_file_with_every_float_dtype() {
        let dir = TempDir::new("st");
        write_config(dir.path());
        let bf: Vec<u8> = [1.5f32, -2.0].iter().flat_map(|&x| bf16::from_f32(x).to_le_bytes()).collect();
        let hf: Vec<u8> = [0.25f32, 3.0, -1.0].iter().flat_map(|&x| f16::from_f32(x).to_le_bytes()).collect();
        write_shard(
            &dir.path().join(SINGLE_FILE),
            &[
                ("a", Dtype::F32, vec![2, 2], f32_bytes(&[1.0, 2.0, 3.0, 4.0])),
                ("b", Dtype::BF16, vec![2], bf),
                ("c", Dtype::F16, vec![3, 1], hf),
                ("ids", Dtype::I64, vec![1], vec![0; 8]),
            ],
        );
        let ck = HfCheckpoint::open(dir.path()).unwrap();
        assert_eq!(ck.model_type().unwrap(), "qwen3");
        let c = HfConfig(ck.config());
        assert_eq!(c.usize("hidden_size").unwrap(), 8);
        assert_eq!(c.opt_f64("rms_norm_eps").unwrap(), Some(1e-6));
        assert_eq!(c.opt_bool("tie_word_embeddings").unwrap(), Some(true));
        assert_eq!(c.opt_f64("rope_scaling").unwrap(), None);
        assert!(c.opt_usize("model_type").is_err());
        assert!(c.usize("num_hidden_layers").unwrap_err().to_string().contains("num_hidden_layers"));
        assert_eq!(ck.names(), vec!["a", "b", "c", "ids"]);
        assert_eq!(ck.get("a").unwrap(), HostWeight { data: vec![1.0, 2.0, 3.0, 4.0], shape: vec![2, 2] });
        assert_eq!(ck.get("b").unwrap().data, vec![1.5, -2.0]);
        assert_eq!(ck.get("c").unwrap(), HostWeight { data: vec![0.25, 3.0, -1.0], shape: vec![3, 1] });
        assert_eq!(ck.tensor_meta("b"), Some((Dtype::BF16, &[2usize][..])));
        let err = ck.get("ids").unwrap_err();
        assert!(matches!(err, WorkerError::Unsupported(_)) && err.to_string().contains("ids"), "{err}");
        let err = ck.get("missing").unwrap_err();
        assert!(err.to_string().contains("missing"), "{err}");
        assert!(ck.tokenizer_json_path().is_none());
    }

    #[test]
    fn sharded_checkpoint_through_the_index() {
        let dir = TempDir::new("st");
        write_config(dir.path());
        write_shard(
            &dir.path().join("model-00001-of-00002.safetensors"),
            &[("x", Dtype::F32, vec![1], f32_bytes(&[7.0]))],
        );
        write_shard(
            &dir.path().join("model-00002-of-00002.safetensors"),
            &[("y", Dtype::F32, vec![2], f32_bytes(&[8.0, 9.0]))],
        );
        let index = r#"{"metadata": {"total_size": 12}, "weight_map": {
            "x": "model-00001-of-00002.safetensors", "y": "model-00002-of-00002.safetensors"}}"#;
        std::fs::write(dir.path().join(INDEX_FILE), index).unwrap();
        let ck = HfCheckpoint::open(dir.path()).unwrap();
        assert_eq!(ck.get("x").unwrap().data, vec![7.0]);
        assert_eq!(ck.get("y").unwrap().data, vec![8.0, 9.0]);

        // An index naming a tensor its shard lacks is an error naming the tensor.
        let index =
            r#"{"weight_map": {"x": "model-00001-of-00002.safetensors", "z": "model-00001-of-00002.safetensors"}}"#;
        std::fs::write(dir.path().join(INDEX_FILE), index).unwrap();
        let err = HfCheckpoint::open(dir.path()).unwrap_err();
        assert!(err.to_string().contains("tensor z"), "{err}");
        // A shard path escaping the directory is refused.
        std::fs::write(dir.path().join(INDEX_FILE), r#"{"weight_map": {"x": "../x.safetensors"}}"#).unwrap();
        assert!(HfCheckpoint::open(dir.path()).is_err());
    }

    #[test]
    fn broken_files_are_errors_naming_the_file() {
        let dir = TempDir::new("st");
        // No config.
        let err = HfCheckpoint::open(dir.path()).unwrap_err();
        assert!(err.to_string().contains("config.json"), "{err}");
        std::fs::write(dir.path().join(CONFIG_FILE), "{not json").unwrap();
        let err = HfCheckpoint::open(dir.path()).unwrap_err();
        assert!(err.to_string().contains("invalid JSON"), "{err}");
        write_config(dir.path());
        // No weights.
        let err = HfCheckpoint::open(dir.path()).unwrap_err();
        assert!(err.to_string().contains(SINGLE_FILE), "{err}");
        // Truncated weights.
        let path = dir.path().join(SINGLE_FILE);
        write_shard(&path, &[("a", Dtype::F32, vec![4], f32_bytes(&[1.0, 2.0, 3.0, 4.0]))]);
        let bytes = std::fs::read(&path).unwrap();
        for cut in [bytes.len() - 1, 20, 4] {
            std::fs::write(&path, &bytes[..cut]).unwrap();
            let err = HfCheckpoint::open(dir.path()).unwrap_err();
            assert!(err.to_string().contains("model.safetensors"), "cut {cut}: {err}");
        }
    }

    /// A safetensors file by hand: the length-prefixed JSON header, then `data`.
    fn raw_file(header: &str, data: &[u8]) -> Vec<u8> {
        let mut b = (header.len() as u64).to_le_bytes().to_vec();
        b.extend(header.as_bytes());
        b.extend(data);
        b
    }

    #[test]
    fn bad_headers_are_errors_naming_the_file_or_tensor() {
        let path = Path::new("bad.safetensors");
        let err = |bytes: Vec<u8>| shard_tensors(path, &bytes).unwrap_err().to_string();
        // A zero dimension names the tensor.
        let msg = err(raw_file(r#"{"w":{"dtype":"F32","shape":[0,4],"data_offsets":[0,0]}}"#, &[]));
        assert!(msg.contains("bad.safetensors: tensor w: a dimension is 0 (shape [0, 4])"), "{msg}");
        // A header length beyond the file, or absurd.
        for len in [1u64 << 40, u64::MAX, 1000] {
            let mut b = len.to_le_bytes().to_vec();
            b.extend(b"{}");
            assert!(err(b).contains("bad.safetensors: invalid safetensors"));
        }
        // A byte range past the end, one that does not match shape × dtype, an overflowing shape.
        for header in [
            r#"{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,1099511627776]}}"#,
            r#"{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,8]}}"#,
            r#"{"w":{"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,16]}}"#,
            r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}"#,
        ] {
            let msg = err(raw_file(header, &[0; 16]));
            assert!(msg.contains("bad.safetensors: invalid safetensors"), "{header}: {msg}");
        }
        // A good one, for contrast: ranges are absolute and inside the file.
        let bytes = raw_file(r#"{"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}"#, &[0; 16]);
        let t = shard_tensors(path, &bytes).unwrap();
        assert_eq!((t[0].start, t[0].end, t[0].shape.clone()), (bytes.len() - 16, bytes.len(), vec![2, 2]));
        assert_eq!(shard_tensor_f32(path, &bytes, &t[0]).unwrap().data, vec![0.0; 4]);
    }
}
