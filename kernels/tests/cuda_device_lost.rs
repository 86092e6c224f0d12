//! A sticky CUDA error (here a kernel that executes `__trap()`, which fails the launch and poisons
//! the context for the rest of the process) reaches the backend's next call as
//! `KernelError::DeviceLost`, which the server turns into a lost engine (it exits once every
//! engine is lost). Needs a GPU, so ignored in CI; run on the GPU machine with
//! `cargo test -p instinct-kernels --test cuda_device_lost -- --ignored`. Run it alone: it leaves
//! GPU 0's context of this process unusable.

mod common;

use cudarc::driver::{CudaContext, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;
use instinct_kernels::cuda::{Compiler, CudaToolkit, KernelSource};
use instinct_kernels::{Backend, KernelError};

#[test]
#[ignore = "needs a GPU; poisons the CUDA context of the process"]
fn a_trapped_kernel_makes_the_backend_report_the_device_lost() {
    let backend = common::gpu();
    backend.synchronize().expect("a healthy device first");
    let before = backend.upload(&[1.0, 2.0, 3.0]).expect("a healthy upload");
    drop(before);

    // The backend uses the device's primary context; a kernel that traps there poisons it.
    let toolkit = CudaToolkit::locate().expect("the CUDA toolkit");
    let compiler = Compiler::new(&toolkit).expect("NVRTC");
    let source = KernelSource::new(
        "trap.cu",
        "extern \"C\" __global__ void trap_now(int never) { if (never != 7) __trap(); }",
        &["trap_now"],
    );
    let cubin = compiler
        .compile(&source, backend.arch())
        .expect("the trap kernel compiles")
        .cubin;
    let ctx = CudaContext::new(0).expect("GPU 0");
    let module = ctx.load_module(Ptx::from_binary(cubin)).expect("module");
    let trap = module.load_function("trap_now").expect("function");
    let stream = ctx.default_stream();
    let zero: i32 = 0;
    let mut launch = stream.launch_builder(&trap);
    launch.arg(&zero);
    // The launch itself may succeed; the trap surfaces at the next synchronization.
    let _ = unsafe { launch.launch(LaunchConfig::for_num_elems(1)) };
    assert!(stream.synchronize().is_err(), "the trap fails the stream");

    // Every later call fails the same way: an upload as well as a synchronization.
    assert!(
        matches!(backend.upload(&[1.0]), Err(KernelError::DeviceLost(_))),
        "an upload after the trap reports the device lost"
    );
    match backend.synchronize() {
        Err(KernelError::DeviceLost(detail)) => {
            eprintln!("backend after the trap: device lost: {detail}");
        }
        other => panic!("expected DeviceLost after a trapped kernel, got {other:?}"),
    }
}
