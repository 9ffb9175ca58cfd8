//! Engine runtime config.
