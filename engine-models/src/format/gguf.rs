//! GGUF reader (llama.cpp's model files, versions 2 and 3, little-endian).
//!
//! Contract: [`Gguf::open`] memory-maps the file and parses the header, every metadata
//! value (all scalar types, strings, arrays nested to any sane depth) and every tensor info,
//! then checks that each tensor's data lies inside the file. Tensor bytes are never copied:
//! [`Gguf::tensor`] returns a view into the map. Any malformed input (truncation, bad magic,
//! unsupported version, unknown tensor type, data out of bounds, a tensor whose shape is not
//! the one the model expects) is an [`EngineError::ModelFile`] naming the file and the
//! problem; parsing uses checked arithmetic and never indexes past a slice.
//!
//! Cost: parsing touches only the header region (a few MB for a 49K-token vocabulary);
//! tensor data is paged in lazily by the OS.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use std::borrow::Cow;

use super::tensor::{GgmlType, MatrixData, MatrixDesc, SharedBytes, TensorDesc};
use crate::EngineError;
use std::sync::Arc;

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
/// Deeper nesting than this is not produced by any writer; refusing it bounds recursion.
const MAX_ARRAY_DEPTH: usize = 8;
/// llama.cpp's limit; a larger tensor rank means a corrupt file.
const MAX_DIMS: u32 = 4;

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    Str(String),
    Array(Vec<MetaValue>),
}

impl MetaValue {
    fn type_name(&self) -> &'static str {
        match self {
            MetaValue::U8(_) => "u8",
            MetaValue::I8(_) => "i8",
            MetaValue::U16(_) => "u16",
            MetaValue::I16(_) => "i16",
            MetaValue::U32(_) => "u32",
            MetaValue::I32(_) => "i32",
            MetaValue::U64(_) => "u64",
            MetaValue::I64(_) => "i64",
            MetaValue::F32(_) => "f32",
            MetaValue::F64(_) => "f64",
            MetaValue::Bool(_) => "bool",
            MetaValue::Str(_) => "string",
            MetaValue::Array(_) => "array",
        }
    }

    /// Any integer type, if the value is a non-negative integer that fits in u64.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::U64(v) => Some(v),
            MetaValue::I8(v) => u64::try_from(v).ok(),
            MetaValue::I16(v) => u64::try_from(v).ok(),
            MetaValue::I32(v) => u64::try_from(v).ok(),
            MetaValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer type, if it fits in i64.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            MetaValue::I8(v) => Some(v.into()),
            MetaValue::I16(v) => Some(v.into()),
            MetaValue::I32(v) => Some(v.into()),
            MetaValue::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    /// f32 or f64 (narrowed).
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            MetaValue::F32(v) => Some(v),
            MetaValue::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::Str(s) => Some(s),
            _ => None,
        }
    }
}

/// Where one tensor lives in the file and what it holds.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// GGUF order: `dims[0]` is the contiguous (innermost) dimension.
    pub dims: Vec<u64>,
    pub dtype: GgmlType,
    /// Absolute byte offset of the data in the file.
    pub offset: usize,
    pub size_bytes: usize,
}

/// A tensor's bytes inside the map, with its type and shape.
#[derive(Clone, Copy, Debug)]
pub struct TensorView<'a> {
    pub name: &'a str,
    pub dtype: GgmlType,
    pub dims: &'a [u64],
    pub data: &'a [u8],
}

/// A parsed, memory-mapped GGUF file.
pub struct Gguf {
    path: PathBuf,
    mmap: Mmap,
    version: u32,
    alignment: u64,
    data_offset: usize,
    metadata: HashMap<String, MetaValue>,
    /// Keys in file order (for listing).
    metadata_keys: Vec<String>,
    tensors: HashMap<String, TensorInfo>,
    tensor_names: Vec<String>,
}

impl std::fmt::Debug for Gguf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gguf")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata", &self.metadata_keys.len())
            .field("tensors", &self.tensor_names.len())
            .finish()
    }
}

