//! The growing buffer a request body is read into: a `Vec` while small, pages of its own (an
//! anonymous mapping, memmap2) from [`MAPPED_FROM`] bytes on, so that the memory of large
//! bodies goes back to the OS rather than to the allocator's heaps; and the process's pool of
//! such mappings ([`MapPool`]), which keeps a bounded few for the next large bodies.
//!
//! Why not always a `Vec`: glibc's allocator raises its mmap threshold each time a large block
//! is freed, so later large body buffers come from its heaps, which keep their pages after a
//! free and fragment across the threads' arenas. Under clients that make a process read many
//! large bodies (refused over the budget, or timed out, and freed over and over) its RSS grew to
//! about twice the bytes `[http] max_buffered_bytes` lets it hold. A mapping is unmapped
//! whatever the allocator does, so RSS follows the budget. Small bodies (the usual request) stay
//! on the allocator: a mapping per request would cost system calls.
//!
//! Why a pool: a fresh mapping per large body costs its page faults and an unmap (with a TLB
//! shootdown across the runtime's threads) per request, a large share of the proxy's CPU on
//! large requests. A mapping a request is done with goes back to the pool, up to its byte bound
//! (`MapPool::new`), its pages still in place, and the next large body takes it. What the pool
//! holds is the one memory outside the budget, and it is bounded. A body that takes a pooled
//! mapping reserves the mapping's whole length, whose pages are in memory whatever the body has
//! sent so far, and takes only one no longer than its declared length: otherwise clients that
//! trickle large declared bodies would each hold a pooled mapping's pages on a small
//! reservation, and the process's RSS would outgrow its budget.
//!
//! A mapping grows without a copy: `mremap` moves its pages to a larger range (Linux; elsewhere
//! the bytes are copied into a new mapping). A body declared large starts as a mapping, so its
//! bytes are never copied from the heap either. The figures behind each choice are in
//! `docs/benchmarks/proxy-overhead.md`.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use memmap2::MmapMut;

use sieve_shared::sync::lock;

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

    /// The largest pooled mapping of `len` to `at_most` bytes, if there is one (a body is
    /// expected to fill its declared length: the more of its pages already in place, the
    /// fewer faults).
    fn take(&self, len: usize, at_most: usize) -> Option<MmapMut> {
        let mut p = lock(&self.maps);
        let (i, _) = p
            .maps
            .iter()
            .enumerate()
            .filter(|(_, m)| (len..=at_most).contains(&m.len()))
            .max_by_key(|(_, m)| m.len())?;
        let m = p.maps.swap_remove(i);
        p.bytes -= m.len();
        Some(m)
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
    /// `declared`: the body's declared length; at [`MAPPED_FROM`] or more its first allocation
    /// is a mapping already.
    Heap { v: Vec<u8>, declared: Option<usize>, pool: Option<Arc<MapPool>> },
    /// The capacity is the mapping's whole length (what the budget counts). A read that fails
    /// or is cancelled drops it, which gives the mapping back too.
    Mapped { map: PoolMap, len: usize },
}

