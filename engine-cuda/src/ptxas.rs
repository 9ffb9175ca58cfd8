//! Reads ptxas's `--verbose` report (NVRTC's program log) so a kernel that spills registers
//! or keeps arrays in local memory fails the build check instead of running slowly.

/// What ptxas says about one compiled function.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FunctionReport {
    pub name: String,
    /// A kernel (`__global__`) rather than a device function ptxas kept as a call.
    pub entry: bool,
    pub registers: u32,
    pub stack_frame_bytes: u32,
    pub spill_store_bytes: u32,
    pub spill_load_bytes: u32,
}

impl FunctionReport {
    /// Local memory the function uses: a stack frame (arrays indexed at run time, calls) or
    /// spilled registers.
    pub fn local_memory_problem(&self) -> Option<String> {
        let mut what = Vec::new();
        if self.stack_frame_bytes > 0 {
            what.push(format!("{} bytes stack frame", self.stack_frame_bytes));
        }
        if self.spill_store_bytes > 0 || self.spill_load_bytes > 0 {
            what.push(format!(
                "{} bytes spill stores, {} bytes spill loads",
                self.spill_store_bytes, self.spill_load_bytes
            ));
        }
        (!what.is_empty()).then(|| format!("{}: {}", self.name, what.join(", ")))
    }
}

/// The functions of a ptxas report, in the order it lists them.
pub fn parse(log: &str) -> Vec<FunctionReport> {
    let mut out: Vec<FunctionReport> = Vec::new();
    let mut entries = Vec::new();
    for line in log.lines() {
        if let Some(name) = quoted_after(line, "Compiling entry function '") {
            entries.push(name.to_string());
        } else if let Some(rest) = line.split("Function properties for ").nth(1) {
            let name = rest.trim().to_string();
            let entry = entries.contains(&name);
            out.push(FunctionReport { name, entry, ..FunctionReport::default() });
        } else if let Some(f) = out.last_mut() {
            if line.contains("bytes stack frame") {
                f.stack_frame_bytes = number_before(line, "bytes stack frame").unwrap_or(0);
                f.spill_store_bytes = number_before(line, "bytes spill stores").unwrap_or(0);
                f.spill_load_bytes = number_before(line, "bytes spill loads").unwrap_or(0);
            } else if line.contains("Used ") && line.contains(" registers") {
                f.registers = number_before(line, "registers").unwrap_or(0);
            }
        }
    }
    out
}

/// The problems of a report: every function with local memory. Empty when clean.
pub fn local_memory_problems(reports: &[FunctionReport]) -> Vec<String> {
    reports.iter().filter_map(FunctionReport::local_memory_problem).collect()
}

fn quoted_after<'a>(line: &'a str, prefix: &str) -> Option<&'a str> {
    let rest = line.split(prefix).nth(1)?;
    rest.split('\'').next()
}

/// The integer right before `label` in `line` ("..., 16 bytes spill stores" -> 16).
fn number_before(line: &str, label: &str) -> Option<u32> {
    let head = &line[..line.find(label)?];
    head.trim_end().rsplit(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NVRTC 13.0.88's log for one clean kernel and one that keeps an array in local memory.
    const LOG: &str = "ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'spill' for 'sm_90a'
ptxas info    : Function properties for spill
ptxas         .     256 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers, 256 bytes cumulative stack size
ptxas info    : Compile time = 18.392 ms
ptxas info    : Compiling entry function 'ok' for 'sm_90a'
ptxas info    : Function properties for ok
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers
ptxas info    : Compile time = 1.877 ms
";

    #[test]
    fn reads_registers_and_local_memory_per_function() {
        let r = parse(LOG);
        assert_eq!(r.len(), 2);
        assert_eq!(
            r[0],
            FunctionReport {
                name: "spill".into(),
                entry: true,
                registers: 32,
                stack_frame_bytes: 256,
                spill_store_bytes: 0,
                spill_load_bytes: 0
            }
        );
        assert_eq!(r[1].name, "ok");
        assert_eq!(r[1].registers, 8);
        assert_eq!(local_memory_problems(&r), vec!["spill: 256 bytes stack frame".to_string()]);
    }

    #[test]
    fn spills_are_problems() {
        let log = "ptxas info    : Function properties for k\n\
                   ptxas         .     0 bytes stack frame, 24 bytes spill stores, 16 bytes spill loads\n\
                   ptxas info    : Used 16 registers, used 0 barriers\n";
        let r = parse(log);
        assert!(!r[0].entry);
        assert_eq!((r[0].spill_store_bytes, r[0].spill_load_bytes, r[0].registers), (24, 16, 16));
        assert_eq!(local_memory_problems(&r), vec!["k: 24 bytes spill stores, 16 bytes spill loads".to_string()]);
    }
}