impl Gguf {
    /// Maps and parses `path`. See the module contract for what is checked.
    pub fn open(path: &Path) -> Result<Gguf, EngineError> {
        let err = |p: String| EngineError::model_file(path, p);
        let file = File::open(path).map_err(|e| err(format!("cannot open: {e}")))?;
        // SAFETY: the map is read-only; a model file being rewritten while mapped is outside
        // the contract (deploy scripts replace files by rename, which keeps this inode intact).
        #[allow(unsafe_code)]
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| err(format!("cannot map: {e}")))?;
        Self::parse(path.to_path_buf(), mmap)
    }

    fn parse(path: PathBuf, mmap: Mmap) -> Result<Gguf, EngineError> {
        let parsed = parse_layout(&mmap);
        let layout = parsed.map_err(|problem| EngineError::model_file(&path, problem))?;
        Ok(Gguf {
            path,
            mmap,
            version: layout.version,
            alignment: layout.alignment,
            data_offset: layout.data_offset,
            metadata: layout.metadata,
            metadata_keys: layout.metadata_keys,
            tensors: layout.tensors,
            tensor_names: layout.tensor_names,
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

    /// Absolute offset of the tensor data section.
    pub fn data_offset(&self) -> usize {
        self.data_offset
    }

    /// The whole file (for fingerprinting).
    pub fn bytes(&self) -> &[u8] {
        &self.mmap
    }

    /// An error about this file.
    pub fn error(&self, problem: impl Into<String>) -> EngineError {
        EngineError::model_file(&self.path, problem)
    }

    pub fn metadata_keys(&self) -> &[String] {
        &self.metadata_keys
    }

    pub fn value(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.get(key)
    }

    fn required(&self, key: &str) -> Result<&MetaValue, EngineError> {
        self.value(key).ok_or_else(|| self.error(format!("missing metadata key {key}")))
    }

    fn wrong_type(&self, key: &str, want: &str, got: &MetaValue) -> EngineError {
        self.error(format!("metadata key {key}: expected {want}, found {}", got.type_name()))
    }

    /// An unsigned integer of any stored width that fits in u64.
    pub fn get_u64(&self, key: &str) -> Result<u64, EngineError> {
        let v = self.required(key)?;
        v.as_u64().ok_or_else(|| self.wrong_type(key, "unsigned integer", v))
    }

    pub fn get_u32(&self, key: &str) -> Result<u32, EngineError> {
        let v = self.get_u64(key)?;
        u32::try_from(v).map_err(|_| self.error(format!("metadata key {key}: {v} exceeds u32")))
    }

    /// Like [`Gguf::get_u64`] converted to usize.
    pub fn get_usize(&self, key: &str) -> Result<usize, EngineError> {
        let v = self.get_u64(key)?;
        usize::try_from(v).map_err(|_| self.error(format!("metadata key {key}: {v} too large")))
    }

    pub fn get_f32(&self, key: &str) -> Result<f32, EngineError> {
        let v = self.required(key)?;
        v.as_f32().ok_or_else(|| self.wrong_type(key, "float", v))
    }

    pub fn get_bool(&self, key: &str) -> Result<bool, EngineError> {
        match self.required(key)? {
            MetaValue::Bool(b) => Ok(*b),
            v => Err(self.wrong_type(key, "bool", v)),
        }
    }

    pub fn get_str(&self, key: &str) -> Result<&str, EngineError> {
        let v = self.required(key)?;
        v.as_str().ok_or_else(|| self.wrong_type(key, "string", v))
    }

    fn get_array(&self, key: &str) -> Result<&[MetaValue], EngineError> {
        match self.required(key)? {
            MetaValue::Array(a) => Ok(a),
            v => Err(self.wrong_type(key, "array", v)),
        }
    }

    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>, EngineError> {
        self.get_array(key)?
            .iter()
            .enumerate()
            .map(|(i, v)| v.as_str().ok_or_else(|| self.wrong_type(&format!("{key}[{i}]"), "string", v)))
            .collect()
    }

    pub fn get_i64_array(&self, key: &str) -> Result<Vec<i64>, EngineError> {
        self.get_array(key)?
            .iter()
            .enumerate()
            .map(|(i, v)| v.as_i64().ok_or_else(|| self.wrong_type(&format!("{key}[{i}]"), "integer", v)))
            .collect()
    }

    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>, EngineError> {
        self.get_array(key)?
            .iter()
            .enumerate()
            .map(|(i, v)| v.as_f32().ok_or_else(|| self.wrong_type(&format!("{key}[{i}]"), "float", v)))
            .collect()
    }

    /// `Ok(None)` when the key is absent; an error when present with the wrong type.
    pub fn opt_u32(&self, key: &str) -> Result<Option<u32>, EngineError> {
        self.value(key).map(|_| self.get_u32(key)).transpose()
    }

    pub fn opt_f32(&self, key: &str) -> Result<Option<f32>, EngineError> {
        self.value(key).map(|_| self.get_f32(key)).transpose()
    }

    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>, EngineError> {
        self.value(key).map(|_| self.get_bool(key)).transpose()
    }

    pub fn opt_str(&self, key: &str) -> Result<Option<&str>, EngineError> {
        self.value(key).map(|_| self.get_str(key)).transpose()
    }

    /// Tensor names in file order.
    pub fn tensor_names(&self) -> &[String] {
        &self.tensor_names
    }

    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.get(name)
    }

    /// The named tensor; an error when absent.
    pub fn tensor(&self, name: &str) -> Result<TensorView<'_>, EngineError> {
        let info = self.tensors.get(name).ok_or_else(|| self.error(format!("missing tensor {name}")))?;
        let end = info.offset + info.size_bytes; // checked in parse_layout
        let data =
            self.mmap.get(info.offset..end).ok_or_else(|| self.error(format!("tensor {name}: data out of bounds")))?;
        Ok(TensorView { name: &info.name, dtype: info.dtype, dims: &info.dims, data })
    }

    /// The named tensor, checked to have exactly `dims` (GGUF order, innermost first).
    pub fn tensor_with_shape(&self, name: &str, dims: &[u64]) -> Result<TensorView<'_>, EngineError> {
        let t = self.tensor(name)?;
        if t.dims != dims {
            return Err(self.error(format!("tensor {name}: shape mismatch: expected {dims:?}, found {:?}", t.dims)));
        }
        Ok(t)
    }

    /// Whether a tensor exists.
    pub fn has_tensor(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// The named 2-D tensor as a backend builds weights from it: checked to have `cols`
    /// contiguous values per row and `rows` rows (GGUF dims `[cols, rows]`).
    pub fn tensor_desc(self: &Arc<Self>, name: &str, cols: usize, rows: usize) -> Result<TensorDesc, EngineError> {
        self.desc(name, &[cols as u64, rows as u64], rows, cols)
    }

    /// The named `[rows, cols]` matrix (GGUF dims `[cols, rows]`), its bytes borrowed from the map.
    pub fn matrix_desc(&self, name: &str, cols: usize, rows: usize) -> Result<MatrixDesc<'_>, EngineError> {
        let t = self.tensor_with_shape(name, &[cols as u64, rows as u64])?;
        Ok(MatrixDesc {
            name: name.to_string(),
            file: Some(self.path.clone()),
            rows,
            cols,
            data: MatrixData::Ggml { dtype: t.dtype, bytes: Cow::Borrowed(t.data) },
        })
    }

    /// The named 1-D tensor of `len` values, as a one-row [`TensorDesc`].
    pub fn vector_desc(self: &Arc<Self>, name: &str, len: usize) -> Result<TensorDesc, EngineError> {
        self.desc(name, &[len as u64], 1, len)
    }

    fn desc(self: &Arc<Self>, name: &str, dims: &[u64], rows: usize, cols: usize) -> Result<TensorDesc, EngineError> {
        let t = self.tensor_with_shape(name, dims)?;
        let info = &self.tensors[name];
        let owner: Arc<dyn AsRef<[u8]> + Send + Sync> = self.clone();
        let bytes = SharedBytes::new(owner, info.offset..info.offset + t.data.len())
            .ok_or_else(|| self.error(format!("tensor {name}: data out of bounds")))?;
        Ok(TensorDesc { name: name.to_string(), file: self.path.clone(), dtype: t.dtype, rows, cols, bytes })
    }
}

