//! Tokenizer from model metadata.
