//! safetensors reader: one file, or a sharded checkpoint directory with
//! `model.safetensors.index.json`.
//!
//! Contract: [`SafeTensors::open`] memory-maps every shard and parses its header (8-byte
//! little-endian length, then a JSON object `name -> {dtype, shape, data_offsets}`), checking
//! that every tensor's byte range lies inside its file, matches `shape x dtype size`, and (for
//! a sharded checkpoint) that the index's weight map agrees with the shards. Tensor bytes are
//! never copied: [`SafeTensors::tensor`] returns a view into the map. Any malformed input is an
//! [`EngineError::ModelFile`] naming the file and, where there is one, the tensor.
//!
//! Cost: parsing touches only the headers; tensor data is paged in lazily by the OS.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use serde_json::Value;

use crate::EngineError;
use crate::format::tensor::{bf16_to_f32, f16_to_f32};

/// Index file name of a sharded checkpoint.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// Single-file checkpoint name inside a directory.
pub const SINGLE_FILE: &str = "model.safetensors";
/// Headers larger than this are refused (real ones are a few MB).
const MAX_HEADER_BYTES: u64 = 256 << 20;

/// Element type of a safetensors tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StDtype {
    F32,
    F16,
    BF16,
    /// Packed FP4 codes (NVFP4 weights) and other byte data.
    U8,
    I8,
    /// FP8 E4M3 (NVFP4 block scales, FP8 KV scales).
    F8E4M3,
    I32,
    I64,
    F64,
    Bool,
}

impl StDtype {
    fn parse(s: &str) -> Option<StDtype> {
        Some(match s {
            "F32" => StDtype::F32,
            "F16" => StDtype::F16,
            "BF16" => StDtype::BF16,
            "U8" => StDtype::U8,
            "I8" => StDtype::I8,
            "F8_E4M3" => StDtype::F8E4M3,
            "I32" => StDtype::I32,
            "I64" => StDtype::I64,
            "F64" => StDtype::F64,
            "BOOL" => StDtype::Bool,
            _ => return None,
        })
    }

    pub fn size(self) -> usize {
        match self {
            StDtype::U8 | StDtype::I8 | StDtype::F8E4M3 | StDtype::Bool => 1,
            StDtype::F16 | StDtype::BF16 => 2,
            StDtype::F32 | StDtype::I32 => 4,
            StDtype::I64 | StDtype::F64 => 8,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, StDtype::F32 | StDtype::F16 | StDtype::BF16)
    }
}

/// Where one tensor lives.
#[derive(Clone, Debug)]
pub struct StTensorInfo {
    pub dtype: StDtype,
    pub shape: Vec<usize>,
    /// Index into the shard list.
    shard: usize,
    /// Absolute byte range within the shard file.
    start: usize,
    end: usize,
}

/// A view of one tensor's bytes.
#[derive(Clone, Copy, Debug)]
pub struct StTensor<'a> {
    pub dtype: StDtype,
    pub shape: &'a [usize],
    pub data: &'a [u8],
}

impl StTensor<'_> {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Converts a float tensor to f32 (`None` for non-float dtypes).
    pub fn to_f32(&self) -> Option<Vec<f32>> {
        let d = self.data;
        Some(match self.dtype {
            StDtype::F32 => d.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
            StDtype::F16 => d.chunks_exact(2).map(|b| f16_to_f32(u16::from_le_bytes([b[0], b[1]]))).collect(),
            StDtype::BF16 => d.chunks_exact(2).map(|b| bf16_to_f32(u16::from_le_bytes([b[0], b[1]]))).collect(),
            _ => return None,
        })
    }
}

struct Shard {
    path: PathBuf,
    map: Mmap,
}

/// Every tensor of a checkpoint, across its shards.
pub struct SafeTensors {
    shards: Vec<Shard>,
    tensors: HashMap<String, StTensorInfo>,
}

