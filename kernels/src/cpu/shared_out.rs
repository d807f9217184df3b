//! The output pointer the parallel CPU kernels hand to their worker threads.

/// A raw pointer to an output buffer that several threads write at once. Sound only because
/// every kernel that uses it gives each work item a disjoint range of the output (rows, row ×
/// head, or row × column blocks — each call site says which).
#[derive(Clone, Copy)]
pub(crate) struct SharedOut(pub(crate) *mut f32);
// SAFETY: see the type's contract: writers never overlap, and the buffer outlives the work.
unsafe impl Send for SharedOut {}
unsafe impl Sync for SharedOut {}

impl SharedOut {
    /// (A method, so that closures capture the `Send` wrapper rather than the raw pointer.)
    pub(crate) fn ptr(&self) -> *mut f32 {
        self.0
    }
}
