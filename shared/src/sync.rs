//! Locking that survives a poisoned mutex.
//!
//! A panic while a guard is held poisons the mutex; every later `lock()` then fails. The data
//! behind Sieve's mutexes is left consistent between statements (counters, estimators, lists
//! replaced whole), so the right answer to poisoning is to carry on with it, not to take the
//! panic to every later caller.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, recovering the data if a panicking thread poisoned it.
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_mutex_still_locks_with_its_data() {
        let m = std::sync::Arc::new(Mutex::new(7));
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let _g = m2.lock().unwrap();
            panic!("poison it");
        })
        .join();
        assert!(m.is_poisoned());
        *lock(&m) += 1;
        assert_eq!(*lock(&m), 8);
    }
}