impl SafeTensors {
    /// Opens `path`: a `.safetensors` file, or a directory holding `model.safetensors.index.json`
    /// (sharded) or `model.safetensors`.
    pub fn open(path: &Path) -> Result<SafeTensors, EngineError> {
        if !path.is_dir() {
            return SafeTensors::open_files(&[path.to_path_buf()], None);
        }
        let index = path.join(INDEX_FILE);
        if index.is_file() {
            let text = std::fs::read_to_string(&index).map_err(|e| EngineError::model_file(&index, e.to_string()))?;
            let json: Value = serde_json::from_str(&text)
                .map_err(|e| EngineError::model_file(&index, format!("invalid JSON: {e}")))?;
            let map = json
                .get("weight_map")
                .and_then(Value::as_object)
                .ok_or_else(|| EngineError::model_file(&index, "no \"weight_map\" object"))?;
            let mut files: Vec<String> = Vec::new();
            let mut expected: HashMap<String, String> = HashMap::with_capacity(map.len());
            for (name, file) in map {
                let file = file
                    .as_str()
                    .ok_or_else(|| EngineError::model_file(&index, format!("weight_map[{name:?}] is not a string")))?;
                if file.contains('/') || file.contains("..") {
                    return Err(EngineError::model_file(
                        &index,
                        format!("weight_map[{name:?}] = {file:?} leaves the directory"),
                    ));
                }
                if !files.iter().any(|f| f == file) {
                    files.push(file.to_string());
                }
                expected.insert(name.clone(), file.to_string());
            }
            files.sort();
            let paths: Vec<PathBuf> = files.iter().map(|f| path.join(f)).collect();
            return SafeTensors::open_files(&paths, Some((&index, &expected)));
        }
        let single = path.join(SINGLE_FILE);
        if single.is_file() {
            return SafeTensors::open_files(&[single], None);
        }
        Err(EngineError::model_file(path, format!("neither {INDEX_FILE} nor {SINGLE_FILE} found")))
    }

    fn open_files(
        paths: &[PathBuf],
        index: Option<(&Path, &HashMap<String, String>)>,
    ) -> Result<SafeTensors, EngineError> {
        let mut shards = Vec::with_capacity(paths.len());
        let mut tensors = HashMap::new();
        for (si, p) in paths.iter().enumerate() {
            let file = File::open(p).map_err(|e| EngineError::model_file(p, e.to_string()))?;
            // SAFETY: the map is read-only; a checkpoint being rewritten while served is not supported.
            #[allow(unsafe_code)]
            let map = unsafe { Mmap::map(&file) }.map_err(|e| EngineError::model_file(p, format!("mmap: {e}")))?;
            parse_header(p, &map, si, &mut tensors)?;
            shards.push(Shard { path: p.clone(), map });
        }
        if let Some((index_path, expected)) = index {
            for (name, file) in expected {
                let info = tensors.get(name).ok_or_else(|| {
                    EngineError::model_file(index_path, format!("tensor {name}: listed in {file} but not found there"))
                })?;
                let actual = shards[info.shard].path.file_name().and_then(|f| f.to_str()).unwrap_or("");
                if actual != file {
                    return Err(EngineError::model_file(
                        index_path,
                        format!("tensor {name}: index says {file}, found in {actual}"),
                    ));
                }
            }
        }
        Ok(SafeTensors { shards, tensors })
    }

    pub fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    pub fn info(&self, name: &str) -> Option<&StTensorInfo> {
        self.tensors.get(name)
    }