impl AsRef<[u8]> for Gguf {
    fn as_ref(&self) -> &[u8] {
        &self.mmap
    }
}

struct Layout {
    version: u32,
    alignment: u64,
    data_offset: usize,
    metadata: HashMap<String, MetaValue>,
    metadata_keys: Vec<String>,
    tensors: HashMap<String, TensorInfo>,
    tensor_names: Vec<String>,
}

/// Bounds-checked little-endian cursor; every read reports what it was reading on failure.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len()).ok_or_else(|| {
            format!("truncated: {what} at offset {} needs {n} bytes, file has {}", self.pos, self.buf.len())
        })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], String> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u8(&mut self, what: &str) -> Result<u8, String> {
        Ok(self.array::<1>(what)?[0])
    }
    fn u16(&mut self, what: &str) -> Result<u16, String> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }
    fn u32(&mut self, what: &str) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    fn u64(&mut self, what: &str) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count that must fit in memory; also bounded by the bytes left, since every element
    /// takes at least `min_elem_bytes`.
    fn count(&mut self, what: &str, min_elem_bytes: usize) -> Result<usize, String> {
        let n = self.u64(what)?;
        let left = self.buf.len().saturating_sub(self.pos);
        usize::try_from(n)
            .ok()
            .filter(|&n| n.saturating_mul(min_elem_bytes) <= left)
            .ok_or_else(|| format!("truncated or corrupt: {what} {n} exceeds the remaining {left} bytes"))
    }

    fn string(&mut self, what: &str) -> Result<String, String> {
        let len = self.count(what, 1)?;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| format!("corrupt: {what} is not valid UTF-8"))
    }
}

