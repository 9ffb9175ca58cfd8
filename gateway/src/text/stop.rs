//! Stop strings matched on decoded text across chunk boundaries.
//!
//! `push` returns the text that is safe to show: everything except a tail that could still
//! grow into a stop string. On a match the output is cut before the stop string and the
//! matcher reports `stopped`; the stop string itself is never shown. Cost per push: one scan
//! of the held tail plus the new text per stop string (stop strings are few and short).

#[derive(Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Text received but not yet released (a possible stop-string prefix).
    held: String,
    stopped: bool,
    /// The stop string that matched (the earliest in the text; the first listed on a tie).
    matched: Option<String>,
}

/// The result of one `push`.
#[derive(Debug, PartialEq, Eq)]
pub struct StopOutput {
    /// Text to release to the client now.
    pub text: String,
    /// A stop string matched; nothing after it may be shown.
    pub stopped: bool,
}

impl StopMatcher {
    /// Empty stop strings are ignored (they would match everywhere).
    pub fn new(stops: Vec<String>) -> Self {
        StopMatcher {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
            stopped: false,
            matched: None,
        }
    }

    pub fn push(&mut self, text: &str) -> StopOutput {
        if self.stopped {
            return StopOutput { text: String::new(), stopped: true };
        }
        if self.stops.is_empty() {
            return StopOutput { text: text.to_owned(), stopped: false };
        }
        self.held.push_str(text);
        let earliest = self
            .stops
            .iter()
            .filter_map(|stop| self.held.find(stop.as_str()).map(|pos| (pos, stop)))
            .min_by_key(|&(pos, _)| pos);
        if let Some((pos, stop)) = earliest {
            self.matched = Some(stop.clone());
            self.stopped = true;
            let out = self.held[..pos].to_owned();
            self.held.clear();
            return StopOutput { text: out, stopped: true };
        }
        let keep = self.longest_partial_suffix();
        let release = self.held.len() - keep;
        let out = self.held[..release].to_owned();
        self.held.drain(..release);
        StopOutput { text: out, stopped: false }
    }

    /// The stop string that ended the text, once one has.
    pub fn matched(&self) -> Option<&str> {
        self.matched.as_deref()
    }

    /// Releases the held tail at the end of generation (it never became a stop string).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Length of the longest suffix of `held` that is a proper prefix of some stop string.
    /// Only char boundaries are tried: a stop string (valid UTF-8) cannot start mid-char.
    fn longest_partial_suffix(&self) -> usize {
        let max_stop = self.stops.iter().map(String::len).max().unwrap_or(0);
        let min_start = self.held.len().saturating_sub(max_stop.saturating_sub(1));
        for (start, _) in self.held.char_indices().filter(|&(i, _)| i >= min_start) {
            let tail = &self.held[start..];
            if self.stops.iter().any(|s| s.len() > tail.len() && s.starts_with(tail)) {
                return tail.len();
            }
        }
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], chunks: &[&str]) -> (String, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for c in chunks {
            let o = m.push(c);
            out.push_str(&o.text);
            if o.stopped {
                return (out, true);
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    #[test]
    fn stop_string_split_across_chunks_is_cut_out() {
        assert_eq!(run(&["</answer>"], &["The answer is 4</an", "swer> and more"]), ("The answer is 4".into(), true));
        assert_eq!(run(&["STOP"], &["a", "S", "T", "O", "P", "b"]), ("a".into(), true));
    }

    #[test]
    fn partial_prefix_that_does_not_complete_is_released() {
        let mut m = StopMatcher::new(vec!["</end>".into()]);
        let o = m.push("x </e");
        assert_eq!(o, StopOutput { text: "x ".into(), stopped: false });
        let o = m.push("lse");
        assert_eq!(o, StopOutput { text: "</else".into(), stopped: false });
        assert_eq!(run(&["</end>"], &["tail </en"]), ("tail </en".into(), false));
    }

    #[test]
    fn earliest_of_several_stop_strings_wins_and_multibyte_is_safe() {
        assert_eq!(run(&["日本", "b"], &["aé日", "本b"]), ("aé".into(), true));
        assert_eq!(run(&["\n\n", "x"], &["line\n", "\nnext x"]), ("line".into(), true));
        assert_eq!(run(&["😀"], &["ok 😀"]), ("ok ".into(), true));
        let mut m = StopMatcher::new(vec!["b".into(), "\n\n".into()]);
        assert!(!m.push("line\n").stopped && m.matched().is_none());
        assert!(m.push("\nb").stopped);
        assert_eq!(m.matched(), Some("\n\n"));
    }

    #[test]
    fn no_stop_strings_passes_text_through_and_nothing_follows_a_stop() {
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
        assert_eq!(run(&[""], &["a"]), ("a".into(), false));
        let mut m = StopMatcher::new(vec!["z".into()]);
        assert!(m.push("az").stopped);
        assert_eq!(m.push("more"), StopOutput { text: String::new(), stopped: true });
    }
}
