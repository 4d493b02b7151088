//! The kernel programs, embedded, and the Rust mirror of the types they share with user space.
