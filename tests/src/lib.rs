//! Cross-crate tests of Alpha; see the files under `tests/tests/`.
