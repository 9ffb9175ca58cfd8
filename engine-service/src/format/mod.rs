//! Model file formats: files -> metadata and named tensor views (no copies of weights).

pub mod fp8;
pub mod gguf;
pub mod hf_config;
pub mod kquant;
pub mod nvfp4;
pub mod safetensors;
pub mod tensor;
pub mod tiktoken;

pub use gguf::{Gguf, MetaValue, TensorInfo, TensorView};
pub use tensor::{GgmlType, MatrixData, MatrixDesc, SharedBytes, TensorDesc};
