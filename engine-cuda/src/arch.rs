//! GPU architectures and the exact NVRTC target each is compiled for.

use std::fmt;

/// A device's compute capability.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SmArch {
    pub major: u32,
    pub minor: u32,
}

impl SmArch {
    /// H100 / H200.
    pub const HOPPER: SmArch = SmArch { major: 9, minor: 0 };
    /// Jetson AGX Thor (CUDA 13 calls it sm_110; CUDA 12.8-12.9 called it sm_101).
    pub const THOR: SmArch = SmArch { major: 11, minor: 0 };
    /// What CI compiles every kernel for.
    pub const TARGETS: [SmArch; 2] = [SmArch::HOPPER, SmArch::THOR];
    /// The oldest the kernels run on: FP8 E4M3 conversions (`cvt.rn.f16x2.e4m3x2`) are native
    /// from sm_89.
    pub const MIN: SmArch = SmArch { major: 8, minor: 9 };

    pub const fn new(major: u32, minor: u32) -> SmArch {
        SmArch { major, minor }
    }

    /// The NVRTC `--gpu-architecture`: the arch-specific target (`sm_90a`, `sm_110a`) where
    /// one exists, so the compiler may use every instruction of that chip (wgmma, the FP4
    /// conversions); a cubin for it loads only on that chip, which is what we build it for.
    pub fn target(self) -> String {
        let arch_specific = matches!((self.major, self.minor), (9, 0) | (10, _) | (11, 0) | (12, _));
        format!("sm_{}{}{}", self.major, self.minor, if arch_specific { "a" } else { "" })
    }

    pub fn supported(self) -> bool {
        self >= SmArch::MIN
    }
}

impl fmt::Display for SmArch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_the_exact_arch_specific_names() {
        assert_eq!(SmArch::HOPPER.target(), "sm_90a");
        assert_eq!(SmArch::THOR.target(), "sm_110a");
        assert_eq!(SmArch::new(10, 0).target(), "sm_100a");
        assert_eq!(SmArch::new(8, 9).target(), "sm_89");
        assert!(SmArch::new(8, 9).supported());
        assert!(!SmArch::new(8, 6).supported());
        assert!(SmArch::THOR.supported());
    }
}
