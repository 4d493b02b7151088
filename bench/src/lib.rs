//! The leak corpus: its cases (real runtimes and simulators, each labelled leak or not),
//! the traces `resourcewatch-bench corpus` records of them, and their replay through the
//! agent's detectors, evaluated as the agent does (`tests/corpus.rs`; LEAKS.md). It lives
//! with the benchmarks, not in the agent: the agent ships without it.

pub mod leak_corpus;
