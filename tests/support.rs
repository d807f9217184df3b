//! Helpers for the end-to-end tests: locating the built binaries, starting them on loopback.
