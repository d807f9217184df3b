//! The growing buffer a request body is read into: a `Vec` while small, pages of its own (an
//! anonymous mapping, memmap2) from [`MAPPED_FROM`] bytes on, so that the memory of large
//! bodies goes back to the OS rather than to the allocator's heaps; and the process's pool of
//! such mappings ([`MapPool`]), which keeps a bounded few for the next large bodies.
//!
//! Why not always a `Vec`: glibc's allocator raises its mmap threshold each time a large block
//! is freed, so later large body buffers come from its heaps, which keep their pages after a
//! free and fragment across the threads' arenas. Under clients that make a process read many
//! large bodies (refused over the budget, or timed out, and freed over and over) its RSS was
//! about twice the bytes `[http] max_buffered_bytes` lets it hold (the abuse soak's hoards with
//! a 32 MiB budget: 57-67 MiB of growth; 28 MiB with large blocks mapped). A mapping is
//! unmapped whatever the allocator does, so RSS follows the budget. Small bodies (the usual
//! request) stay on the allocator: a mapping per request would cost system calls.
//!
//! Why a pool: a fresh mapping per large body, unmapped when the request is done, cost the
//! proxy about 70 page faults and an unmap (with its TLB shootdown across the runtime's
//! threads) per 276 KB body: 150-250 µs of system time per 1,000-item request, a quarter of its
//! CPU (against a `Vec`, measured by the proxy's `/proc` times over 1,000 requests). A mapping
//! a request is done with goes back to the pool, up to its byte bound (`MapPool::new`), its
//! pages still in place, and the next large body takes it: no fault, no unmap. What the pool
//! holds is the one memory outside the budget, and it is bounded.
//!
//! A mapping grows without a copy: `mremap` moves its pages to a larger range (Linux; elsewhere
//! the bytes are copied into a new mapping). A body declared large starts as a mapping, so its
//! bytes are never copied from the heap either: a 276 KB body had been copied about 200 KB more
//! as its buffer doubled (callgrind on the proxy: ~0.2 M of ~2.7 M instructions a request).

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use memmap2::MmapMut;

use crate::sync::lock;

/// A buffer this large or larger is a mapping of its own.
pub(super) const MAPPED_FROM: usize = 256 << 10;

/// The most mappings the pool keeps, whatever their size.
const POOL_ENTRIES: usize = 16;

/// Large body buffers a process is done with, kept for the next large bodies: at most
/// `max_bytes` of mappings and [`POOL_ENTRIES`] of them; a mapping past that is unmapped.
#[derive(Debug)]
pub(crate) struct MapPool {
    max_bytes: usize,
    maps: Mutex<Pooled>,
}

#[derive(Debug, Default)]
struct Pooled {
    maps: Vec<MmapMut>,
    bytes: usize,
}

impl MapPool {
    pub(crate) fn new(max_bytes: usize) -> Self {
        MapPool { max_bytes, maps: Mutex::default() }
    }

    /// A mapping of at least `len` bytes: the smallest pooled one that is large enough, else
    /// the largest one grown (its pages moved, the new ones faulted in as they are written),
    /// else a new one.
    fn take(&self, len: usize) -> std::io::Result<MmapMut> {
        let found = {
            let mut p = lock(&self.maps);
            let fit = p.maps.iter().enumerate().filter(|(_, m)| m.len() >= len).min_by_key(|(_, m)| m.len());
            let pick = fit.or_else(|| p.maps.iter().enumerate().max_by_key(|(_, m)| m.len())).map(|(i, _)| i);
            pick.map(|i| {
                let m = p.maps.swap_remove(i);
                p.bytes -= m.len();
                m
            })
        };
        match found {
            Some(mut m) if m.len() < len => {
                grow_mapping(&mut m, 0, len)?;
                Ok(m)
            }
            Some(m) => Ok(m),
            None => MmapMut::map_anon(len),
        }
    }

    /// Keeps `map` for a later body if the pool has room; else it is unmapped.
    fn give_back(&self, map: MmapMut) {
        let mut p = lock(&self.maps);
        if p.maps.len() < POOL_ENTRIES && p.bytes + map.len() <= self.max_bytes {
            p.bytes += map.len();
            p.maps.push(map);
        }
    }

    /// Bytes of mappings the pool holds now.
    #[cfg(test)]
    fn bytes(&self) -> usize {
        lock(&self.maps).bytes
    }
}

/// A mapping in use, given back to its pool (if it came from one) when dropped.
pub(super) struct PoolMap {
    /// `None` only once given back.
    map: Option<MmapMut>,
    pool: Option<Arc<MapPool>>,
}

impl PoolMap {
    fn get(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }

    fn get_mut(&mut self) -> &mut MmapMut {
        self.map.as_mut().expect("a mapping in use")
    }
}

impl Drop for PoolMap {
    fn drop(&mut self) {
        if let (Some(map), Some(pool)) = (self.map.take(), &self.pool) {
            pool.give_back(map);
        }
    }
}

