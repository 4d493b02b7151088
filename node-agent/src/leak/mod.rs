//! Leak detection (filled in by the leak-prediction issue).
