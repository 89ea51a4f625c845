//! Oncelog client (work in progress).
