//! f32 values held where a backend keeps its buffers (device memory on a GPU) or on the host:
//! the parts of a prefix-state snapshot and an encoded image's features, shared by the questions
//! and caches that use them without a copy.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

/// f32 values in the buffer of the backend that made them (a `Vec<f32>` on the CPU backend,
/// device memory on a GPU) or on the host ([`Self::host`]). Cloning shares them.
#[derive(Clone)]
pub struct Values {
    len: usize,
    held: Arc<dyn Any + Send + Sync>,
}

impl Values {
    /// Values on the host (a backend's snapshot read back, or one built by hand).
    pub fn host(values: Vec<f32>) -> Self {
        Self::in_buffer(values.len(), values)
    }

    /// `len` values at the start of a backend buffer.
    pub(crate) fn in_buffer<T: Any + Send + Sync>(len: usize, buffer: T) -> Self {
        Self {
            len,
            held: Arc::new(buffer),
        }
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `other` holds the same values: the same buffer (a clone of this), not equal ones.
    pub fn shares(&self, other: &Values) -> bool {
        Arc::ptr_eq(&self.held, &other.held)
    }

    /// The values, where they are held on the host (always on the CPU backend).
    pub fn as_host(&self) -> Option<&[f32]> {
        self.buffer::<Vec<f32>>().map(|v| &v[..self.len])
    }

    /// The buffer holding the values, where it is a `T`.
    pub(crate) fn buffer<T: Any>(&self) -> Option<&T> {
        self.held.downcast_ref::<T>()
    }
}

impl fmt::Debug for Values {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.as_host() {
            Some(v) => f.debug_list().entries(v.iter().take(8)).finish(),
            None => write!(f, "<{} values on a device>", self.len),
        }
    }
}

/// Host values compare by value; device ones only as the same buffer.
impl PartialEq for Values {
    fn eq(&self, other: &Self) -> bool {
        match (self.as_host(), other.as_host()) {
            (Some(a), Some(b)) => a == b,
            _ => Arc::ptr_eq(&self.held, &other.held) && self.len == other.len,
        }
    }
}
