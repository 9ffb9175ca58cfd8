//! Model file formats.