fn parse_layout(buf: &[u8]) -> Result<Layout, String> {
    let mut c = Cursor { buf, pos: 0 };
    let magic = c.take(4, "magic")?;
    if magic != MAGIC {
        return Err(format!("bad magic {magic:02x?}: not a GGUF file (expected \"GGUF\")"));
    }
    let version = c.u32("version")?;
    if version != 2 && version != 3 {
        return Err(format!("unsupported GGUF version {version} (supported: 2, 3)"));
    }
    // Minimum encoded sizes bound the counts: a tensor info is >= 8+4+4+8 bytes, a KV >= 8+4+1.
    let n_tensors = c.count("tensor count", 24)?;
    let n_kv = c.count("metadata count", 13)?;

    let mut metadata = HashMap::with_capacity(n_kv);
    let mut metadata_keys = Vec::with_capacity(n_kv);
    for i in 0..n_kv {
        let key = c.string(&format!("metadata key #{i}"))?;
        let ty = c.u32(&format!("type of metadata {key}"))?;
        let value = read_value(&mut c, ty, &key, 0)?;
        if metadata.insert(key.clone(), value).is_some() {
            return Err(format!("corrupt: duplicate metadata key {key}"));
        }
        metadata_keys.push(key);
    }

    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => match v.as_u64() {
            Some(a) if a > 0 && a.is_power_of_two() => a,
            _ => return Err(format!("general.alignment must be a power of two, found {v:?}")),
        },
    };

    let mut raw = Vec::with_capacity(n_tensors);
    for i in 0..n_tensors {
        let name = c.string(&format!("tensor name #{i}"))?;
        let n_dims = c.u32(&format!("rank of tensor {name}"))?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(format!("tensor {name}: unsupported rank {n_dims}"));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for d in 0..n_dims {
            dims.push(c.u64(&format!("dim {d} of tensor {name}"))?);
        }
        let type_id = c.u32(&format!("type of tensor {name}"))?;
        let dtype = GgmlType::from_ggml_id(type_id).ok_or_else(|| match ggml_type_name(type_id) {
            Some(known) => format!(
                "tensor {name}: type {known} (ggml type {type_id}) is not supported \
                 (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1)"
            ),
            None => format!("tensor {name}: unknown or unsupported tensor type id {type_id}"),
        })?;
        let rel_offset = c.u64(&format!("offset of tensor {name}"))?;
        raw.push((name, dims, dtype, rel_offset));
    }

    let data_offset = align_up(c.pos as u64, alignment)
        .and_then(|o| usize::try_from(o).ok())
        .ok_or("corrupt: data offset overflows")?;
    if data_offset > buf.len() {
        // A file without tensors (llama.cpp's vocab-only files) may end unpadded.
        if !raw.is_empty() {
            return Err(format!("truncated: tensor data starts at {data_offset}, file has {} bytes", buf.len()));
        }
    }
    let data_offset = data_offset.min(buf.len());

    let mut tensors = HashMap::with_capacity(raw.len());
    let mut tensor_names = Vec::with_capacity(raw.len());
    for (name, dims, dtype, rel_offset) in raw {
        if rel_offset % alignment != 0 {
            return Err(format!("tensor {name}: offset {rel_offset} is not aligned to {alignment}"));
        }
        let size_bytes = tensor_bytes(dtype, &dims).ok_or_else(|| {
            format!("tensor {name}: shape {dims:?} is invalid for type {dtype:?} (row not a whole number of blocks, or too large)")
        })?;
        let offset = usize::try_from(rel_offset)
            .ok()
            .and_then(|r| r.checked_add(data_offset))
            .ok_or_else(|| format!("tensor {name}: offset {rel_offset} overflows"))?;
        let end = offset.checked_add(size_bytes);
        if end.is_none_or(|e| e > buf.len()) {
            return Err(format!(
                "tensor {name}: data out of bounds ({size_bytes} bytes at offset {offset}, file has {} bytes)",
                buf.len()
            ));
        }
        let info = TensorInfo { name: name.clone(), dims, dtype, offset, size_bytes };
        if tensors.insert(name.clone(), info).is_some() {
            return Err(format!("corrupt: duplicate tensor {name}"));
        }
        tensor_names.push(name);
    }

    Ok(Layout { version, alignment, data_offset, metadata, metadata_keys, tensors, tensor_names })
}

