//! GGUF files (v2/v3): header, metadata, tensor infos, and tensors by HF name.
//!
//! The file is memory-mapped; metadata is parsed once at open, tensor data is read (and
//! dequantized to f32) on demand. Every offset and length read from the file is checked against
//! the file's size, so a truncated or corrupt file is an error naming the file, never a panic.
//!
//! Model files are untrusted input: every count read from the header is bounded by the bytes
//! left in the file (each entry takes at least a known number of bytes), so what the header
//! makes us allocate is at most a small constant times the file's size, whatever it claims.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use super::config::MAX_EXPERTS;
use super::ggml_quants::{dequantize_into, GgmlType};
use super::source::{missing_tensor, HostWeight, WeightSource};
use crate::error::{Result, WorkerError};

const GGUF_MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
const MAX_DIMS: u32 = 8;
/// The smallest encodings: a metadata entry is a key (u64 length) + a u32 type + a 1-byte value;
/// a tensor info is a name (u64 length) + u32 n_dims + one u64 dim + u32 type + u64 offset.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 8 + 4 + 8;

/// One metadata value (GGUF `gguf_type`).
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    Array(Vec<GgufValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl GgufValue {
    /// Any integer type widened to i64 (u64 only when it fits).
    pub fn as_i64(&self) -> Option<i64> {
        Some(match *self {
            Self::U8(v) => v as i64,
            Self::I8(v) => v as i64,
            Self::U16(v) => v as i64,
            Self::I16(v) => v as i64,
            Self::U32(v) => v as i64,
            Self::I32(v) => v as i64,
            Self::U64(v) => i64::try_from(v).ok()?,
            Self::I64(v) => v,
            _ => return None,
        })
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Self::F32(v) => Some(v as f64),
            Self::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            Self::Array(a) => Some(a),
            _ => None,
        }
    }

    fn type_name(&self) -> &'static str {
        match self {
            Self::U8(_) => "u8",
            Self::I8(_) => "i8",
            Self::U16(_) => "u16",
            Self::I16(_) => "i16",
            Self::U32(_) => "u32",
            Self::I32(_) => "i32",
            Self::F32(_) => "f32",
            Self::Bool(_) => "bool",
            Self::Str(_) => "string",
            Self::Array(_) => "array",
            Self::U64(_) => "u64",
            Self::I64(_) => "i64",
            Self::F64(_) => "f64",
        }
    }
}

/// A tensor's entry in the GGUF header.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufTensorInfo {
    /// The llama.cpp name as stored (e.g. `blk.0.attn_q.weight`).
    pub name: String,
    /// Dimensions as stored: innermost first (`ne[0]` is the row length).
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Offset of the data from the start of the data section.
    pub offset: u64,
}

impl GgufTensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Shape outer-first (HF/numpy order): the reverse of `dims`.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }

    pub fn n_bytes(&self) -> u64 {
        // Checked at open: always whole blocks and no overflow.
        self.ty.bytes_for(self.n_elements()).unwrap_or(0)
    }
}

/// Where an HF tensor name points in the GGUF file: a whole tensor, or one expert of a stacked
/// expert tensor (`ffn_*_exps`, stored as `[n_expert, out, in]`).
#[derive(Debug, Clone, Copy, PartialEq)]
enum TensorRef {
    Whole(usize),
    /// A vector llama.cpp stores where HF has a one-row matrix (qwen2moe's shared-expert gate).
    Row(usize),
    Expert {
        tensor: usize,
        expert: usize,
    },
}