impl BodyBuf {
    /// A buffer for a body of `declared` bytes, if that is known; its mappings come from and go
    /// back to `pool` when there is one.
    pub(super) fn new(declared: Option<u64>, pool: Option<Arc<MapPool>>) -> Self {
        BodyBuf::Heap { v: Vec::new(), declared: declared.and_then(|d| usize::try_from(d).ok()), pool }
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
            BodyBuf::Mapped { map, .. } => map.get().len(),
        }
    }

    /// Makes the capacity at least `cap`, moving to a mapping from [`MAPPED_FROM`] on (or at
    /// once for a body declared that large), after `reserve` has taken what the buffer will
    /// hold: `cap` bytes, or a pooled mapping's whole length (a pooled mapping is taken only if
    /// `reserve` can cover it; `reserve` grows a reservation to its argument and fails with the
    /// caller's error). The capacity is then exactly what was reserved. `no_memory` makes the
    /// error of a mapping the OS refuses.
    pub(super) fn grow_to<E>(
        &mut self,
        cap: usize,
        reserve: &mut impl FnMut(usize) -> Result<(), E>,
        no_memory: impl FnOnce(std::io::Error) -> E,
    ) -> Result<(), E> {
        if cap <= self.capacity() {
            return Ok(());
        }
        match self {
            BodyBuf::Heap { v, declared, .. } if cap < MAPPED_FROM && !declared.is_some_and(|d| d >= MAPPED_FROM) => {
                reserve(cap)?;
                v.reserve_exact(cap - v.len());
            }
            BodyBuf::Heap { v, declared, pool } => {
                // A pooled mapping no longer than the body may be (its pages are in memory: all
                // of them reserved), else a new one of `cap`.
                let at_most = declared.unwrap_or(cap).max(cap);
                let pooled = pool.as_ref().and_then(|p| {
                    let m = p.take(cap, at_most)?;
                    if reserve(m.len()).is_ok() {
                        Some(m)
                    } else {
                        p.give_back(m);
                        None
                    }
                });
                let mut map = match pooled {
                    Some(m) => m,
                    None => {
                        reserve(cap)?;
                        MmapMut::map_anon(cap).map_err(no_memory)?
                    }
                };
                map[..v.len()].copy_from_slice(v);
                let len = v.len();
                *self = BodyBuf::Mapped { map: PoolMap { map: Some(map), pool: pool.take() }, len };
            }
            BodyBuf::Mapped { map, len } => {
                reserve(cap)?;
                grow_mapping(map.get_mut(), *len, cap).map_err(no_memory)?;
            }
        }
        Ok(())
    }

    /// Appends `data`; the capacity must already hold it ([`grow_to`](Self::grow_to)).
    pub(super) fn extend_from_slice(&mut self, data: &[u8]) {
        match self {
            BodyBuf::Heap { v, .. } => v.extend_from_slice(data),
            BodyBuf::Mapped { map, len } => {
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

    /// No budget: every reservation is granted.
    fn free(_: usize) -> Result<(), ()> {
        Ok(())
    }

    fn grow(b: &mut BodyBuf, cap: usize) {
        b.grow_to(cap, &mut free, |e| panic!("{e}")).unwrap();
    }

    #[test]
    fn small_stays_on_the_heap_large_moves_to_a_mapping_keeping_its_bytes() {
        let mut b = BodyBuf::new(None, None);
        assert!(b.is_empty());
        grow(&mut b, 1000);
        b.extend_from_slice(b"abc");
        assert!(matches!(b, BodyBuf::Heap { .. }));
        assert_eq!((b.len(), b.capacity()), (3, 1000));
        grow(&mut b, MAPPED_FROM);
        assert!(matches!(b, BodyBuf::Mapped { .. }));
        assert_eq!((b.len(), b.capacity()), (3, MAPPED_FROM));
        b.extend_from_slice(&vec![7u8; MAPPED_FROM - 3]);
        grow(&mut b, 2 * MAPPED_FROM);
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
        grow(&mut small, 16 << 10);
        assert!(matches!(small, BodyBuf::Heap { .. }));
        let mut b = BodyBuf::new(Some(3 * MAPPED_FROM as u64), None);
        grow(&mut b, 16 << 10);
        assert!(matches!(b, BodyBuf::Mapped { .. }), "mapped at once");
        assert_eq!((b.len(), b.capacity()), (0, 16 << 10));
        let (want, _) = fill_doubling(&mut b, 200);
        assert!(b.capacity() > 3 * MAPPED_FROM, "grown several times: {}", b.capacity());
        assert_eq!(&b.into_bytes()[..], &want[..]);
    }

    /// `chunks` chunks of 3,001 bytes appended, the capacity doubled when full (reserved in a
    /// running total); what was written and the total reserved.
    fn fill_doubling(b: &mut BodyBuf, chunks: u32) -> (Vec<u8>, usize) {
        let mut want = Vec::new();
        let mut reserved = b.capacity();
        for i in 0..chunks {
            let chunk: Vec<u8> = (0..3001u32).map(|j| (i * 7 + j) as u8).collect();
            if b.len() + chunk.len() > b.capacity() {
                let cap = (b.capacity() * 2).max(b.len() + chunk.len());
                let mut reserve = |total: usize| -> Result<(), ()> {
                    reserved = reserved.max(total);
                    Ok(())
                };
                b.grow_to(cap, &mut reserve, |e| panic!("{e}")).unwrap();
                assert!(b.capacity() >= cap);
            }
            b.extend_from_slice(&chunk);
            want.extend_from_slice(&chunk);
        }
        (want, reserved)
    }

    /// A mapping a body is done with (its bytes dropped, or its read abandoned) goes back to the
    /// pool and serves the next large body no shorter than it, which reserves the mapping's
    /// whole length (its pages are in memory); a body declared shorter, or one whose budget
    /// cannot cover it, gets a mapping of its own; past the pool's bound mappings are unmapped.
    #[test]
    fn pooled_mappings_are_reserved_whole_taken_within_the_declared_length_and_bounded() {
        let pool = Arc::new(MapPool::new(8 * MAPPED_FROM));
        let declared = 2 * MAPPED_FROM;
        let mut a = BodyBuf::new(Some(declared as u64), Some(pool.clone()));
        let (want, _) = fill_doubling(&mut a, 150);
        let a_map = a.capacity();
        assert!(a_map <= declared * 2, "{a_map}");
        let bytes = a.into_bytes();
        assert_eq!(&bytes[..], &want[..]);
        assert_eq!(pool.bytes(), 0, "in use: not in the pool");
        drop(bytes);
        assert_eq!(pool.bytes(), a_map, "given back when the last Bytes went");

        // A body declared shorter than the pooled mapping does not take it.
        let mut short = BodyBuf::new(Some(a_map as u64 - 1), Some(pool.clone()));
        grow(&mut short, 16 << 10);
        assert_eq!((pool.bytes(), short.capacity()), (a_map, 16 << 10), "a mapping of its own");
        drop(short);

        // One whose budget cannot cover the pooled mapping's length gets a mapping of its own.
        let mut tight = BodyBuf::new(Some(a_map as u64), Some(pool.clone()));
        let mut only_64k = |total: usize| if total <= 64 << 10 { Ok(()) } else { Err(total) };
        tight.grow_to(16 << 10, &mut only_64k, |e| panic!("{e}")).unwrap();
        assert_eq!(tight.capacity(), 16 << 10);
        assert!(pool.bytes() >= a_map, "the pooled mapping stayed");
        drop(tight);

        // The next body as long takes it, and reserves all of it at its first growth.
        let mut b = BodyBuf::new(Some(a_map as u64), Some(pool.clone()));
        let mut reserved = 0;
        let mut note = |total: usize| -> Result<(), ()> {
            reserved = reserved.max(total);
            Ok(())
        };
        b.grow_to(16 << 10, &mut note, |e| panic!("{e}")).unwrap();
        assert_eq!((b.capacity(), reserved), (a_map, a_map), "taken, reserved whole");
        let (want, _) = fill_doubling(&mut b, 10);
        assert_eq!(&b.into_bytes()[..], &want[..], "no old bytes show");

        // A read abandoned midway gives its mapping back too.
        let mut c = BodyBuf::new(Some(declared as u64), Some(pool.clone()));
        grow(&mut c, MAPPED_FROM);
        c.extend_from_slice(b"partial");
        let before = pool.bytes();
        drop(c);
        assert!(pool.bytes() > before);

        // Over the bound: mappings past it are unmapped, not kept.
        let held: Vec<BodyBuf> = (0..8)
            .map(|_| {
                let mut d = BodyBuf::new(Some(declared as u64), Some(pool.clone()));
                grow(&mut d, 2 * MAPPED_FROM);
                d
            })
            .collect();
        drop(held);
        assert!(pool.bytes() <= 8 * MAPPED_FROM, "bounded: {}", pool.bytes());
        assert!(pool.bytes() >= 6 * MAPPED_FROM, "kept up to the bound: {}", pool.bytes());
    }
}
