//! A refcounted pool of fixed-size KV blocks.

/// Blocks are numbered `first .. first + count` (the pool may cover a region of the KV cache).
#[derive(Debug)]
pub struct BlockPool {
    first: u32,
    refcount: Vec<u32>,
    free: Vec<u32>,
}

impl BlockPool {
    pub fn new(first: u32, count: usize) -> Self {
        // Hand out low block ids first (pop from the back).
        let free = (first..first + count as u32).rev().collect();
        BlockPool { first, refcount: vec![0; count], free }
    }

    pub fn capacity(&self) -> usize {
        self.refcount.len()
    }

    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    pub fn num_used(&self) -> usize {
        self.capacity() - self.num_free()
    }

    /// Takes a free block with refcount 1.
    pub fn alloc(&mut self) -> Option<u32> {
        let b = self.free.pop()?;
        self.refcount[(b - self.first) as usize] = 1;
        Some(b)
    }

    pub fn retain(&mut self, b: u32) {
        let rc = &mut self.refcount[(b - self.first) as usize];
        debug_assert!(*rc > 0, "retain of free block {b}");
        *rc += 1;
    }

    /// Drops one reference; the block returns to the free list at zero.
    pub fn release(&mut self, b: u32) {
        let rc = &mut self.refcount[(b - self.first) as usize];
        debug_assert!(*rc > 0, "release of free block {b}");
        *rc = rc.saturating_sub(1);
        if *rc == 0 {
            self.free.push(b);
        }
    }

    pub fn refcount(&self, b: u32) -> u32 {
        self.refcount[(b - self.first) as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_return_at_zero_refs() {
        let mut p = BlockPool::new(10, 2);
        let a = p.alloc().unwrap();
        let b = p.alloc().unwrap();
        assert_eq!((a, b), (10, 11));
        assert!(p.alloc().is_none());
        p.retain(a);
        p.release(a);
        assert_eq!(p.num_free(), 0);
        p.release(a);
        assert_eq!(p.num_free(), 1);
        assert_eq!(p.alloc(), Some(10));
    }
}
