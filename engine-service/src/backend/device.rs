//! Which device runs the model (`--device cpu|cuda[:N]|auto`). `auto` (the default) takes a
//! GPU when the CUDA backend can run the model on it and otherwise the CPU, saying why in one
//! log line; `cuda` insists and fails at start-up with the reason. The CUDA backend does not
//! run models yet (its kernels compile and load; the ops over them come next), so today a
//! found GPU is reported and the CPU serves.

use std::str::FromStr;

use engine_cuda::GpuInfo;

use crate::EngineError;

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

/// The device chosen, with what the engine saw.
#[derive(Clone, Debug, PartialEq)]
pub enum DeviceChoice {
    /// The CPU; `why` says why not a GPU when one was considered.
    Cpu { why: Option<String> },
}

/// Whether the CUDA backend runs models (it will, once its ops land).
const CUDA_RUNS_MODELS: bool = false;

/// Chooses the device for `setting`, asking the driver which GPUs there are (`probe`, so
/// tests can stand in for hardware).
pub fn choose_with(
    setting: DeviceSetting,
    probe: impl FnOnce(usize) -> Result<GpuInfo, engine_cuda::CudaError>,
) -> Result<DeviceChoice, EngineError> {
    let not_yet = |gpu: &GpuInfo| format!("{gpu} found, but the CUDA backend does not run models yet");
    match setting {
        DeviceSetting::Cpu => Ok(DeviceChoice::Cpu { why: None }),
        DeviceSetting::Auto => Ok(DeviceChoice::Cpu {
            why: Some(match probe(0) {
                Ok(gpu) if !CUDA_RUNS_MODELS => not_yet(&gpu),
                Ok(gpu) => format!("{gpu}: unexpected"),
                Err(e) => e.to_string(),
            }),
        }),
        DeviceSetting::Cuda(n) => match probe(n) {
            Ok(gpu) => {
                Err(EngineError::Unavailable(format!("--device cuda:{n}: {}; use --device cpu or auto", not_yet(&gpu))))
            }
            Err(e) => Err(EngineError::Unavailable(format!("--device cuda:{n}: {e}; use --device cpu or auto"))),
        },
    }
}

/// [`choose_with`] on this machine's GPUs.
pub fn choose(setting: DeviceSetting) -> Result<DeviceChoice, EngineError> {
    choose_with(setting, engine_cuda::pick)
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
    fn auto_falls_back_to_the_cpu_with_the_reason() {
        let none = |_| Err(CudaError::NoDriver("libcuda.so is not on this machine (no NVIDIA driver)".into()));
        assert_eq!(
            choose_with(DeviceSetting::Auto, none).unwrap(),
            DeviceChoice::Cpu {
                why: Some("no CUDA driver: libcuda.so is not on this machine (no NVIDIA driver)".into())
            }
        );
        let DeviceChoice::Cpu { why } = choose_with(DeviceSetting::Auto, h200).unwrap();
        assert!(why.unwrap().contains("NVIDIA H200"));
        assert_eq!(choose_with(DeviceSetting::Cpu, h200).unwrap(), DeviceChoice::Cpu { why: None });
    }

    #[test]
    fn cuda_insists_and_says_why_it_cannot() {
        let e = choose_with(DeviceSetting::Cuda(0), |_| Err(CudaError::NotBuilt)).unwrap_err();
        assert!(matches!(e, EngineError::Unavailable(_)));
        assert!(e.to_string().contains("--features cuda"), "{e}");
        let e = choose_with(DeviceSetting::Cuda(1), h200).unwrap_err();
        assert!(e.to_string().contains("cuda:1") && e.to_string().contains("does not run models yet"), "{e}");
    }

    #[test]
    fn this_machine_gives_an_answer_without_panicking() {
        // Whatever the machine has (no driver, a GPU, a build without CUDA): a choice or an
        // error value, never a panic inside the CUDA libraries.
        let _ = choose(DeviceSetting::Auto).unwrap();
        let _ = choose(DeviceSetting::Cuda(0));
    }
}
