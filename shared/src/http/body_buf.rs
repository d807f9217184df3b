//! The growing buffer a request body is read into: a `Vec` while small, pages of its own (an
//! anonymous mapping, memmap2) from [`MAPPED_FROM`] bytes on, so that dropping a large body
//! gives its memory back to the OS at once.
//!
//! Why not always a `Vec`: glibc's allocator raises its mmap threshold each time a large block
//! is freed, so later large body buffers come from its heaps, which keep their pages after a
//! free and fragment across the threads' arenas. Under clients that make a process read many
//! large bodies (refused over the budget, or timed out, and freed over and over) its RSS was
//! about twice the bytes `[http] max_buffered_bytes` lets it hold (the abuse soak's hoards with
//! a 32 MiB budget: 57-67 MiB of growth; 28 MiB with large blocks mapped). A mapping of its own
//! is unmapped on drop whatever the allocator does, so RSS follows the budget. Small bodies (the
//! usual request) stay on the allocator: a mapping per request would cost system calls.

use bytes::Bytes;
use memmap2::MmapMut;

/// A buffer this large or larger is a mapping of its own.
pub(super) const MAPPED_FROM: usize = 256 << 10;

pub(super) enum BodyBuf {
    Heap(Vec<u8>),
    Mapped { map: MmapMut, len: usize },
}

impl BodyBuf {
    pub(super) fn new() -> Self {
        BodyBuf::Heap(Vec::new())
    }

    pub(super) fn len(&self) -> usize {
        match self {
            BodyBuf::Heap(v) => v.len(),
            BodyBuf::Mapped { len, .. } => *len,
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(super) fn capacity(&self) -> usize {
        match self {
            BodyBuf::Heap(v) => v.capacity(),
            BodyBuf::Mapped { map, .. } => map.len(),
        }
    }

    /// Makes the capacity exactly `cap` (at least the length), moving to a mapping from
    /// [`MAPPED_FROM`] on. Fails only when the OS refuses the mapping.
    pub(super) fn grow_to(&mut self, cap: usize) -> std::io::Result<()> {
        if cap <= self.capacity() {
            return Ok(());
        }
        match self {
            BodyBuf::Heap(v) if cap < MAPPED_FROM => v.reserve_exact(cap - v.len()),
            _ => {
                let mut map = MmapMut::map_anon(cap)?;
                let len = self.len();
                map[..len].copy_from_slice(self.filled());
                *self = BodyBuf::Mapped { map, len };
            }
        }
        Ok(())
    }

    /// Appends `data`; the capacity must already hold it ([`grow_to`](Self::grow_to)).
    pub(super) fn extend_from_slice(&mut self, data: &[u8]) {
        match self {
            BodyBuf::Heap(v) => v.extend_from_slice(data),
            BodyBuf::Mapped { map, len } => {
                map[*len..*len + data.len()].copy_from_slice(data);
                *len += data.len();
            }
        }
    }

    fn filled(&self) -> &[u8] {
        match self {
            BodyBuf::Heap(v) => v,
            BodyBuf::Mapped { map, len } => &map[..*len],
        }
    }

    /// The bytes read, without a copy (a mapping is unmapped when the last `Bytes` of it goes).
    pub(super) fn into_bytes(self) -> Bytes {
        match self {
            BodyBuf::Heap(v) => Bytes::from(v),
            BodyBuf::Mapped { map, len } => Bytes::from_owner(Filled { map, len }),
        }
    }
}

/// A mapping seen as its first `len` bytes.
struct Filled {
    map: MmapMut,
    len: usize,
}

impl AsRef<[u8]> for Filled {
    fn as_ref(&self) -> &[u8] {
        &self.map[..self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_stays_on_the_heap_large_moves_to_a_mapping_keeping_its_bytes() {
        let mut b = BodyBuf::new();
        assert!(b.is_empty());
        b.grow_to(1000).unwrap();
        b.extend_from_slice(b"abc");
        assert!(matches!(b, BodyBuf::Heap(_)));
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
}