/// ggml's name of a tensor type id (`ggml.h`), for errors about types the kernels lack.
fn ggml_type_name(id: u32) -> Option<&'static str> {
    // 4, 5 and 31-33, 36-38 are ids of types ggml has since removed.
    const NAMES: [&str; 43] = [
        "F32",
        "F16",
        "Q4_0",
        "Q4_1",
        "Q4_2",
        "Q4_3",
        "Q5_0",
        "Q5_1",
        "Q8_0",
        "Q8_1",
        "Q2_K",
        "Q3_K",
        "Q4_K",
        "Q5_K",
        "Q6_K",
        "Q8_K",
        "IQ2_XXS",
        "IQ2_XS",
        "IQ3_XXS",
        "IQ1_S",
        "IQ4_NL",
        "IQ3_S",
        "IQ2_S",
        "IQ4_XS",
        "I8",
        "I16",
        "I32",
        "I64",
        "F64",
        "IQ1_M",
        "BF16",
        "Q4_0_4_4",
        "Q4_0_4_8",
        "Q4_0_8_8",
        "TQ1_0",
        "TQ2_0",
        "IQ4_NL_4_4",
        "IQ4_NL_4_8",
        "IQ4_NL_8_8",
        "MXFP4",
        "NVFP4",
        "Q1_0",
        "Q2_0",
    ];
    NAMES.get(id as usize).copied()
}