pub(super) enum BodyBuf {
    /// `large`: the body is declared [`MAPPED_FROM`] bytes or more, so its first allocation is
    /// a mapping already.
    Heap { v: Vec<u8>, large: bool, pool: Option<Arc<MapPool>> },
    /// `cap` is the capacity asked for (what the budget counts); the mapping may be larger (a
    /// pooled one), and the bytes past `cap` are not used. A read that fails or is cancelled
    /// drops it, which gives the mapping back too.
    Mapped { map: PoolMap, len: usize, cap: usize },
}

impl BodyBuf {
    /// A buffer for a body of `declared` bytes, if that is known; its mappings come from and go
    /// back to `pool` when there is one.
    pub(super) fn new(declared: Option<u64>, pool: Option<Arc<MapPool>>) -> Self {
        BodyBuf::Heap { v: Vec::new(), large: declared.is_some_and(|d| d >= MAPPED_FROM as u64), pool }
    }

    pub(super) fn len(&self) -> usize {
        match self {
            BodyBuf::Heap { v, .. } => v.len(),
            BodyBuf::Mapped { len, .. } => *len,
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(super) fn capacity(&self) -> usize {
        match self {
            BodyBuf::Heap { v, .. } => v.capacity(),
            BodyBuf::Mapped { cap, .. } => *cap,
        }
    }

    /// Makes the capacity exactly `cap` (at least the length), moving to a mapping from
    /// [`MAPPED_FROM`] on (or at once for a body declared that large). Fails only when the OS
    /// refuses the mapping.
    pub(super) fn grow_to(&mut self, cap: usize) -> std::io::Result<()> {
        if cap <= self.capacity() {
            return Ok(());
        }
        match self {
            BodyBuf::Heap { v, large, .. } if cap < MAPPED_FROM && !(*large && v.capacity() == 0) => {
                v.reserve_exact(cap - v.len())
            }
            BodyBuf::Heap { v, pool, .. } => {
                let mut map = match pool {
                    Some(p) => p.take(cap)?,
                    None => MmapMut::map_anon(cap)?,
                };
                map[..v.len()].copy_from_slice(v);
                let len = v.len();
                *self = BodyBuf::Mapped { map: PoolMap { map: Some(map), pool: pool.take() }, len, cap };
            }
            BodyBuf::Mapped { map, len, cap: asked } => {
                let map = map.get_mut();
                if map.len() < cap {
                    grow_mapping(map, *len, cap)?;
                }
                *asked = cap;
            }
        }
        Ok(())
    }

    /// Appends `data`; the capacity must already hold it ([`grow_to`](Self::grow_to)).
    pub(super) fn extend_from_slice(&mut self, data: &[u8]) {
        match self {
            BodyBuf::Heap { v, .. } => v.extend_from_slice(data),
            BodyBuf::Mapped { map, len, cap } => {
                assert!(*len + data.len() <= *cap, "grow_to first");
                map.get_mut()[*len..*len + data.len()].copy_from_slice(data);
                *len += data.len();
            }
        }
    }

    /// The bytes read, without a copy (a mapping goes back to its pool, or is unmapped, when
    /// the last `Bytes` of it goes).
    pub(super) fn into_bytes(self) -> Bytes {
        match self {
            BodyBuf::Heap { v, .. } => Bytes::from(v),
            BodyBuf::Mapped { map, len, .. } => Bytes::from_owner(Filled { map, len }),
        }
    }
}

/// `map` (its first `len` bytes in use) made `cap` bytes long, its pages moved, not copied.
#[cfg(target_os = "linux")]
fn grow_mapping(map: &mut MmapMut, _len: usize, cap: usize) -> std::io::Result<()> {
    // SAFETY: `remap` may move the mapping; nothing borrows it (`&mut`), and its bytes go along.
    unsafe { map.remap(cap, memmap2::RemapOptions::new().may_move(true)) }
}

/// `map` (its first `len` bytes in use) made `cap` bytes long: a new mapping, the bytes copied.
#[cfg(not(target_os = "linux"))]
fn grow_mapping(map: &mut MmapMut, len: usize, cap: usize) -> std::io::Result<()> {
    let mut bigger = MmapMut::map_anon(cap)?;
    bigger[..len].copy_from_slice(&map[..len]);
    *map = bigger;
    Ok(())
}

/// A mapping seen as its first `len` bytes (given back to its pool when dropped).
struct Filled {
    map: PoolMap,
    len: usize,
}

impl AsRef<[u8]> for Filled {
    fn as_ref(&self) -> &[u8] {
        &self.map.get()[..self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_stays_on_the_heap_large_moves_to_a_mapping_keeping_its_bytes() {
        let mut b = BodyBuf::new(None, None);
        assert!(b.is_empty());
        b.grow_to(1000).unwrap();
        b.extend_from_slice(b"abc");
        assert!(matches!(b, BodyBuf::Heap { .. }));
        assert_eq!((b.len(), b.capacity()), (3, 1000));
        b.grow_to(MAPPED_FROM).unwrap();
        assert!(matches!(b, BodyBuf::Mapped { .. }));
        assert_eq!((b.len(), b.capacity()), (3, MAPPED_FROM));
        b.extend_from_slice(&vec![7u8; MAPPED_FROM - 3]);
        b.grow_to(2 * MAPPED_FROM).unwrap();
        b.extend_from_slice(b"z");
        assert_eq!((b.len(), b.capacity()), (MAPPED_FROM + 1, 2 * MAPPED_FROM));
        let bytes = b.into_bytes();
        assert_eq!(bytes.len(), MAPPED_FROM + 1);
        assert_eq!(&bytes[..3], b"abc");
        assert!(bytes[3..MAPPED_FROM].iter().all(|&x| x == 7));
        assert_eq!(bytes[MAPPED_FROM], b'z');
    }

    /// A body declared large is a mapping from its first byte, and keeps its bytes as the
    /// mapping grows (moved, on Linux, not copied); one declared small starts on the heap.
    #[test]
    fn a_body_declared_large_is_mapped_from_the_start_and_grows_keeping_its_bytes() {
        let mut small = BodyBuf::new(Some(MAPPED_FROM as u64 - 1), None);
        small.grow_to(16 << 10).unwrap();
        assert!(matches!(small, BodyBuf::Heap { .. }));
        let mut b = BodyBuf::new(Some(3 * MAPPED_FROM as u64), None);
        b.grow_to(16 << 10).unwrap();
        assert!(matches!(b, BodyBuf::Mapped { .. }), "mapped at once");
        assert_eq!((b.len(), b.capacity()), (0, 16 << 10));
        let want = fill_doubling(&mut b, 200);
        assert!(b.capacity() > 3 * MAPPED_FROM, "grown several times: {}", b.capacity());
        assert_eq!(&b.into_bytes()[..], &want[..]);
    }

    /// `chunks` chunks of 3,001 bytes appended, the capacity doubled when full; what was written.
    fn fill_doubling(b: &mut BodyBuf, chunks: u32) -> Vec<u8> {
        let mut want = Vec::new();
        for i in 0..chunks {
            let chunk: Vec<u8> = (0..3001u32).map(|j| (i * 7 + j) as u8).collect();
            if b.len() + chunk.len() > b.capacity() {
                let cap = (b.capacity() * 2).max(b.len() + chunk.len());
                b.grow_to(cap).unwrap();
                assert_eq!(b.capacity(), cap);
            }
            b.extend_from_slice(&chunk);
            want.extend_from_slice(&chunk);
        }
        want
    }

    /// A mapping a body is done with (its bytes dropped, or its read abandoned) goes back to the
    /// pool and serves the next large body, whose capacity is what it asked for even when the
    /// pooled mapping is larger; past the pool's bound mappings are unmapped, not kept.
    #[test]
    fn mappings_go_back_to_the_pool_within_its_bound_and_are_taken_again() {
        let pool = Arc::new(MapPool::new(3 * MAPPED_FROM));
        let declared = Some(2 * MAPPED_FROM as u64);
        let mut a = BodyBuf::new(declared, Some(pool.clone()));
        let want = fill_doubling(&mut a, 150);
        let a_map = a.capacity();
        let bytes = a.into_bytes();
        assert_eq!(&bytes[..], &want[..]);
        assert_eq!(pool.bytes(), 0, "in use: not in the pool");
        drop(bytes);
        assert_eq!(pool.bytes(), a_map, "given back when the last Bytes went");

        // The next body takes it: its capacity is its own, the mapping the pooled one.
        let mut b = BodyBuf::new(declared, Some(pool.clone()));
        b.grow_to(16 << 10).unwrap();
        assert_eq!(pool.bytes(), 0, "taken");
        assert_eq!(b.capacity(), 16 << 10);
        let want = fill_doubling(&mut b, 10);
        assert_eq!(&b.into_bytes()[..], &want[..], "no old bytes show");
        assert_eq!(pool.bytes(), a_map, "back again");

        // A read abandoned midway gives its mapping back too.
        let mut c = BodyBuf::new(declared, Some(pool.clone()));
        c.grow_to(MAPPED_FROM).unwrap();
        c.extend_from_slice(b"partial");
        drop(c);
        assert_eq!(pool.bytes(), a_map);

        // Over the bound: two large mappings at once, only what fits is kept.
        let mut d = BodyBuf::new(declared, Some(pool.clone()));
        let mut e = BodyBuf::new(declared, Some(pool.clone()));
        d.grow_to(3 * MAPPED_FROM).unwrap();
        e.grow_to(3 * MAPPED_FROM).unwrap();
        drop((d, e));
        assert_eq!(pool.bytes(), 3 * MAPPED_FROM, "one kept, one unmapped");
    }
}