    /// Names of every tensor, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.tensors.keys().map(String::as_str).collect();
        v.sort_unstable();
        v
    }

    /// Paths of the shard files, in the order they were opened.
    pub fn shard_paths(&self) -> impl Iterator<Item = &Path> {
        self.shards.iter().map(|s| s.path.as_path())
    }

    /// Every shard's path and full bytes (for fingerprints).
    pub fn shard_bytes(&self) -> impl Iterator<Item = (&Path, &[u8])> {
        self.shards.iter().map(|s| (s.path.as_path(), &s.map[..]))
    }

    /// The tensor `name`; an error naming the first shard when absent.
    pub fn tensor(&self, name: &str) -> Result<StTensor<'_>, EngineError> {
        let info = self.tensors.get(name).ok_or_else(|| self.error(format!("tensor {name}: not found")))?;
        let shard = &self.shards[info.shard];
        Ok(StTensor { dtype: info.dtype, shape: &info.shape, data: &shard.map[info.start..info.end] })
    }

    /// The tensor `name`, which must have exactly `shape`.
    pub fn tensor_with_shape(&self, name: &str, shape: &[usize]) -> Result<StTensor<'_>, EngineError> {
        let t = self.tensor(name)?;
        if t.shape != shape {
            return Err(self.tensor_error(name, format!("shape mismatch: expected {shape:?}, found {:?}", t.shape)));
        }
        Ok(t)
    }

    /// The shard that holds tensor `name` (the first shard when none does).
    pub fn tensor_path(&self, name: &str) -> PathBuf {
        match self.tensors.get(name) {
            Some(info) => self.shards[info.shard].path.clone(),
            None => self.shards.first().map(|s| s.path.clone()).unwrap_or_default(),
        }
    }

    /// An error about tensor `name`, naming the shard that holds it.
    pub fn tensor_error(&self, name: &str, problem: impl Into<String>) -> EngineError {
        EngineError::model_file(self.tensor_path(name), format!("tensor {name}: {}", problem.into()))
    }

    /// An error about the checkpoint as a whole (names the first shard).
    pub fn error(&self, problem: impl Into<String>) -> EngineError {
        EngineError::model_file(self.shards.first().map(|s| s.path.clone()).unwrap_or_default(), problem)
    }
}

fn parse_header(
    path: &Path,
    bytes: &[u8],
    shard: usize,
    out: &mut HashMap<String, StTensorInfo>,
) -> Result<(), EngineError> {
    let err = |p: String| EngineError::model_file(path, p);
    let len_bytes: [u8; 8] = bytes
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| err("truncated: no 8-byte header length".into()))?;
    let n = u64::from_le_bytes(len_bytes);
    if n > MAX_HEADER_BYTES {
        return Err(err(format!("header length {n} is implausible")));
    }
    let data_start = 8 + n as usize;
    let header = bytes.get(8..data_start).ok_or_else(|| err(format!("truncated: header of {n} bytes")))?;
    let json: Value = serde_json::from_slice(header).map_err(|e| err(format!("header is not JSON: {e}")))?;
    let obj = json.as_object().ok_or_else(|| err("header is not a JSON object".into()))?;
    for (name, v) in obj {
        if name == "__metadata__" {
            continue;
        }
        let terr = |p: &str| err(format!("tensor {name}: {p}"));
        let dtype_s = v.get("dtype").and_then(Value::as_str).ok_or_else(|| terr("no dtype"))?;
        let dtype = StDtype::parse(dtype_s).ok_or_else(|| terr(&format!("unsupported dtype {dtype_s}")))?;
        let shape = v
            .get("shape")
            .and_then(Value::as_array)
            .ok_or_else(|| terr("no shape"))?
            .iter()
            .map(|d| d.as_u64().map(|d| d as usize))
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(|| terr("shape is not a list of non-negative integers"))?;
        let offs = v
            .get("data_offsets")
            .and_then(Value::as_array)
            .filter(|a| a.len() == 2)
            .and_then(|a| Some((a[0].as_u64()? as usize, a[1].as_u64()? as usize)))
            .ok_or_else(|| terr("data_offsets is not [begin, end]"))?;
        let numel =
            shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d)).ok_or_else(|| terr("shape overflows"))?;
        let want = numel.checked_mul(dtype.size()).ok_or_else(|| terr("size overflows"))?;
        if offs.1 < offs.0 || offs.1 - offs.0 != want {
            return Err(terr(&format!(
                "data_offsets {:?} hold {} bytes, shape {shape:?} x {dtype_s} needs {want}",
                offs,
                offs.1.saturating_sub(offs.0)
            )));
        }
        let (start, end) = (data_start + offs.0, data_start + offs.1);
        if end > bytes.len() {
            return Err(terr(&format!("data ends at byte {end}, past the end of the file ({})", bytes.len())));
        }
        if out.insert(name.clone(), StTensorInfo { dtype, shape, shard, start, end }).is_some() {
            return Err(terr("appears in more than one shard"));
        }
    }
    Ok(())
}