fn read_value(c: &mut Cursor<'_>, ty: u32, key: &str, depth: usize) -> Result<MetaValue, String> {
    Ok(match ty {
        0 => MetaValue::U8(c.u8(key)?),
        1 => MetaValue::I8(c.u8(key)? as i8),
        2 => MetaValue::U16(c.u16(key)?),
        3 => MetaValue::I16(c.u16(key)? as i16),
        4 => MetaValue::U32(c.u32(key)?),
        5 => MetaValue::I32(c.u32(key)? as i32),
        6 => MetaValue::F32(f32::from_bits(c.u32(key)?)),
        7 => match c.u8(key)? {
            0 => MetaValue::Bool(false),
            1 => MetaValue::Bool(true),
            b => return Err(format!("corrupt: metadata {key}: bool byte {b}")),
        },
        8 => MetaValue::Str(c.string(key)?),
        9 => {
            if depth >= MAX_ARRAY_DEPTH {
                return Err(format!("corrupt: metadata {key}: arrays nested deeper than {MAX_ARRAY_DEPTH}"));
            }
            let elem_ty = c.u32(key)?;
            let min = value_min_bytes(elem_ty)
                .ok_or_else(|| format!("corrupt: metadata {key}: unknown array element type {elem_ty}"))?;
            let n = c.count(&format!("length of array {key}"), min)?;
            let mut items = Vec::with_capacity(n);
            for _ in 0..n {
                items.push(read_value(c, elem_ty, key, depth + 1)?);
            }
            MetaValue::Array(items)
        }
        10 => MetaValue::U64(c.u64(key)?),
        11 => MetaValue::I64(c.u64(key)? as i64),
        12 => MetaValue::F64(f64::from_bits(c.u64(key)?)),
        other => return Err(format!("corrupt: metadata {key}: unknown value type {other}")),
    })
}

/// Smallest encoding of one value of a type (to bound array lengths before allocating).
fn value_min_bytes(ty: u32) -> Option<usize> {
    Some(match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10..=12 => 8,
        9 => 12,
        _ => return None,
    })
}

fn align_up(x: u64, a: u64) -> Option<u64> {
    x.checked_add(a - 1).map(|v| v / a * a)
}

