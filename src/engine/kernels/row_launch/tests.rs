//! The row kernels' launch: the D they refuse, the layout a row takes, the entry points' names.

use ort::value::TensorElementType;

use super::*;
use crate::engine::kernels::ops::{
    BiasGelu, BiasRmsNorm, GatedResidualLayerNorm, QkvNormRopeCache,
};

/// The base name of a row operator's entry points.
fn base<O: UnstepOp>() -> &'static str {
    O::INFO.row_kernel.unwrap()
}

/// The CUDA kernels load element pairs and the row operators keep a row in registers: an odd D
/// (a misaligned pair load on the device), or for a row operator one past `MAX_D`, is refused
/// before any launch.
#[test]
fn rows_the_cuda_kernels_cannot_take_are_refused_before_a_launch() {
    for d in [2, 96, 1536, MAX_D] {
        assert!(
            check_d(<BiasRmsNorm as RowOp>::ELEMENTWISE, d).is_ok(),
            "D = {d}"
        );
    }
    for d in [1, 15, 1535, MAX_D + 2] {
        let error = check_d(<BiasRmsNorm as RowOp>::ELEMENTWISE, d)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains(&format!("D = {d}")) && error.contains("even"),
            "{error}"
        );
    }
    // The elementwise BiasGelu keeps no row in registers: any even D (the FFN's 8960).
    assert!(check_d(<BiasGelu as RowOp>::ELEMENTWISE, 8960).is_ok());
    assert!(
        check_d(<BiasGelu as RowOp>::ELEMENTWISE, 7)
            .unwrap_err()
            .to_string()
            .contains("even D")
    );
}

/// A group of threads per row, 16 bytes per access, up to D = 512 (the VAE's 96 to 384, the tiny
/// model's 16 to 64) where D is a multiple of 16 bytes and the tensors are aligned to it, with the
/// fewest lanes (a power of two) that take at most four accesses each; otherwise one block per row,
/// of 4-element accesses where D is a multiple of 4 and the tensors are aligned to 4 elements
/// (wan-1.3b's 1536), of pairs otherwise; the entry points' names.
#[test]
fn rows_take_the_widest_layout_their_size_and_alignment_allow() {
    let group = |lanes| Layout::Group { lanes };
    // float16: 8 elements per access; float32: 4.
    for (d, elem, lanes) in [
        (8, 2, 1),
        (16, 2, 1),
        (64, 2, 2),
        (96, 2, 4),
        (192, 2, 8),
        (384, 2, 16),
        (512, 2, 16),
        (4, 4, 1),
        (16, 4, 1),
        (64, 4, 4),
        (96, 4, 8),
        (512, 4, 32),
    ] {
        assert_eq!(
            Layout::choose(d, elem, 16),
            group(lanes),
            "D = {d}, {elem} bytes"
        );
        assert_eq!(
            Layout::choose(d, elem, 256),
            group(lanes),
            "D = {d}, 256-aligned"
        );
        // Aligned to a pair only.
        assert_eq!(
            Layout::choose(d, elem, 2 * elem),
            Layout::Block,
            "D = {d}, pairs"
        );
    }
    use Layout::{Block, BlockQuad};
    for (d, elem, alignment, want) in [
        (1536, 2, 16, BlockQuad),
        (1536, 2, 8, BlockQuad),
        (1536, 4, 16, BlockQuad),
        (2048, 4, 16, BlockQuad),
        (100, 2, 16, BlockQuad),
        (520, 2, 8, BlockQuad),
        (2, 2, 16, Block),
        (2, 4, 16, Block),
        (514, 4, 16, Block),
        (1536, 2, 4, Block),
        (1000, 4, 8, Block),
        (1538, 2, 16, Block),
    ] {
        assert_eq!(
            Layout::choose(d, elem, alignment),
            want,
            "D = {d}, {elem} bytes, aligned to {alignment}"
        );
    }
    let name = |op, ty, layout| entry_point(op, ty, layout).unwrap();
    assert_eq!(
        name(base::<BiasRmsNorm>(), TensorElementType::Float16, group(16)),
        "unstep_bias_rms_norm_f16_g"
    );
    assert_eq!(
        name(
            base::<QkvNormRopeCache>(),
            TensorElementType::Float16,
            Layout::BlockQuad
        ),
        "unstep_qkv_norm_rope_cache_f16_q"
    );
    assert_eq!(
        name(
            base::<GatedResidualLayerNorm>(),
            TensorElementType::Float32,
            Layout::Block
        ),
        "unstep_gated_residual_layer_norm_f32"
    );
    assert!(entry_point(base::<BiasRmsNorm>(), TensorElementType::Int8, group(1)).is_none());
}

/// An elementwise launch (BiasGelu) takes the unit of the widest layout D and the alignment
/// allow, and blocks of that layout's entry points' size: 256 threads would exceed the block
/// layouts' `__launch_bounds__(128)` (the launch fails with CUDA_ERROR_INVALID_VALUE).
#[test]
fn elementwise_launches_match_their_entry_points() {
    assert_eq!(
        Layout::choose_elementwise(8960, 2, 256),
        Layout::Group { lanes: 32 }
    );
    assert_eq!(Layout::choose_elementwise(100, 2, 256), Layout::BlockQuad);
    assert_eq!(Layout::choose_elementwise(6, 4, 256), Layout::Block);
    assert_eq!(Layout::choose_elementwise(8960, 2, 8), Layout::BlockQuad);
    let n = 4680 * 8960;
    assert_eq!(
        Layout::Group { lanes: 32 }.elementwise_dims(n, 2),
        (16384, GROUP_THREADS)
    );
    assert_eq!(Layout::BlockQuad.elementwise_dims(400, 2), (1, THREADS));
    assert_eq!(Layout::Block.elementwise_dims(42, 4), (1, THREADS));
    assert_eq!(Layout::Block.elementwise_dims(2 * 128 * 3, 4), (3, THREADS));
}
