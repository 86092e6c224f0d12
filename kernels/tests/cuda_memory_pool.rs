//! `CudaOptions::pool_keep_bytes`: the device's default memory pool (where the backend's
//! stream-ordered buffers come from) keeps freed memory for the next allocations instead of
//! handing it back at a synchronization. Needs a GPU (`#[ignore]`d in CI):
//! `cargo test --release -p instinct-kernels --test cuda_memory_pool -- --ignored`. A test binary
//! of its own: the pool belongs to the process.

use cudarc::driver::sys::{
    cuDeviceGetDefaultMemPool, cuMemPoolGetAttribute, CUmemPool_attribute, CUmemoryPool,
};
use cudarc::driver::CudaContext;
use instinct_kernels::cuda::{CudaBackend, CudaOptions};
use instinct_kernels::Backend;

/// A u64 attribute of GPU 0's default memory pool.
fn pool_attribute(attribute: CUmemPool_attribute) -> u64 {
    let ctx = CudaContext::new(0).expect("GPU 0");
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    let mut value = 0u64;
    // SAFETY: the driver writes the pool handle, then the attribute (a cuuint64_t for both that
    // are read here).
    unsafe {
        cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device())
            .result()
            .expect("the default pool");
        cuMemPoolGetAttribute(pool, attribute, (&mut value as *mut u64).cast())
            .result()
            .expect("a pool attribute");
    }
    value
}

#[test]
#[ignore = "needs a GPU"]
fn freed_memory_stays_in_the_pool_when_told() {
    let keep = 1u64 << 30;
    let gpu = CudaBackend::new(CudaOptions {
        pool_keep_bytes: Some(keep),
        ..CudaOptions::default()
    })
    .unwrap_or_else(|e| panic!("CUDA start-up: {e}"));
    assert_eq!(
        pool_attribute(CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD),
        keep
    );

    // 256 MiB allocated and freed; after the stream is waited on, the pool still holds them.
    let big = gpu.alloc(64 << 20).unwrap();
    drop(big);
    let small = gpu.upload(&[1.0f32]).unwrap();
    assert_eq!(gpu.read(&small, 1).unwrap(), [1.0]);
    let reserved = pool_attribute(CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
    assert!(
        reserved >= 256 << 20,
        "the pool keeps {reserved} bytes after the free"
    );
}