/// Writes a single-file safetensors checkpoint (tests and tools): `(name, dtype, shape, bytes)`.
pub fn write_safetensors(path: &Path, tensors: &[(&str, StDtype, Vec<usize>, Vec<u8>)]) -> std::io::Result<()> {
    let mut header = serde_json::Map::new();
    let mut off = 0usize;
    for (name, dtype, shape, data) in tensors {
        let name_s = match dtype {
            StDtype::F32 => "F32",
            StDtype::F16 => "F16",
            StDtype::BF16 => "BF16",
            StDtype::U8 => "U8",
            StDtype::I8 => "I8",
            StDtype::F8E4M3 => "F8_E4M3",
            StDtype::I32 => "I32",
            StDtype::I64 => "I64",
            StDtype::F64 => "F64",
            StDtype::Bool => "BOOL",
        };
        header.insert(
            name.to_string(),
            serde_json::json!({"dtype": name_s, "shape": shape, "data_offsets": [off, off + data.len()]}),
        );
        off += data.len();
    }
    let mut h = Value::Object(header).to_string().into_bytes();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = Vec::with_capacity(8 + h.len() + off);
    out.extend_from_slice(&(h.len() as u64).to_le_bytes());
    out.extend_from_slice(&h);
    for (_, _, _, data) in tensors {
        out.extend_from_slice(data);
    }
    std::fs::write(path, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn reads_single_and_sharded_checkpoints_and_names_bad_tensors() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("model-00001-of-00002.safetensors");
        let b = dir.path().join("model-00002-of-00002.safetensors");
        write_safetensors(&a, &[("x", StDtype::F32, vec![2, 2], f32_bytes(&[1.0, 2.0, 3.0, 4.0]))]).unwrap();
        let bf: Vec<u8> = [1.5f32, -2.0].iter().flat_map(|x| ((x.to_bits() >> 16) as u16).to_le_bytes()).collect();
        write_safetensors(&b, &[("y", StDtype::BF16, vec![2], bf)]).unwrap();
        std::fs::write(
            dir.path().join(INDEX_FILE),
            r#"{"metadata":{},"weight_map":{"x":"model-00001-of-00002.safetensors","y":"model-00002-of-00002.safetensors"}}"#,
        )
        .unwrap();
        let st = SafeTensors::open(dir.path()).unwrap();
        assert_eq!(st.tensor_with_shape("x", &[2, 2]).unwrap().to_f32().unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
        assert_eq!(st.tensor("y").unwrap().to_f32().unwrap(), vec![1.5, -2.0]);
        let e = st.tensor_with_shape("y", &[3]).unwrap_err().to_string();
        assert!(e.contains("model-00002-of-00002.safetensors") && e.contains("tensor y"), "{e}");
        let e = st.tensor("z").unwrap_err().to_string();
        assert!(e.contains("tensor z: not found"), "{e}");

        // Index naming the wrong shard.
        std::fs::write(
            dir.path().join(INDEX_FILE),
            r#"{"weight_map":{"x":"model-00002-of-00002.safetensors","y":"model-00002-of-00002.safetensors"}}"#,
        )
        .unwrap();
        let e = SafeTensors::open(dir.path()).err().unwrap().to_string();
        assert!(e.contains("tensor x"), "{e}");
    }

    #[test]
    fn rejects_truncated_and_inconsistent_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.safetensors");
        write_safetensors(&p, &[("w", StDtype::F32, vec![3], f32_bytes(&[1.0, 2.0, 3.0]))]).unwrap();
        let full = std::fs::read(&p).unwrap();
        std::fs::write(&p, &full[..full.len() - 4]).unwrap();
        let e = SafeTensors::open(&p).err().unwrap().to_string();
        assert!(e.contains("m.safetensors") && e.contains("tensor w") && e.contains("past the end"), "{e}");
        std::fs::write(&p, &full[..5]).unwrap();
        assert!(SafeTensors::open(&p).is_err());
        // Shape says 4 values but the offsets hold 3.
        let h = br#"{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,12]}}"#;
        let mut bytes = (h.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(h);
        bytes.extend_from_slice(&[0u8; 12]);
        std::fs::write(&p, &bytes).unwrap();
        let e = SafeTensors::open(&p).err().unwrap().to_string();
        assert!(e.contains("tensor w") && e.contains("needs 16"), "{e}");
    }
}