fn tensor_bytes(dtype: GgmlType, dims: &[u64]) -> Option<usize> {
    let (&cols, rest) = dims.split_first()?;
    let row = dtype.row_bytes(usize::try_from(cols).ok()?)?;
    rest.iter().try_fold(row, |acc, &d| acc.checked_mul(usize::try_from(d).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes a GGUF v3 file from metadata values and (name, dims, type id, data) tensors.
    pub(crate) struct Writer {
        pub version: u32,
        pub kvs: Vec<(String, u32, Vec<u8>)>,
        pub tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
    }

    fn str_bytes(s: &str) -> Vec<u8> {
        let mut b = (s.len() as u64).to_le_bytes().to_vec();
        b.extend_from_slice(s.as_bytes());
        b
    }

    impl Writer {
        fn new() -> Self {
            Writer { version: 3, kvs: Vec::new(), tensors: Vec::new() }
        }
        fn kv_u32(mut self, k: &str, v: u32) -> Self {
            self.kvs.push((k.into(), 4, v.to_le_bytes().to_vec()));
            self
        }
        fn kv_str(mut self, k: &str, v: &str) -> Self {
            self.kvs.push((k.into(), 8, str_bytes(v)));
            self
        }
        fn kv_raw(mut self, k: &str, ty: u32, bytes: Vec<u8>) -> Self {
            self.kvs.push((k.into(), ty, bytes));
            self
        }
        fn tensor(mut self, name: &str, dims: &[u64], ty: u32, data: Vec<u8>) -> Self {
            self.tensors.push((name.into(), dims.to_vec(), ty, data));
            self
        }
        fn build(&self) -> Vec<u8> {
            let mut b = b"GGUF".to_vec();
            b.extend(self.version.to_le_bytes());
            b.extend((self.tensors.len() as u64).to_le_bytes());
            b.extend((self.kvs.len() as u64).to_le_bytes());
            for (k, ty, v) in &self.kvs {
                b.extend(str_bytes(k));
                b.extend(ty.to_le_bytes());
                b.extend(v);
            }
            let mut offset = 0u64;
            for (name, dims, ty, data) in &self.tensors {
                b.extend(str_bytes(name));
                b.extend((dims.len() as u32).to_le_bytes());
                for d in dims {
                    b.extend(d.to_le_bytes());
                }
                b.extend(ty.to_le_bytes());
                b.extend(offset.to_le_bytes());
                offset += (data.len() as u64).div_ceil(32) * 32;
            }
            b.resize(b.len().div_ceil(32) * 32, 0);
            for (_, _, _, data) in &self.tensors {
                b.extend(data);
                b.resize(b.len().div_ceil(32) * 32, 0);
            }
            b
        }
    }

    fn small() -> Writer {
        let f32s: Vec<u8> = (0..6).flat_map(|i| (i as f32).to_le_bytes()).collect();
        Writer::new()
            .kv_str("general.architecture", "llama")
            .kv_u32("llama.block_count", 2)
            .kv_raw("tokenizer.ggml.tokens", 9, {
                let mut v = 8u32.to_le_bytes().to_vec();
                v.extend(2u64.to_le_bytes());
                v.extend(str_bytes("a"));
                v.extend(str_bytes("b"));
                v
            })
            .kv_raw("nested", 9, {
                // array of 2 arrays of u32
                let mut v = 9u32.to_le_bytes().to_vec();
                v.extend(2u64.to_le_bytes());
                for k in 0..2u32 {
                    v.extend(4u32.to_le_bytes());
                    v.extend(1u64.to_le_bytes());
                    v.extend(k.to_le_bytes());
                }
                v
            })
            .tensor("w", &[3, 2], 0, f32s)
    }

    fn open_bytes(bytes: &[u8]) -> Result<Gguf, EngineError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        std::fs::write(&path, bytes).unwrap();
        Gguf::open(&path)
    }

    fn err_text(bytes: &[u8]) -> String {
        let e = open_bytes(bytes).expect_err("parse must fail");
        assert!(matches!(e, EngineError::ModelFile { .. }), "{e:?}");
        let text = e.to_string();
        assert!(text.contains("m.gguf"), "error names the file: {text}");
        text
    }

    #[test]
    fn reads_metadata_nested_arrays_and_tensor_views() {
        let g = open_bytes(&small().build()).unwrap();
        assert_eq!(g.version(), 3);
        assert_eq!(g.get_str("general.architecture").unwrap(), "llama");
        assert_eq!(g.get_u32("llama.block_count").unwrap(), 2);
        assert_eq!(g.get_str_array("tokenizer.ggml.tokens").unwrap(), vec!["a", "b"]);
        assert_eq!(
            g.value("nested").unwrap(),
            &MetaValue::Array(vec![
                MetaValue::Array(vec![MetaValue::U32(0)]),
                MetaValue::Array(vec![MetaValue::U32(1)])
            ])
        );
        let t = g.tensor_with_shape("w", &[3, 2]).unwrap();
        assert_eq!(t.dtype, GgmlType::F32);
        assert_eq!(t.data.len(), 24);
        assert_eq!(f32::from_le_bytes(t.data[20..24].try_into().unwrap()), 5.0);
        assert_eq!(g.opt_u32("absent").unwrap(), None);
    }

    #[test]
    fn wrong_metadata_type_and_missing_key_are_errors() {
        let g = open_bytes(&small().build()).unwrap();
        let e = g.get_u32("general.architecture").unwrap_err().to_string();
        assert!(e.contains("expected unsigned integer, found string"), "{e}");
        let e = g.get_f32("nope").unwrap_err().to_string();
        assert!(e.contains("missing metadata key nope"), "{e}");
    }

    #[test]
    fn shape_mismatch_names_tensor_and_shapes() {
        let g = open_bytes(&small().build()).unwrap();
        let e = g.tensor_with_shape("w", &[2, 3]).unwrap_err().to_string();
        assert!(e.contains("tensor w: shape mismatch: expected [2, 3], found [3, 2]"), "{e}");
        let e = g.tensor("missing").unwrap_err().to_string();
        assert!(e.contains("missing tensor missing"), "{e}");
    }

    #[test]
    fn bad_magic_is_rejected() {
        let mut b = small().build();
        b[0] = b'X';
        assert!(err_text(&b).contains("bad magic"));
    }

    #[test]
    fn unsupported_version_is_rejected() {
        let mut w = small();
        w.version = 7;
        assert!(err_text(&w.build()).contains("unsupported GGUF version 7"));
    }

    #[test]
    fn version_2_is_accepted() {
        let mut w = small();
        w.version = 2;
        assert_eq!(open_bytes(&w.build()).unwrap().version(), 2);
    }

    #[test]
    fn unknown_tensor_type_is_rejected() {
        let w = small().tensor("odd", &[32], 999, vec![0; 32]);
        assert!(err_text(&w.build()).contains("tensor odd: unknown or unsupported tensor type id 999"));
    }

    #[test]
    fn file_without_tensors_may_end_unpadded() {
        // llama.cpp's vocab-only files (e.g. models/ggml-vocab-qwen35.gguf) end after the metadata.
        let b = Writer::new().kv_str("general.architecture", "qwen35").build();
        // magic, version, counts, key (len + 20 bytes), type, value (len + 6 bytes); no padding.
        let header_end = 4 + 4 + 8 + 8 + (8 + 20) + 4 + (8 + 6);
        assert!(b.len() > header_end, "the writer pads");
        let g = open_bytes(&b[..header_end]).unwrap();
        assert_eq!(g.get_str("general.architecture").unwrap(), "qwen35");
        assert!(g.tensor_names().is_empty());
    }

    #[test]
    fn known_but_unsupported_tensor_type_is_named() {
        let w = small().tensor("blk.0.ffn_down.weight", &[256], 11, vec![0; 110]);
        let e = err_text(&w.build());
        assert!(e.contains("tensor blk.0.ffn_down.weight: type Q3_K (ggml type 11) is not supported"), "{e}");
    }

    #[test]
    fn tensor_data_out_of_bounds_is_rejected() {
        let mut b = small().build();
        // Drop the tail of the data section: the header still parses, the tensor does not fit.
        b.truncate(b.len() - 32);
        let e = err_text(&b);
        assert!(e.contains("tensor w: data out of bounds") || e.contains("truncated"), "{e}");
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        let b = small().build();
        let half = err_text(&b[..b.len() / 2]);
        assert!(half.contains("truncated") || half.contains("exceeds"), "{half}");
        // The last 8 bytes are padding after the 24-byte tensor: cutting them is harmless.
        assert!(parse_layout(&b[..b.len() - 8]).is_ok());
        for len in 0..b.len() - 8 {
            let text = parse_layout(&b[..len]).err().expect("parse must fail");
            assert!(
                text.contains("truncated") || text.contains("out of bounds") || text.contains("exceeds"),
                "len {len}: {text}"
            );
        }
    }

    #[test]
    fn huge_counts_do_not_allocate() {
        let mut b = small().build();
        // tensor count at offset 8: claim 2^62 tensors.
        b[8..16].copy_from_slice(&(1u64 << 62).to_le_bytes());
        assert!(err_text(&b).contains("tensor count"));
    }

    #[test]
    fn corrupt_bytes_never_panic() {
        // Deterministic byte flips over the header region.
        let base = small().build();
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2000 {
            let mut b = base.clone();
            for _ in 0..3 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let i = (state as usize) % 200.min(b.len());
                b[i] = (state >> 32) as u8;
            }
            let _ = parse_layout(&b);
        }
    }

    #[test]
    fn bad_alignment_is_rejected() {
        let w = small().kv_u32("general.alignment", 24);
        assert!(err_text(&w.build()).contains("general.alignment must be a power of two"));
    }
}
