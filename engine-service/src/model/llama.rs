//! Llama-architecture forward pass (filled in by the model work).
