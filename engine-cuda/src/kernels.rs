//! The kernel sources: `.cu` files under `kernels/`, embedded in the binary and compiled at
//! start-up for the device's exact architecture (see [`crate::nvrtc`]). Each is compiled as
//! `common.cuh` followed by the file (NVRTC 13.0 ships no headers; the prelude defines what
//! the kernels share).

/// One `.cu` file and the kernels it defines.
#[derive(Clone, Copy, Debug)]
pub struct KernelSource {
    /// The file's stem (`gemv` for `kernels/gemv.cu`); names the module and its cubin.
    pub name: &'static str,
    pub source: &'static str,
    /// Every `extern "C" __global__` entry point (the compile check holds the list to the
    /// source both ways).
    pub entries: &'static [&'static str],
}

/// Included before every source.
pub const PRELUDE: &str = include_str!("../kernels/common.cuh");

pub const ELEMENTWISE: KernelSource = KernelSource {
    name: "elementwise",
    source: include_str!("../kernels/elementwise.cu"),
    entries: &["silu_mul", "add_assign", "sigmoid_mul", "scale", "gather_rows", "concat_cols", "deinterleave_heads"],
};

pub const NORM: KernelSource =
    KernelSource { name: "norm", source: include_str!("../kernels/norm.cu"), entries: &["rms_norm", "gated_rms_norm"] };

pub const ROPE: KernelSource = KernelSource {
    name: "rope",
    source: include_str!("../kernels/rope.cu"),
    entries: &["rope_adjacent", "rope_half_split"],
};

pub const GEMV: KernelSource = KernelSource {
    name: "gemv",
    source: include_str!("../kernels/gemv.cu"),
    entries: &[
        "gemv_q8_0",
        "gemv_q4_0",
        "gemv_q4_1",
        "gemv_f16",
        "gemv_bf16",
        "gemv_q4_k",
        "gemv_q5_k",
        "gemv_q6_k",
        "gemv_f32",
        "embed_q8_0",
        "embed_q4_0",
        "embed_q4_1",
        "embed_f16",
        "embed_bf16",
        "embed_f32",
        "embed_q4_k",
        "embed_q5_k",
        "embed_q6_k",
    ],
};

pub const KV: KernelSource = KernelSource {
    name: "kv",
    source: include_str!("../kernels/kv.cu"),
    entries: &["write_kv_f16", "write_kv_fp8", "move_kv"],
};

pub const ATTENTION: KernelSource = KernelSource {
    name: "attention",
    source: include_str!("../kernels/attention.cu"),
    entries: &["attention_split_f16", "attention_split_fp8", "attention_merge"],
};

pub const SAMPLE: KernelSource =
    KernelSource { name: "sample", source: include_str!("../kernels/sample.cu"), entries: &["argmax_rows"] };

/// Every kernel source, in the order the backend loads them.
pub const ALL: &[KernelSource] = &[ELEMENTWISE, NORM, ROPE, GEMV, KV, ATTENTION, SAMPLE];

impl KernelSource {
    /// What NVRTC compiles: the prelude, then the file, with `#line` so errors name the
    /// file's own lines.
    pub fn full_source(&self) -> String {
        format!("{PRELUDE}\n#line 1 \"{}.cu\"\n{}", self.name, self.source)
    }

    /// The `extern "C" __global__` names the source defines, in order.
    pub fn defined_entries(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        let mut rest = self.source;
        while let Some(at) = rest.find("extern \"C\" __global__ void ") {
            rest = &rest[at + "extern \"C\" __global__ void ".len()..];
            let end = rest.find('(').unwrap_or(rest.len());
            out.push(rest[..end].trim());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entry_point_is_listed_once_and_exists() {
        let mut seen = std::collections::HashSet::new();
        for k in ALL {
            let defined = k.defined_entries();
            assert_eq!(defined, k.entries, "{}.cu: the listed entries differ from the source's", k.name);
            for e in k.entries {
                assert!(seen.insert(*e), "entry {e} is defined twice");
            }
        }
    }

    #[test]
    fn sources_include_no_headers() {
        // NVRTC 13.0 has no headers of its own: an #include would compile only where a
        // toolkit happens to be installed.
        for k in ALL {
            assert!(!k.source.contains("#include"), "{}.cu includes a header", k.name);
        }
        assert!(!PRELUDE.contains("#include"));
    }
}
