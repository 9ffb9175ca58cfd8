//! Model file formats: files -> metadata and named tensor views (no copies of weights).

pub mod gguf;
pub use engine_ops::{fp8, kquant, tensor};
pub mod hf_config;
pub mod nvfp4;
pub mod safetensors;
pub mod tiktoken;

pub use gguf::{Gguf, MetaValue, TensorInfo, TensorView};
pub use tensor::{GgmlType, MatrixData, MatrixDesc, SharedBytes, TensorDesc};
