//! CPU backend (filled in by the kernel work).
