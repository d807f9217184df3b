//! The driver's tensor maps for the TMA-fed wgmma GEMM: a [`TmaBox`] over a device buffer,
//! encoded by `cuTensorMapEncodeTiled` on the host (a few microseconds, per launch: the map holds
//! the buffer's address) and passed to the kernel by value.

use cudarc::driver::sys::{
    self, CUtensorMapDataType, CUtensorMapFloatOOBfill, CUtensorMapInterleave, CUtensorMapL2promotion,
    CUtensorMapSwizzle,
};
use cudarc::driver::DeviceRepr;

use super::driver_err;
use crate::backend::{KernelError, Result};
use crate::cuda::tma::TmaBox;

/// An encoded tensor map: the 128 opaque bytes a kernel's `const __grid_constant__ TmaMap`
/// parameter receives.
#[repr(transparent)]
pub(crate) struct TmaMap(sys::CUtensorMap);

// SAFETY: plain bytes (the driver's CUtensorMap), copied into the kernel's parameter space.
unsafe impl DeviceRepr for TmaMap {}

impl TmaMap {
    /// The map of box `b` over the bf16 matrix at device address `ptr` (16-byte aligned): the
    /// 128-byte swizzle, zeros outside the matrix, L2 fetches of 256 bytes.
    pub fn encode(b: &TmaBox, ptr: u64) -> Result<TmaMap> {
        if !ptr.is_multiple_of(16) {
            return Err(KernelError::Shape(format!("a TMA operand at {ptr:#x}: needs a 16-byte aligned address")));
        }
        let (dims, strides, box_dims) = b.encode_args();
        let elem_strides = [1u32, 1];
        let mut map = sys::CUtensorMap { opaque: [0; 16] };
        // SAFETY: every pointer is to a live local array of the rank the call is given; `ptr` is
        // a device allocation of at least rows · cols bf16 (the caller's tensor).
        unsafe {
            sys::cuTensorMapEncodeTiled(
                &mut map,
                CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                2,
                ptr as *mut std::ffi::c_void,
                dims.as_ptr(),
                strides.as_ptr(),
                box_dims.as_ptr(),
                elem_strides.as_ptr(),
                CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
                CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
            .result()
            .map_err(driver_err("encoding a TMA tensor map"))?;
        }
        Ok(TmaMap(map))
    }
}
