//! The resourcewatch node agent: loads the kernel pipelines, reads them, and predicts leaks.

pub mod leak;
