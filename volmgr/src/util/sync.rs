//! Locks that survive a panic of another holder.
//!
//! A panic while a lock is held poisons it. Every structure volmgr keeps
//! behind a lock stays consistent between statements (the state that matters
//! is rebuilt from the kernel by the next resync), so a poisoned lock is
//! taken over rather than propagated: one failed operation must not stop the
//! manager. These are the only places that decide that.

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// `lock()` that takes over a poisoned mutex.
pub trait MutexExt<T: ?Sized> {
    /// Locks, recovering the guard of a poisoned mutex.
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> MutexExt<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// `read()`/`write()` that take over a poisoned lock.
pub trait RwLockExt<T: ?Sized> {
    /// Shared access, recovering the guard of a poisoned lock.
    fn read_locked(&self) -> RwLockReadGuard<'_, T>;
    /// Exclusive access, recovering the guard of a poisoned lock.
    fn write_locked(&self) -> RwLockWriteGuard<'_, T>;
}

impl<T: ?Sized> RwLockExt<T> for RwLock<T> {
    fn read_locked(&self) -> RwLockReadGuard<'_, T> {
        self.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write_locked(&self) -> RwLockWriteGuard<'_, T> {
        self.write().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_lock_is_taken_over() {
        let m = std::sync::Arc::new(Mutex::new(1));
        let l = std::sync::Arc::new(RwLock::new(1));
        let (m2, l2) = (m.clone(), l.clone());
        let _ = std::thread::spawn(move || {
            let _g = m2.lock().unwrap();
            let _w = l2.write().unwrap();
            panic!("poison");
        })
        .join();
        assert!(m.is_poisoned() && l.is_poisoned());
        *m.locked() += 1;
        *l.write_locked() += 1;
        assert_eq!((*m.locked(), *l.read_locked()), (2, 2));
    }
}
