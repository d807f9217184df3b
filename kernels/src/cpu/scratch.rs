//! Per-thread scratch buffers owned by the backend, reused across calls so that hot ops do not
//! allocate (and page-fault) large buffers on every call. Contents never influence results:
//! every user writes what it reads.

use std::sync::Mutex;

pub(crate) struct ScratchPool<T> {
    /// One per pool thread, plus one for callers outside the pool.
    slots: Vec<Mutex<T>>,
}

impl<T: Default> ScratchPool<T> {
    pub fn new(threads: usize) -> Self {
        ScratchPool { slots: (0..threads + 1).map(|_| Mutex::new(T::default())).collect() }
    }

    /// Runs `f` with this thread's scratch. (`f` must not re-enter the pool: nothing here does.)
    pub fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        let last = self.slots.len() - 1;
        let i = rayon::current_thread_index().filter(|&i| i < last).unwrap_or(last);
        let mut guard = self.slots[i].lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        f(&mut guard)
    }
}

/// Grows `buf` to at least `len` values and returns them.
pub(crate) fn grown(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if buf.len() < len {
        buf.resize(len, 0.0);
    }
    &mut buf[..len]
}