/// The file's bytes: a read-only map of the file, or a buffer (tests, fuzzing).
enum Bytes {
    Map(Mmap),
    Owned(Vec<u8>),
}

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Map(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

/// A GGUF file: memory-mapped, or an image held in memory.
pub struct GgufFile {
    path: PathBuf,
    mmap: Bytes,
    version: u32,
    metadata: Vec<(String, GgufValue)>,
    metadata_index: HashMap<String, usize>,
    tensors: Vec<GgufTensorInfo>,
    tensor_index: HashMap<String, usize>,
    hf_names: HashMap<String, TensorRef>,
    alignment: u64,
    data_offset: u64,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let file =
            File::open(&path).map_err(|e| WorkerError::ModelFile(format!("{}: cannot open: {e}", path.display())))?;
        // SAFETY: the map is read-only; model files are not expected to change while loaded (a
        // file truncated under us could fault, as with any mmap-based model loader).
        let mmap = unsafe { Mmap::map(&file) }
            .map_err(|e| WorkerError::ModelFile(format!("{}: cannot map: {e}", path.display())))?;
        Self::parse(path, Bytes::Map(mmap))
    }

    /// Parses a GGUF image held in memory; `name` stands for the file in error messages.
    pub fn from_bytes(name: impl Into<PathBuf>, bytes: Vec<u8>) -> Result<Self> {
        Self::parse(name.into(), Bytes::Owned(bytes))
    }

    fn parse(path: PathBuf, mmap: Bytes) -> Result<Self> {
        let mut r = Reader { buf: &mmap, pos: 0, path: &path };
        let magic = r.bytes(4, "magic")?;
        if magic != GGUF_MAGIC {
            return Err(r.err(format!("not a GGUF file (magic {magic:02x?})")));
        }
        let version = r.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(WorkerError::Unsupported(format!(
                "{}: GGUF version {version} (supported: 2, 3)",
                path.display()
            )));
        }
        let n_tensors = r.u64("tensor count")?;
        let n_kv = r.u64("metadata count")?;
        // Both lists follow: together they must fit in what is left of the file.
        let need = n_kv
            .checked_mul(MIN_KV_BYTES)
            .and_then(|kv| n_tensors.checked_mul(MIN_TENSOR_INFO_BYTES).and_then(|t| t.checked_add(kv)));
        if need.is_none_or(|need| need > r.left()) {
            return Err(r.err(format!(
                "header claims {n_kv} metadata entries and {n_tensors} tensors, more than the {} bytes \
                 left in the file can hold (corrupt header?)",
                r.left()
            )));
        }

        let mut metadata = Vec::new();
        r.reserve(&mut metadata, n_kv, "metadata")?;
        let mut metadata_index = HashMap::new();
        r.reserve_map(&mut metadata_index, n_kv, "metadata")?;
        for _ in 0..n_kv {
            let key = r.string("metadata key")?;
            let ty = r.u32(&key)?;
            let value = r.value(ty, &key, 0)?;
            metadata_index.insert(key.clone(), metadata.len());
            metadata.push((key, value));
        }

        let alignment = match metadata_index.get("general.alignment").map(|&i| &metadata[i].1) {
            None => DEFAULT_ALIGNMENT,
            Some(v) => match v.as_i64() {
                Some(a) if a > 0 && (a as u64).is_power_of_two() => a as u64,
                _ => return Err(r.err(format!("general.alignment {v:?} is not a power of two"))),
            },
        };

        let mut tensors = Vec::new();
        r.reserve(&mut tensors, n_tensors, "tensor infos")?;
        let mut tensor_index = HashMap::new();
        r.reserve_map(&mut tensor_index, n_tensors, "tensor infos")?;
        for _ in 0..n_tensors {
            let name = r.string("tensor name")?;
            let n_dims = r.u32(&name)?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(r.err(format!("tensor {name}: {n_dims} dimensions")));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(r.u64(&name)?);
            }
            if dims.contains(&0) {
                return Err(r.err(format!("tensor {name}: a dimension is 0 (dims {dims:?})")));
            }
            let type_id = r.u32(&name)?;
            let ty = GgmlType::from_id(type_id).ok_or_else(|| {
                WorkerError::Unsupported(format!("{}: tensor {name}: unknown ggml type id {type_id}", path.display()))
            })?;
            let offset = r.u64(&name)?;
            let info = GgufTensorInfo { name: name.clone(), dims, ty, offset };
            validate_tensor_shape(&path, &info)?;
            if tensor_index.insert(name.clone(), tensors.len()).is_some() {
                return Err(r.err(format!("tensor {name} appears twice")));
            }
            tensors.push(info);
        }

        // r.pos <= the file's length, so this rounds up to at most one alignment past it.
        let data_offset = (r.pos as u64).div_ceil(alignment) * alignment;
        let file_len = mmap.len() as u64;
        for t in &tensors {
            let end = data_offset.checked_add(t.offset).and_then(|s| s.checked_add(t.n_bytes()));
            match end {
                Some(end) if end <= file_len => {}
                _ => {
                    return Err(WorkerError::ModelFile(format!(
                        "{}: tensor {} ({} bytes at data offset {}) runs past the end of the file \
                         ({file_len} bytes): truncated?",
                        path.display(),
                        t.name,
                        t.n_bytes(),
                        t.offset
                    )))
                }
            }
            if t.offset % alignment != 0 {
                return Err(WorkerError::ModelFile(format!(
                    "{}: tensor {} offset {} is not aligned to {alignment}",
                    path.display(),
                    t.name,
                    t.offset
                )));
            }
        }

        let hf_names = hf_name_map(&path, &tensors)?;
        Ok(Self {
            path,
            mmap,
            version,
            metadata,
            metadata_index,
            tensors,
            tensor_index,
            hf_names,
            alignment,
            data_offset,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Byte offset of the tensor data section in the file.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// All metadata in file order.
    pub fn metadata(&self) -> &[(String, GgufValue)] {
        &self.metadata
    }

    /// A metadata value by key. (Named `value`, not `get`, so it never shadows
    /// [`WeightSource::get`], which takes tensor names.)
    pub fn value(&self, key: &str) -> Option<&GgufValue> {
        self.metadata_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// `general.architecture` (e.g. "llama", "qwen2", "qwen3").
    pub fn architecture(&self) -> Result<&str> {
        self.get_str("general.architecture")?.ok_or_else(|| self.err("no general.architecture".into()))
    }

    /// `<arch>.<suffix>`, e.g. `arch_key("block_count")` → "llama.block_count".
    pub fn arch_key(&self, suffix: &str) -> Result<String> {
        Ok(format!("{}.{suffix}", self.architecture()?))
    }

    /// An unsigned integer value (any integer type that fits in u32).
    pub fn get_u32(&self, key: &str) -> Result<Option<u32>> {
        self.typed(key, "u32", |v| v.as_i64().and_then(|x| u32::try_from(x).ok()))
    }

    pub fn get_u64(&self, key: &str) -> Result<Option<u64>> {
        self.typed(key, "u64", |v| match *v {
            GgufValue::U64(x) => Some(x),
            _ => v.as_i64().and_then(|x| u64::try_from(x).ok()),
        })
    }

    /// A float value (f32/f64; integers are accepted and converted).
    pub fn get_f32(&self, key: &str) -> Result<Option<f32>> {
        self.typed(key, "f32", |v| v.as_f64().map(|x| x as f32))
    }

    pub fn get_bool(&self, key: &str) -> Result<Option<bool>> {
        self.typed(key, "bool", |v| match v {
            GgufValue::Bool(b) => Some(*b),
            _ => None,
        })
    }

    pub fn get_str(&self, key: &str) -> Result<Option<&str>> {
        match self.value(key) {
            None => Ok(None),
            Some(GgufValue::Str(s)) => Ok(Some(s)),
            Some(v) => Err(self.wrong_type(key, "string", v)),
        }
    }

    pub fn get_str_array(&self, key: &str) -> Result<Option<Vec<&str>>> {
        self.array(key, "string array", |v| v.as_str())
    }

    pub fn get_i32_array(&self, key: &str) -> Result<Option<Vec<i32>>> {
        self.array(key, "i32 array", |v| v.as_i64().and_then(|x| i32::try_from(x).ok()))
    }

    pub fn get_f32_array(&self, key: &str) -> Result<Option<Vec<f32>>> {
        self.array(key, "f32 array", |v| v.as_f64().map(|x| x as f32))
    }

    /// A required u32 (error naming the key when missing).
    pub fn require_u32(&self, key: &str) -> Result<u32> {
        self.get_u32(key)?.ok_or_else(|| self.err(format!("missing metadata key {key}")))
    }

    /// A required f32 (error naming the key when missing).
    pub fn require_f32(&self, key: &str) -> Result<f32> {
        self.get_f32(key)?.ok_or_else(|| self.err(format!("missing metadata key {key}")))
    }

    /// Tensor infos in file order.
    pub fn tensor_infos(&self) -> &[GgufTensorInfo] {
        &self.tensors
    }

    /// Tensor info by its llama.cpp (GGUF) name.
    pub fn tensor_info(&self, gguf_name: &str) -> Option<&GgufTensorInfo> {
        self.tensor_index.get(gguf_name).map(|&i| &self.tensors[i])
    }

    /// The raw bytes of a tensor as stored (for kernels that use the quantized data directly).
    pub fn tensor_bytes(&self, info: &GgufTensorInfo) -> Result<&[u8]> {
        // Bounds were checked at open; a foreign `info` is checked again here.
        let start = self.data_offset.checked_add(info.offset);
        let end = start.and_then(|s| s.checked_add(info.n_bytes()));
        start
            .zip(end)
            .and_then(|(s, e)| self.mmap.get(usize::try_from(s).ok()?..usize::try_from(e).ok()?))
            .ok_or_else(|| self.err(format!("tensor {} lies outside the file", info.name)))
    }

    /// A tensor by its llama.cpp (GGUF) name, dequantized to f32, shape outer-first.
    pub fn tensor_f32(&self, gguf_name: &str) -> Result<HostWeight> {
        let info = self.tensor_info(gguf_name).ok_or_else(|| missing_tensor(&self.path, gguf_name))?;
        self.dequantize(info, 0, info.n_bytes(), info.shape())
    }

    /// The HF name → GGUF name map entries (for diagnostics).
    pub fn gguf_name_for(&self, hf_name: &str) -> Option<&str> {
        self.hf_names.get(hf_name).map(|r| match *r {
            TensorRef::Whole(i) | TensorRef::Row(i) | TensorRef::Expert { tensor: i, .. } => {
                self.tensors[i].name.as_str()
            }
        })
    }

    fn dequantize(
        &self,
        info: &GgufTensorInfo,
        byte_start: u64,
        byte_len: u64,
        shape: Vec<usize>,
    ) -> Result<HostWeight> {
        if !info.ty.can_dequantize() {
            return Err(WorkerError::Unsupported(format!(
                "{}: tensor {}: ggml type {} cannot be dequantized by this worker",
                self.path.display(),
                info.name,
                info.ty.name()
            )));
        }
        let all = self.tensor_bytes(info)?;
        let bytes = byte_start
            .checked_add(byte_len)
            .and_then(|end| all.get(byte_start as usize..end as usize))
            .ok_or_else(|| self.err(format!("tensor {}: slice outside the tensor", info.name)))?;
        let mut data = Vec::new();
        dequantize_into(info.ty, bytes, &mut data).map_err(|e| self.err(format!("tensor {}: {e}", info.name)))?;
        HostWeight::new(data, shape)
    }

    fn typed<T>(&self, key: &str, want: &str, conv: impl Fn(&GgufValue) -> Option<T>) -> Result<Option<T>> {
        match self.value(key) {
            None => Ok(None),
            Some(v) => conv(v).map(Some).ok_or_else(|| self.wrong_type(key, want, v)),
        }
    }

    fn array<'a, T>(
        &'a self,
        key: &str,
        want: &str,
        conv: impl Fn(&'a GgufValue) -> Option<T>,
    ) -> Result<Option<Vec<T>>> {
        match self.value(key) {
            None => Ok(None),
            Some(v) => {
                let arr = v.as_array().ok_or_else(|| self.wrong_type(key, want, v))?;
                arr.iter()
                    .map(|x| conv(x).ok_or_else(|| self.wrong_type(key, want, x)))
                    .collect::<Result<Vec<T>>>()
                    .map(Some)
            }
        }
    }

    fn wrong_type(&self, key: &str, want: &str, got: &GgufValue) -> WorkerError {
        self.err(format!("metadata {key}: expected {want}, found {}", got.type_name()))
    }

    fn err(&self, msg: String) -> WorkerError {
        WorkerError::ModelFile(format!("{}: {msg}", self.path.display()))
    }
}

impl WeightSource for GgufFile {
    fn get(&self, name: &str) -> Result<HostWeight> {
        match self.hf_names.get(name) {
            None => Err(missing_tensor(&self.path, name)),
            Some(&TensorRef::Whole(i)) => {
                let info = &self.tensors[i];
                self.dequantize(info, 0, info.n_bytes(), info.shape())
            }
            Some(&TensorRef::Row(i)) => {
                let info = &self.tensors[i];
                let mut shape = info.shape();
                if shape.len() == 1 {
                    shape.insert(0, 1);
                }
                self.dequantize(info, 0, info.n_bytes(), shape)
            }
            Some(&TensorRef::Expert { tensor, expert }) => {
                let info = &self.tensors[tensor];
                let shape = info.shape();
                let per_expert = info.n_bytes() / shape[0] as u64;
                self.dequantize(info, per_expert * expert as u64, per_expert, shape[1..].to_vec())
            }
        }
    }

    fn has(&self, name: &str) -> bool {
        self.hf_names.contains_key(name)
    }

    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.hf_names.keys().cloned().collect();
        names.sort();
        names
    }
}

/// Every tensor row must be whole blocks of its type, and the byte size must not overflow.
fn validate_tensor_shape(path: &Path, t: &GgufTensorInfo) -> Result<()> {
    let bad = |why: String| WorkerError::ModelFile(format!("{}: tensor {}: {why}", path.display(), t.name));
    let mut n: u64 = 1;
    for &d in &t.dims {
        n = n.checked_mul(d).ok_or_else(|| bad(format!("dims {:?} overflow", t.dims)))?;
    }
    if !t.dims[0].is_multiple_of(t.ty.block_size() as u64) {
        return Err(bad(format!(
            "row length {} is not a multiple of the {} block size {}",
            t.dims[0],
            t.ty.name(),
            t.ty.block_size()
        )));
    }
    t.ty.bytes_for(n).ok_or_else(|| bad("byte size overflows".into()))?;
    Ok(())
}

/// Maps llama.cpp tensor names to HF names for llama / qwen2 / qwen3 (and their MoE variants).
/// Tensors without an HF counterpart keep their GGUF name, so nothing in the file is hidden.
/// A stacked expert tensor `blk.N.ffn_gate_exps.weight` `[n_expert, out, in]` becomes one name
/// per expert, `model.layers.N.mlp.experts.E.gate_proj.weight`.
///
/// The expert count is bounded by [`MAX_EXPERTS`], so a file cannot make the map huge.
fn hf_name_map(path: &Path, tensors: &[GgufTensorInfo]) -> Result<HashMap<String, TensorRef>> {
    let mut map = HashMap::new();
    for (i, t) in tensors.iter().enumerate() {
        match hf_name(&t.name) {
            Some(HfName::Plain(name)) => {
                map.insert(name, TensorRef::Whole(i));
            }
            Some(HfName::Row(name)) => {
                map.insert(name, TensorRef::Row(i));
            }
            Some(HfName::Experts { layer, proj, suffix }) if t.dims.len() == 3 => {
                if t.dims[2] > MAX_EXPERTS as u64 {
                    return Err(WorkerError::ModelFile(format!(
                        "{}: tensor {}: {} experts (dims {:?}), more than the {MAX_EXPERTS} supported",
                        path.display(),
                        t.name,
                        t.dims[2],
                        t.dims
                    )));
                }
                for e in 0..t.dims[2] as usize {
                    map.insert(
                        format!("model.layers.{layer}.mlp.experts.{e}.{proj}.{suffix}"),
                        TensorRef::Expert { tensor: i, expert: e },
                    );
                }
            }
            _ => {
                map.insert(t.name.clone(), TensorRef::Whole(i));
            }
        }
    }
    Ok(map)
}

enum HfName {
    Plain(String),
    /// A one-row HF matrix that llama.cpp stores as a vector.
    Row(String),
    Experts {
        layer: usize,
        proj: &'static str,
        suffix: String,
    },
}

fn hf_name(gguf: &str) -> Option<HfName> {
    match gguf {
        "token_embd.weight" => return Some(HfName::Plain("model.embed_tokens.weight".into())),
        "output_norm.weight" => return Some(HfName::Plain("model.norm.weight".into())),
        "output.weight" => return Some(HfName::Plain("lm_head.weight".into())),
        _ => {}
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (base, suffix) = rest.rsplit_once('.')?;
    let plain = |hf: &str| Some(HfName::Plain(format!("model.layers.{layer}.{hf}.{suffix}")));
    match base {
        "attn_norm" => plain("input_layernorm"),
        "attn_q" => plain("self_attn.q_proj"),
        "attn_k" => plain("self_attn.k_proj"),
        "attn_v" => plain("self_attn.v_proj"),
        "attn_output" => plain("self_attn.o_proj"),
        "attn_q_norm" => plain("self_attn.q_norm"),
        "attn_k_norm" => plain("self_attn.k_norm"),
        "ffn_norm" => plain("post_attention_layernorm"),
        "ffn_gate" => plain("mlp.gate_proj"),
        "ffn_up" => plain("mlp.up_proj"),
        "ffn_down" => plain("mlp.down_proj"),
        "ffn_gate_inp" => plain("mlp.gate"),
        "ffn_gate_shexp" => plain("mlp.shared_expert.gate_proj"),
        "ffn_up_shexp" => plain("mlp.shared_expert.up_proj"),
        "ffn_down_shexp" => plain("mlp.shared_expert.down_proj"),
        "ffn_gate_inp_shexp" => Some(HfName::Row(format!("model.layers.{layer}.mlp.shared_expert_gate.{suffix}"))),
        "ffn_gate_exps" | "ffn_up_exps" | "ffn_down_exps" => Some(HfName::Experts {
            layer,
            proj: match base {
                "ffn_gate_exps" => "gate_proj",
                "ffn_up_exps" => "up_proj",
                _ => "down_proj",
            },
            suffix: suffix.to_string(),
        }),
        _ => None,
    }
}

/// A bounds-checked little-endian cursor over the mapped header.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Reader<'a> {
    fn err(&self, msg: String) -> WorkerError {
        WorkerError::ModelFile(format!("{}: {msg}", self.path.display()))
    }

    fn bytes(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len()).ok_or_else(|| {
            self.err(format!(
                "truncated header: reading {what} ({n} bytes at offset {}) past the end ({} bytes)",
                self.pos,
                self.buf.len()
            ))
        })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let b = self.bytes(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(b);
        Ok(a)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Bytes not read yet.
    fn left(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    /// Room for `n` more entries, `n` already bounded by the bytes left; an allocation failure
    /// is an error, not an abort.
    fn reserve<T>(&self, v: &mut Vec<T>, n: u64, what: &str) -> Result<()> {
        usize::try_from(n)
            .ok()
            .and_then(|n| v.try_reserve(n).ok())
            .ok_or_else(|| self.err(format!("cannot allocate {n} {what}")))
    }

    fn reserve_map<V>(&self, m: &mut HashMap<String, V>, n: u64, what: &str) -> Result<()> {
        usize::try_from(n)
            .ok()
            .and_then(|n| m.try_reserve(n).ok())
            .ok_or_else(|| self.err(format!("cannot allocate {n} {what}")))
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let len = self.u64(what)?;
        let len = usize::try_from(len).map_err(|_| self.err(format!("{what}: length {len}")))?;
        let b = self.bytes(len, what)?;
        String::from_utf8(b.to_vec()).map_err(|_| self.err(format!("{what}: invalid UTF-8")))
    }

    fn value(&mut self, ty: u32, key: &str, depth: u32) -> Result<GgufValue> {
        Ok(match ty {
            0 => GgufValue::U8(self.array::<1>(key)?[0]),
            1 => GgufValue::I8(self.array::<1>(key)?[0] as i8),
            2 => GgufValue::U16(u16::from_le_bytes(self.array(key)?)),
            3 => GgufValue::I16(i16::from_le_bytes(self.array(key)?)),
            4 => GgufValue::U32(self.u32(key)?),
            5 => GgufValue::I32(i32::from_le_bytes(self.array(key)?)),
            6 => GgufValue::F32(f32::from_le_bytes(self.array(key)?)),
            7 => match self.array::<1>(key)?[0] {
                0 => GgufValue::Bool(false),
                1 => GgufValue::Bool(true),
                b => return Err(self.err(format!("metadata {key}: bool byte {b}"))),
            },
            8 => GgufValue::Str(self.string(key)?),
            9 => {
                if depth >= 4 {
                    return Err(self.err(format!("metadata {key}: arrays nested too deeply")));
                }
                let elem_ty = self.u32(key)?;
                let n = self.u64(key)?;
                let min = min_value_bytes(elem_ty)
                    .ok_or_else(|| self.err(format!("metadata {key}: unknown array element type {elem_ty}")))?;
                // Each element takes at least `min` bytes: a count beyond the remaining bytes is corrupt.
                if n.checked_mul(min).is_none_or(|need| need > self.left()) {
                    return Err(
                        self.err(format!("metadata {key}: array of {n} elements runs past the end of the file"))
                    );
                }
                let mut items = Vec::new();
                self.reserve(&mut items, n, key)?;
                for _ in 0..n {
                    items.push(self.value(elem_ty, key, depth + 1)?);
                }
                GgufValue::Array(items)
            }
            10 => GgufValue::U64(self.u64(key)?),
            11 => GgufValue::I64(i64::from_le_bytes(self.array(key)?)),
            12 => GgufValue::F64(f64::from_le_bytes(self.array(key)?)),
            other => return Err(self.err(format!("metadata {key}: unknown value type {other}"))),
        })
    }
}

/// The fewest bytes a metadata value of type `ty` takes (an array: its element type and count).
fn min_value_bytes(ty: u32) -> Option<u64> {
    Some(match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10..=12 => 8,
        9 => 4 + 8,
        _ => return None,
    })
}

/// Builds GGUF files in memory for tests and fuzz seeds (v3, little-endian).
#[cfg(any(test, feature = "test-support"))]
pub mod test_writer {
    use super::GgufValue;

    pub struct TestTensor {
        pub name: String,
        /// Innermost first, as stored.
        pub dims: Vec<u64>,
        pub type_id: u32,
        pub data: Vec<u8>,
    }

    fn put_str(out: &mut Vec<u8>, s: &str) {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    }

    fn type_id(v: &GgufValue) -> u32 {
        match v {
            GgufValue::U8(_) => 0,
            GgufValue::I8(_) => 1,
            GgufValue::U16(_) => 2,
            GgufValue::I16(_) => 3,
            GgufValue::U32(_) => 4,
            GgufValue::I32(_) => 5,
            GgufValue::F32(_) => 6,
            GgufValue::Bool(_) => 7,
            GgufValue::Str(_) => 8,
            GgufValue::Array(_) => 9,
            GgufValue::U64(_) => 10,
            GgufValue::I64(_) => 11,
            GgufValue::F64(_) => 12,
        }
    }

    fn put_value(out: &mut Vec<u8>, v: &GgufValue) {
        match v {
            GgufValue::U8(x) => out.push(*x),
            GgufValue::I8(x) => out.push(*x as u8),
            GgufValue::U16(x) => out.extend(x.to_le_bytes()),
            GgufValue::I16(x) => out.extend(x.to_le_bytes()),
            GgufValue::U32(x) => out.extend(x.to_le_bytes()),
            GgufValue::I32(x) => out.extend(x.to_le_bytes()),
            GgufValue::F32(x) => out.extend(x.to_le_bytes()),
            GgufValue::Bool(x) => out.push(*x as u8),
            GgufValue::Str(s) => put_str(out, s),
            GgufValue::Array(items) => {
                let elem = items.first().map_or(4, type_id);
                out.extend(elem.to_le_bytes());
                out.extend((items.len() as u64).to_le_bytes());
                for it in items {
                    put_value(out, it);
                }
            }
            GgufValue::U64(x) => out.extend(x.to_le_bytes()),
            GgufValue::I64(x) => out.extend(x.to_le_bytes()),
            GgufValue::F64(x) => out.extend(x.to_le_bytes()),
        }
    }

    /// The bytes of a GGUF v3 file with these metadata and tensors (alignment 32 unless
    /// `general.alignment` is a power of two up to 64 KiB: the data is then laid out by it; any
    /// other value is written as given, for the reader to refuse).
    pub fn gguf_bytes(kvs: &[(&str, GgufValue)], tensors: &[TestTensor]) -> Vec<u8> {
        let alignment = kvs
            .iter()
            .find(|(k, _)| *k == "general.alignment")
            .and_then(|(_, v)| v.as_i64())
            .filter(|&a| a > 0 && a <= 1 << 16 && (a as u64).is_power_of_two())
            .unwrap_or(32) as usize;
        let mut out = Vec::new();
        out.extend(b"GGUF");
        out.extend(3u32.to_le_bytes());
        out.extend((tensors.len() as u64).to_le_bytes());
        out.extend((kvs.len() as u64).to_le_bytes());
        for (k, v) in kvs {
            put_str(&mut out, k);
            out.extend(type_id(v).to_le_bytes());
            put_value(&mut out, v);
        }
        let mut offset = 0usize;
        let mut offsets = Vec::new();
        for t in tensors {
            put_str(&mut out, &t.name);
            out.extend((t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(t.type_id.to_le_bytes());
            out.extend((offset as u64).to_le_bytes());
            offsets.push(offset);
            offset = (offset + t.data.len()).div_ceil(alignment) * alignment;
        }
        out.resize(out.len().div_ceil(alignment) * alignment, 0);
        let data_start = out.len();
        for (t, off) in tensors.iter().zip(offsets) {
            out.resize(data_start + off, 0);
            out.extend(&t.data);
        }
        out
    }

    pub fn f32_tensor(name: &str, dims: &[u64], values: &[f32]) -> TestTensor {
        TestTensor {
            name: name.into(),
            dims: dims.to_vec(),
            type_id: 0,
            data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_writer::{f32_tensor, gguf_bytes, TestTensor};
    use super::*;
    use crate::model::test_assets::{asset, fixture_json, TempDir, SMOLLM2_GGUF};

    fn write_gguf(dir: &TempDir, bytes: &[u8]) -> PathBuf {
        let path = dir.path().join("m.gguf");
        std::fs::write(&path, bytes).unwrap();
        path
    }

    fn assert_close(got: f32, want: f64, what: &str) {
        let tol = 1e-6 * want.abs().max(1e-3);
        assert!((got as f64 - want).abs() <= tol, "{what}: got {got}, want {want}");
    }

    #[test]
    fn dequantize_matches_python_gguf_for_every_supported_type() {
        let fx = fixture_json("gguf_dequant.json");
        let cases = fx["cases"].as_array().unwrap();
        let mut seen = Vec::new();
        for case in cases {
            let name = case["type"].as_str().unwrap();
            let ty = GgmlType::from_name(name).unwrap_or_else(|| panic!("type {name}"));
            let hex = case["bytes_hex"].as_str().unwrap();
            let bytes: Vec<u8> =
                (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect();
            let want: Vec<f64> = case["values"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
            let got = crate::model::ggml_quants::dequantize(ty, &bytes).unwrap();
            assert_eq!(got.len(), want.len(), "{name}: element count");
            for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                assert_close(g, w, &format!("{name}[{i}]"));
            }
            seen.push(ty);
        }
        for ty in [
            GgmlType::F32,
            GgmlType::F16,
            GgmlType::BF16,
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
            GgmlType::Q8_0,
            GgmlType::Q2K,
            GgmlType::Q3K,
            GgmlType::Q4K,
            GgmlType::Q5K,
            GgmlType::Q6K,
        ] {
            assert!(seen.contains(&ty), "fixture lacks {}", ty.name());
        }
    }

    #[test]
    fn smollm2_metadata_matches_python_gguf_reader() {
        let fx = fixture_json("gguf_smollm2.json");
        let g = GgufFile::open(asset(SMOLLM2_GGUF)).unwrap();
        assert_eq!(g.version() as u64, fx["version"].as_u64().unwrap());
        assert_eq!(g.tensor_infos().len() as u64, fx["tensor_count"].as_u64().unwrap());
        assert_eq!(g.metadata().len() as u64, fx["kv_count"].as_u64().unwrap());
        assert_eq!(g.data_offset(), fx["data_offset"].as_u64().unwrap());
        assert_eq!(g.alignment(), fx["alignment"].as_u64().unwrap());
        assert_eq!(g.architecture().unwrap(), "llama");
        for (key, want) in fx["metadata"].as_object().unwrap() {
            match want {
                serde_json::Value::String(s) => assert_eq!(g.get_str(key).unwrap(), Some(s.as_str()), "{key}"),
                serde_json::Value::Bool(b) => assert_eq!(g.get_bool(key).unwrap(), Some(*b), "{key}"),
                serde_json::Value::Number(n) if n.is_u64() => {
                    assert_eq!(g.get_u32(key).unwrap().map(u64::from), n.as_u64(), "{key}")
                }
                serde_json::Value::Number(n) => {
                    assert_eq!(g.get_f32(key).unwrap(), Some(n.as_f64().unwrap() as f32), "{key}")
                }
                other => panic!("unexpected fixture value {other}"),
            }
        }
        let tokens = g.get_str_array("tokenizer.ggml.tokens").unwrap().unwrap();
        assert_eq!(tokens.len() as u64, fx["tokens"]["count"].as_u64().unwrap());
        let first: Vec<&str> = fx["tokens"]["first"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
        assert_eq!(&tokens[..first.len()], &first[..]);
        let last: Vec<&str> = fx["tokens"]["last"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
        assert_eq!(&tokens[tokens.len() - last.len()..], &last[..]);
        let merges = g.get_str_array("tokenizer.ggml.merges").unwrap().unwrap();
        assert_eq!(merges.len() as u64, fx["merges"]["count"].as_u64().unwrap());
        let types = g.get_i32_array("tokenizer.ggml.token_type").unwrap().unwrap();
        for (ty, count) in fx["token_type_counts"].as_object().unwrap() {
            let ty: i32 = ty.parse().unwrap();
            assert_eq!(types.iter().filter(|&&t| t == ty).count() as u64, count.as_u64().unwrap());
        }
        for (ty, count) in fx["tensor_type_counts"].as_object().unwrap() {
            let n = g.tensor_infos().iter().filter(|t| t.ty.name() == ty).count();
            assert_eq!(n as u64, count.as_u64().unwrap(), "tensors of type {ty}");
        }
        // Typed accessors refuse the wrong type rather than converting silently.
        assert!(g.get_str("llama.block_count").is_err());
        assert!(g.get_u32("general.architecture").is_err());
        assert_eq!(g.get_u32("no.such.key").unwrap(), None);
    }

    #[test]
    fn smollm2_tensors_match_python_gguf_dequantize() {
        let fx = fixture_json("gguf_smollm2.json");
        let g = GgufFile::open(asset(SMOLLM2_GGUF)).unwrap();
        for t in fx["tensors"].as_array().unwrap() {
            let gguf_name = t["gguf_name"].as_str().unwrap();
            let hf_name = t["hf_name"].as_str().unwrap();
            assert_eq!(g.tensor_info(gguf_name).unwrap().ty.name(), t["type"].as_str().unwrap());
            assert!(g.has(hf_name), "{hf_name}");
            assert_eq!(g.gguf_name_for(hf_name), Some(gguf_name));
            let w = WeightSource::get(&g, hf_name).unwrap();
            let shape: Vec<usize> =
                t["shape"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
            assert_eq!(w.shape, shape, "{hf_name}");
            for pair in t["values_at"].as_array().unwrap() {
                let i = pair[0].as_u64().unwrap() as usize;
                assert_close(w.data[i], pair[1].as_f64().unwrap(), &format!("{hf_name}[{i}]"));
            }
            let sum: f64 = w.data.iter().map(|&x| x as f64).sum();
            let sum_abs: f64 = w.data.iter().map(|&x| (x as f64).abs()).sum();
            let want_abs = t["sum_abs"].as_f64().unwrap();
            assert!((sum_abs - want_abs).abs() <= 1e-6 * want_abs, "{hf_name} sum|x| {sum_abs} vs {want_abs}");
            assert!((sum - t["sum"].as_f64().unwrap()).abs() <= 1e-6 * want_abs, "{hf_name} sum");
            // The same tensor by its GGUF name.
            assert_eq!(g.tensor_f32(gguf_name).unwrap(), w);
        }
    }

    #[test]
    fn smollm2_hf_names_cover_a_llama_model() {
        let g = GgufFile::open(asset(SMOLLM2_GGUF)).unwrap();
        let names = g.names();
        assert!(names.contains(&"model.embed_tokens.weight".to_string()));
        assert!(names.contains(&"model.norm.weight".to_string()));
        // Tied embeddings: the file has no output.weight.
        assert!(!g.has("lm_head.weight"));
        for l in [0, 29] {
            for suffix in [
                "input_layernorm.weight",
                "post_attention_layernorm.weight",
                "self_attn.q_proj.weight",
                "self_attn.k_proj.weight",
                "self_attn.v_proj.weight",
                "self_attn.o_proj.weight",
                "mlp.gate_proj.weight",
                "mlp.up_proj.weight",
                "mlp.down_proj.weight",
            ] {
                assert!(g.has(&format!("model.layers.{l}.{suffix}")), "layer {l} {suffix}");
            }
        }
        // Every tensor got an HF name: no GGUF-named leftovers in a plain llama file.
        assert!(names.iter().all(|n| n.starts_with("model.")), "{names:?}");
        assert_eq!(names.len(), g.tensor_infos().len());
        let err = WeightSource::get(&g, "model.layers.30.mlp.up_proj.weight").unwrap_err();
        assert!(err.to_string().contains("model.layers.30.mlp.up_proj.weight"), "{err}");
    }

    fn small_file() -> Vec<u8> {
        gguf_bytes(
            &[
                ("general.architecture", GgufValue::Str("qwen3".into())),
                ("qwen3.block_count", GgufValue::U32(1)),
                (
                    "nested",
                    GgufValue::Array(vec![
                        GgufValue::Array(vec![GgufValue::I32(1), GgufValue::I32(-2)]),
                        GgufValue::Array(vec![GgufValue::I32(3)]),
                    ]),
                ),
                ("f64", GgufValue::F64(0.5)),
                ("flags", GgufValue::Array(vec![GgufValue::Bool(true), GgufValue::Bool(false)])),
            ],
            &[
                f32_tensor("blk.0.attn_q_norm.weight", &[4], &[1.0, 2.0, 3.0, 4.0]),
                f32_tensor("blk.0.attn_q.bias", &[2], &[0.5, -0.5]),
                f32_tensor("blk.0.ffn_gate_inp_shexp.weight", &[3], &[0.25, -1.0, 2.0]),
                // Two experts of [out=2, in=3]: stored dims [3, 2, 2].
                f32_tensor(
                    "blk.0.ffn_up_exps.weight",
                    &[3, 2, 2],
                    &[0., 1., 2., 3., 4., 5., 10., 11., 12., 13., 14., 15.],
                ),
                f32_tensor("rope_freqs.weight", &[2], &[1.0, 1.0]),
            ],
        )
    }

    #[test]
    fn parses_nested_arrays_and_maps_expert_and_bias_names() {
        let dir = TempDir::new("gguf");
        let g = GgufFile::open(write_gguf(&dir, &small_file())).unwrap();
        let nested = g.value("nested").unwrap().as_array().unwrap();
        assert_eq!(nested[0], GgufValue::Array(vec![GgufValue::I32(1), GgufValue::I32(-2)]));
        assert_eq!(g.get_f32("f64").unwrap(), Some(0.5));
        assert_eq!(g.value("flags").unwrap().as_array().unwrap()[1], GgufValue::Bool(false));
        assert_eq!(g.require_u32("qwen3.block_count").unwrap(), 1);
        assert!(g.require_u32("qwen3.context_length").is_err());

        let q_norm = WeightSource::get(&g, "model.layers.0.self_attn.q_norm.weight").unwrap();
        assert_eq!(q_norm.data, vec![1.0, 2.0, 3.0, 4.0]);
        let bias = WeightSource::get(&g, "model.layers.0.self_attn.q_proj.bias").unwrap();
        assert_eq!(bias.data, vec![0.5, -0.5]);
        // llama.cpp's vector shared-expert gate reads as HF's one-row projection.
        let gate = WeightSource::get(&g, "model.layers.0.mlp.shared_expert_gate.weight").unwrap();
        assert_eq!((gate.shape, gate.data), (vec![1, 3], vec![0.25, -1.0, 2.0]));
        let e1 = WeightSource::get(&g, "model.layers.0.mlp.experts.1.up_proj.weight").unwrap();
        assert_eq!(e1.shape, vec![2, 3]);
        assert_eq!(e1.data, vec![10., 11., 12., 13., 14., 15.]);
        assert!(!g.has("model.layers.0.mlp.experts.2.up_proj.weight"));
        // A tensor with no HF counterpart keeps its GGUF name.
        assert!(g.has("rope_freqs.weight"));
    }

    #[test]
    fn truncated_file_is_an_error_naming_the_file() {
        let dir = TempDir::new("gguf");
        let full = small_file();
        // Cut inside the tensor data, inside the tensor infos, and inside the metadata.
        for cut in [full.len() - 4, full.len() / 2, 40, 10, 3] {
            let path = write_gguf(&dir, &full[..cut]);
            let err = GgufFile::open(&path).unwrap_err();
            let msg = err.to_string();
            assert!(msg.contains("m.gguf"), "cut {cut}: {msg}");
            assert!(matches!(err, WorkerError::ModelFile(_)), "cut {cut}: {msg}");
        }
    }

    #[test]
    fn bad_magic_version_and_type_are_errors() {
        let dir = TempDir::new("gguf");
        let mut bytes = small_file();
        bytes[0] = b'X';
        let err = GgufFile::open(write_gguf(&dir, &bytes)).unwrap_err();
        assert!(err.to_string().contains("not a GGUF file"), "{err}");

        let mut bytes = small_file();
        bytes[4] = 9;
        let err = GgufFile::open(write_gguf(&dir, &bytes)).unwrap_err();
        assert!(err.to_string().contains("version 9"), "{err}");

        let bytes = gguf_bytes(&[], &[TestTensor { name: "x".into(), dims: vec![32], type_id: 99, data: vec![0; 64] }]);
        let err = GgufFile::open(write_gguf(&dir, &bytes)).unwrap_err();
        assert!(err.to_string().contains("unknown ggml type id 99"), "{err}");

        // A known type this worker cannot dequantize: an error when read, not at open.
        let bytes = gguf_bytes(
            &[],
            &[TestTensor { name: "output.weight".into(), dims: vec![256], type_id: 15, data: vec![0; 292] }],
        );
        let g = GgufFile::open(write_gguf(&dir, &bytes)).unwrap();
        let err = WeightSource::get(&g, "lm_head.weight").unwrap_err();
        assert!(matches!(err, WorkerError::Unsupported(_)), "{err}");
        assert!(err.to_string().contains("Q8_K"), "{err}");

        // A row that is not whole blocks.
        let bytes = gguf_bytes(&[], &[TestTensor { name: "x".into(), dims: vec![16], type_id: 8, data: vec![0; 34] }]);
        let err = GgufFile::open(write_gguf(&dir, &bytes)).unwrap_err();
        assert!(err.to_string().contains("block size"), "{err}");
    }

    #[test]
    fn honours_general_alignment() {
        let dir = TempDir::new("gguf");
        let bytes = gguf_bytes(
            &[("general.alignment", GgufValue::U32(64))],
            &[f32_tensor("a", &[3], &[1.0, 2.0, 3.0]), f32_tensor("b", &[2], &[4.0, 5.0])],
        );
        let g = GgufFile::open(write_gguf(&dir, &bytes)).unwrap();
        assert_eq!(g.alignment(), 64);
        assert_eq!(g.data_offset() % 64, 0);
        assert_eq!(g.tensor_info("b").unwrap().offset, 64);
        assert_eq!(g.tensor_f32("b").unwrap().data, vec![4.0, 5.0]);
    }

    /// A GGUF header by hand: magic, version 3, the two counts, then `rest`.
    fn raw_header(n_tensors: u64, n_kv: u64, rest: &[u8]) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(n_tensors.to_le_bytes());
        b.extend(n_kv.to_le_bytes());
        b.extend(rest);
        b
    }

    fn open_err(bytes: Vec<u8>) -> String {
        match GgufFile::from_bytes("bad.gguf", bytes) {
            Ok(_) => panic!("a bad file was accepted"),
            Err(e) => {
                assert!(matches!(e, WorkerError::ModelFile(_)), "{e}");
                let msg = e.to_string();
                assert!(msg.contains("bad.gguf"), "{msg}");
                msg
            }
        }
    }

    #[test]
    fn counts_beyond_the_bytes_left_are_refused_before_allocating() {
        // Found: 2^28 metadata entries or tensors claimed by a tiny file reserved ~16 GB.
        for (n_tensors, n_kv) in [(0, 1u64 << 28), (1 << 28, 0), (0, u64::MAX), (u64::MAX, u64::MAX), (3, 0)] {
            let msg = open_err(raw_header(n_tensors, n_kv, &[0; 64]));
            assert!(msg.contains("more than the 64 bytes left"), "{n_tensors}/{n_kv}: {msg}");
        }
        // An array claiming more elements than the file holds, for each element size.
        for (elem_ty, n) in [(0u32, 100u64), (8, 1 << 40), (9, 1 << 20), (12, 9), (4, u64::MAX)] {
            let mut kv = Vec::new();
            kv.extend(3u64.to_le_bytes());
            kv.extend(b"arr");
            kv.extend(9u32.to_le_bytes());
            kv.extend(elem_ty.to_le_bytes());
            kv.extend(n.to_le_bytes());
            kv.extend([0u8; 64]);
            let msg = open_err(raw_header(0, 1, &kv));
            assert!(msg.contains("metadata arr: array of") && msg.contains("runs past the end"), "{elem_ty}: {msg}");
        }
        // An unknown element type is named, not looped over.
        let mut kv = Vec::new();
        kv.extend(3u64.to_le_bytes());
        kv.extend(b"arr");
        kv.extend(9u32.to_le_bytes());
        kv.extend(77u32.to_le_bytes());
        kv.extend(0u64.to_le_bytes());
        let msg = open_err(raw_header(0, 1, &kv));
        assert!(msg.contains("unknown array element type 77"), "{msg}");
        // A string longer than the file.
        let mut kv = Vec::new();
        kv.extend((1u64 << 40).to_le_bytes());
        kv.extend([b'k'; 40]);
        let msg = open_err(raw_header(0, 1, &kv));
        assert!(msg.contains("truncated header"), "{msg}");
    }

    #[test]
    fn zero_and_absurd_dimensions_are_errors_naming_the_tensor() {
        // Found: a 128-byte file with dims [0, 1, 2^40] looped 2^40 times naming experts.
        let bytes = gguf_bytes(
            &[],
            &[TestTensor {
                name: "blk.0.ffn_up_exps.weight".into(),
                dims: vec![0, 1, 1 << 40],
                type_id: 0,
                data: vec![],
            }],
        );
        assert!(bytes.len() <= 128, "{} bytes", bytes.len());
        let msg = open_err(bytes);
        assert!(msg.contains("tensor blk.0.ffn_up_exps.weight: a dimension is 0"), "{msg}");
        // Non-zero but larger than the file.
        let bytes = gguf_bytes(
            &[],
            &[TestTensor {
                name: "blk.0.ffn_up_exps.weight".into(),
                dims: vec![1, 1, 1 << 40],
                type_id: 0,
                data: vec![0; 4],
            }],
        );
        let msg = open_err(bytes);
        assert!(msg.contains("tensor blk.0.ffn_up_exps.weight") && msg.contains("runs past the end"), "{msg}");
        // Overflowing element counts.
        let bytes = gguf_bytes(
            &[],
            &[TestTensor { name: "w".into(), dims: vec![1 << 32, 1 << 32, 2], type_id: 0, data: vec![] }],
        );
        let msg = open_err(bytes);
        assert!(msg.contains("tensor w: dims") && msg.contains("overflow"), "{msg}");
        // More experts than any model has, even though the data is in the file.
        let bytes = gguf_bytes(&[], &[f32_tensor("blk.0.ffn_gate_exps.weight", &[1, 1, 2000], &[0.0; 2000])]);
        let msg = open_err(bytes);
        assert!(msg.contains("tensor blk.0.ffn_gate_exps.weight: 2000 experts"), "{msg}");
        // Too many dimensions.
        let bytes = gguf_bytes(&[], &[f32_tensor("nine", &[1; 9], &[0.0])]);
        assert!(open_err(bytes).contains("tensor nine: 9 dimensions"));
    }

    #[test]
    fn a_tensor_outside_the_data_or_misaligned_is_an_error_naming_it() {
        let mut bytes = gguf_bytes(&[], &[f32_tensor("a", &[4], &[1.0, 2.0, 3.0, 4.0])]);
        // The offset field: the last 8 bytes of the tensor info (after the 24-byte header).
        let info_end = 4 + 4 + 8 + 8 + (8 + 1 + 4 + 8 + 4 + 8);
        bytes[info_end - 8..info_end].copy_from_slice(&u64::MAX.to_le_bytes());
        let msg = open_err(bytes.clone());
        assert!(msg.contains("tensor a (16 bytes at data offset 18446744073709551615) runs past the end"), "{msg}");
        bytes[info_end - 8..info_end].copy_from_slice(&4u64.to_le_bytes());
        bytes.extend([0; 32]);
        let msg = open_err(bytes);
        assert!(msg.contains("tensor a offset 4 is not aligned to 32"), "{msg}");
    }

    #[test]
    fn memory_images_parse_like_files() {
        let bytes = small_file();
        let g = GgufFile::from_bytes("mem.gguf", bytes).unwrap();
        assert_eq!(g.path(), Path::new("mem.gguf"));
        let e1 = WeightSource::get(&g, "model.layers.0.mlp.experts.1.up_proj.weight").unwrap();
        assert_eq!(e1.data, vec![10., 11., 12., 13., 14., 15.]);
    }

    #[test]
    fn bad_alignments_are_errors() {
        // Found by fuzzing (gguf_structured): the test writer itself overflowed on a huge
        // `general.alignment`; the reader must refuse each of these.
        for (value, want) in [
            (GgufValue::U64(0), "is not a power of two"),
            (GgufValue::U64(3), "is not a power of two"),
            (GgufValue::U64(u64::MAX), "is not a power of two"),
            (GgufValue::I32(-32), "is not a power of two"),
            (GgufValue::Str("32".into()), "is not a power of two"),
            (GgufValue::U64(1 << 62), "runs past the end"),
        ] {
            let bytes = gguf_bytes(&[("general.alignment", value.clone())], &[f32_tensor("a", &[2], &[1.0, 2.0])]);
            let msg = open_err(bytes);
            assert!(msg.contains(want), "{value:?}: {msg}");
        }
    }
}
