//! Which device runs the model (`--device cpu|cuda[:N]|auto`), and loading it there. `auto`
//! (the default) takes a GPU when the CUDA backend can run the model on it and otherwise the
//! CPU, saying why in one log line; `cuda` insists and fails at start-up with the reason. The
//! CUDA backend runs Llama-family GGUF models; a build without the `cuda` feature, a machine
//! without a driver, NVRTC or a supported GPU, or another model serve on the CPU under `auto`.

use std::str::FromStr;

use engine_cuda::GpuInfo;
use engine_models::tokenizer::ModelTokenizer;

use crate::EngineError;
use crate::backend::Backend;
use crate::backend::cpu::CpuBackend;
use crate::config::EngineConfig;

/// The `--device` setting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DeviceSetting {
    Cpu,
    /// CUDA device with this ordinal.
    Cuda(usize),
    #[default]
    Auto,
}

impl FromStr for DeviceSetting {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "cpu" => Ok(DeviceSetting::Cpu),
            "auto" => Ok(DeviceSetting::Auto),
            "cuda" => Ok(DeviceSetting::Cuda(0)),
            other => other
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(DeviceSetting::Cuda)
                .ok_or_else(|| format!("device {other:?} must be cpu, cuda, cuda:N or auto")),
        }
    }
}

/// The device to try, with what the engine saw.
#[derive(Clone, Debug, PartialEq)]
pub enum DeviceChoice {
    /// The CPU; `why` says why not a GPU when one was looked for.
    Cpu { why: Option<String> },
    /// This GPU; `required`: a failure to load there fails the start (`--device cuda`),
    /// otherwise the CPU serves.
    Cuda { gpu: GpuInfo, required: bool },
}

/// Chooses the device for `setting`, asking the driver which GPUs there are (`probe`, so
/// tests can stand in for hardware).
pub fn choose_with(
    setting: DeviceSetting,
    probe: impl FnOnce(usize) -> Result<GpuInfo, engine_cuda::CudaError>,
) -> Result<DeviceChoice, EngineError> {
    match setting {
        DeviceSetting::Cpu => Ok(DeviceChoice::Cpu { why: None }),
        DeviceSetting::Auto => Ok(match probe(0) {
            Ok(gpu) => DeviceChoice::Cuda { gpu, required: false },
            Err(e) => DeviceChoice::Cpu { why: Some(e.to_string()) },
        }),
        DeviceSetting::Cuda(n) => match probe(n) {
            Ok(gpu) => Ok(DeviceChoice::Cuda { gpu, required: true }),
            Err(e) => Err(EngineError::Unavailable(format!("--device cuda:{n}: {e}; use --device cpu or auto"))),
        },
    }
}

/// [`choose_with`] on this machine's GPUs.
pub fn choose(setting: DeviceSetting) -> Result<DeviceChoice, EngineError> {
    choose_with(setting, engine_cuda::pick)
}

/// A model loaded on its device.
pub struct Served {
    pub backend: Box<dyn Backend>,
    pub tokenizer: ModelTokenizer,
    pub fingerprint: String,
}

/// Loads the configured model on the configured device (see the module doc).
pub fn load(config: &EngineConfig) -> Result<Served, EngineError> {
    let cpu = |why: Option<String>| {
        match &why {
            None => tracing::info!(device = "cpu", "serving on the CPU"),
            Some(why) => tracing::info!(device = "cpu", %why, "serving on the CPU"),
        }
        let loaded =
            CpuBackend::load_with(&config.model, config.threads, config.page_tokens, config.kv_dtype, &config.random)?;
        Ok(Served { backend: Box::new(loaded.backend), tokenizer: loaded.tokenizer, fingerprint: loaded.fingerprint })
    };
    match choose(config.device)? {
        DeviceChoice::Cpu { why } => cpu(why),
        DeviceChoice::Cuda { gpu, required } => match load_cuda(config, gpu.ordinal) {
            Ok(served) => {
                tracing::info!(device = %gpu, "serving on the GPU");
                Ok(served)
            }
            Err(e) if required => Err(EngineError::Unavailable(format!("--device cuda:{}: {e}", gpu.ordinal))),
            Err(e) => cpu(Some(format!("{gpu}: {e}"))),
        },
    }
}

#[cfg(feature = "cuda")]
fn load_cuda(config: &EngineConfig, ordinal: usize) -> Result<Served, EngineError> {
    let loaded = crate::backend::cuda::CudaBackend::load(&config.model, ordinal, config.page_tokens, config.kv_dtype)?;
    Ok(Served { backend: Box::new(loaded.backend), tokenizer: loaded.tokenizer, fingerprint: loaded.fingerprint })
}

#[cfg(not(feature = "cuda"))]
fn load_cuda(_: &EngineConfig, _: usize) -> Result<Served, EngineError> {
    Err(engine_cuda::CudaError::NotBuilt.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine_cuda::{CudaError, SmArch};

    fn h200(_: usize) -> Result<GpuInfo, CudaError> {
        Ok(GpuInfo {
            ordinal: 0,
            name: "NVIDIA H200".into(),
            arch: SmArch::HOPPER,
            memory_bytes: 141 << 30,
            integrated: false,
        })
    }

    #[test]
    fn parses_the_setting() {
        assert_eq!("cpu".parse(), Ok(DeviceSetting::Cpu));
        assert_eq!("auto".parse(), Ok(DeviceSetting::Auto));
        assert_eq!("cuda".parse(), Ok(DeviceSetting::Cuda(0)));
        assert_eq!("cuda:2".parse(), Ok(DeviceSetting::Cuda(2)));
        assert!("gpu".parse::<DeviceSetting>().is_err());
        assert!("cuda:x".parse::<DeviceSetting>().is_err());
    }

    #[test]
    fn auto_takes_a_gpu_and_falls_back_to_the_cpu_with_the_reason() {
        let none = |_| Err(CudaError::NoDriver("libcuda.so is not on this machine (no NVIDIA driver)".into()));
        assert_eq!(
            choose_with(DeviceSetting::Auto, none).unwrap(),
            DeviceChoice::Cpu {
                why: Some("no CUDA driver: libcuda.so is not on this machine (no NVIDIA driver)".into())
            }
        );
        assert_eq!(
            choose_with(DeviceSetting::Auto, h200).unwrap(),
            DeviceChoice::Cuda { gpu: h200(0).unwrap(), required: false }
        );
        assert_eq!(choose_with(DeviceSetting::Cpu, h200).unwrap(), DeviceChoice::Cpu { why: None });
    }

    #[test]
    fn cuda_insists_and_says_why_it_cannot() {
        let e = choose_with(DeviceSetting::Cuda(0), |_| Err(CudaError::NotBuilt)).unwrap_err();
        assert!(matches!(e, EngineError::Unavailable(_)));
        assert!(e.to_string().contains("--features cuda"), "{e}");
        assert_eq!(
            choose_with(DeviceSetting::Cuda(1), h200).unwrap(),
            DeviceChoice::Cuda { gpu: h200(0).unwrap(), required: true }
        );
    }

    #[test]
    fn this_machine_gives_an_answer_without_panicking() {
        // Whatever the machine has (no driver, a GPU, a build without CUDA): a choice or an
        // error value, never a panic inside the CUDA libraries.
        let _ = choose(DeviceSetting::Auto).unwrap();
        let _ = choose(DeviceSetting::Cuda(0));
    }
}
