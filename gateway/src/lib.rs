//! gateway (filled in by the gateway work).
