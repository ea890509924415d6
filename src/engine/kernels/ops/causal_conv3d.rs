//! `CausalConv3d(X, W) -> Y`: a causal 3D convolution without bias, channels last.
//!
//! X has shape `[N, T, H, W, C]` (X's last axis is C here, so D = C), W `[K, kT, kH, kW, C]` with
//! kT ≤ T and kH, kW odd; Y has shape `[N, T − kT + 1, H, W, K]` and
//! `Y[n, t, i, j, k] = Σ_{a, b, c, ·} X[n, t + a, i + b − kH/2, j + c − kW/2, ·] · W[k, a, b, c,
//! ·]` over the taps whose pixel is inside the frame (zero padding in space, none in time), the
//! sum in float32 (in any order) and rounded to T once. The CUDA kernel is cuDNN's convolution
//! with the engine picked by timing ([`ConvKernel`]); the exporter writes it for the fused VAE's
//! bias-free causal convolutions, in place of ONNX `Conv`.

use rayon::prelude::*;

use cudarc::driver::sys::CUstream;
use ort::value::TensorElementType;

pub(crate) use crate::engine::kernels::conv::ConvDims;
use crate::engine::kernels::conv::{ConvError, ConvKernel};
use crate::engine::kernels::operator::{
    ContractError, CpuIo, CudaKernel, Element, NodeAttrs, OpInfo, ShapeCheck, UnstepOp,
};
use crate::engine::kernels::rows::MIN_ROWS_PER_TASK;

/// The operator.
pub(crate) struct CausalConv3d;

impl UnstepOp for CausalConv3d {
    const INFO: OpInfo = OpInfo {
        name: "CausalConv3d",
        inputs: &["X", "W"],
        outputs: &["Y"],
        x_index: 0,
        in_place: &[],
        fixed: &[],
        row_kernel: None,
    };
    type Attrs = ();
    type Sizes = ConvDims;
    type Cuda = ConvKernel;

    fn attrs(_: &NodeAttrs<'_, '_>) -> ort::Result<()> {
        Ok(())
    }

    fn check(_: &(), shapes: &ShapeCheck<'_>) -> Result<ConvDims, ContractError> {
        let (x, w) = (shapes.x, shapes.shape(1));
        match (x, w) {
            (&[n, t, h, wd, c], &[k, kt, kh, kw, wc])
                if [n, t, h, wd, c, k, kt, kh, kw].iter().all(|&v| v > 0)
                    && wc == c
                    && kt <= t
                    && kh % 2 == 1
                    && kw % 2 == 1 =>
            {
                let [n, t, h, w, c, k, kt, kh, kw] =
                    [n, t, h, wd, c, k, kt, kh, kw].map(|v| v as usize);
                Ok(ConvDims {
                    n,
                    t,
                    h,
                    w,
                    c,
                    k,
                    kt,
                    kh,
                    kw,
                })
            }
            _ => Err(shapes.fail(format!(
                "input X has shape {x:?} and W {w:?}; X must be [N, T, H, W, C] (channels \
                 last) and W [K, kT, kH, kW, C] with X's C, kT ≤ T and kH, kW odd, every size at \
                 least 1"
            ))),
        }
    }

    /// Y has X's shape with T − kT + 1 frames and K channels.
    fn output_shape(shapes: &[&[i64]], _: usize) -> Vec<i64> {
        let mut shape = shapes[0].to_vec();
        if let ([_, t, ..], [_, kt, ..]) = (&mut shape[..], shapes[1]) {
            *t -= kt - 1;
        }
        if let (Some(last), Some(&k)) = (shape.last_mut(), shapes[1].first()) {
            *last = k;
        }
        shape
    }

    /// Needs X and W of rank 5 with T, K and kT known.
    fn inference_shapes<'a>(
        x: &'a [i64],
        known: impl Fn(usize) -> Option<&'a [i64]>,
    ) -> Option<Vec<&'a [i64]>> {
        let w = known(1)?;
        let fits = x.len() == 5 && w.len() == 5 && x[1] >= 0 && w[..2].iter().all(|&n| n >= 0);
        fits.then(|| vec![x, w])
    }

    fn is_empty(sizes: &ConvDims) -> bool {
        sizes.rows() == 0
    }

    fn cpu<T: Element>(_: &(), sizes: &ConvDims, io: CpuIo<'_, T>) {
        let [x, w] = io.inputs[..] else {
            unreachable!("two inputs")
        };
        let [y] = io.outputs.try_into().expect("one output");
        causal_conv3d(sizes, x, w, y);
    }
}

/// The CPU kernel: output pixel (n, t, i, j) and channel k sums, in float32,
/// `X[n, t + a, i + b − kh/2, j + c − kw/2, ·] · W[k, a, b, c, ·]` over the taps whose pixel is
/// inside the frame (zero padding in space, none in time), rounded once; output pixels in
/// parallel. The weights are laid out tap by tap, channel by channel, with the K outputs
/// innermost, so that each input value updates all K sums in one contiguous (vectorised) pass.
pub(crate) fn causal_conv3d<T: Element>(g: &ConvDims, x: &[T], w: &[T], y: &mut [T]) {
    let g = *g;
    let out_t = g.out_t();
    let taps = g.kt * g.kh * g.kw;
    let x = T::widen(x);
    // wt[(tap · C + ch) · K + k] = W[k, tap, ch].
    let mut wt = vec![0f32; taps * g.c * g.k];
    for (k, filter) in w.chunks_exact(taps * g.c).enumerate() {
        for (i, v) in filter.iter().enumerate() {
            wt[i * g.k + k] = v.to_f32();
        }
    }
    y.par_chunks_mut(g.k)
        .with_min_len(MIN_ROWS_PER_TASK)
        .enumerate()
        .for_each_init(
            || vec![0f32; g.k],
            |acc, (r, y_row)| {
                let (j, i) = (r % g.w, (r / g.w) % g.h);
                let (t, n) = ((r / (g.w * g.h)) % out_t, r / (g.w * g.h * out_t));
                acc.fill(0.0);
                for a in 0..g.kt {
                    for b in 0..g.kh {
                        let Some(ii) = (i + b).checked_sub(g.kh / 2).filter(|&v| v < g.h) else {
                            continue;
                        };
                        for c in 0..g.kw {
                            let Some(jj) = (j + c).checked_sub(g.kw / 2).filter(|&v| v < g.w)
                            else {
                                continue;
                            };
                            let pixel = ((n * g.t + t + a) * g.h + ii) * g.w + jj;
                            let x_row = &x[pixel * g.c..][..g.c];
                            let tap = (a * g.kh + b) * g.kw + c;
                            let w_tap = &wt[tap * g.c * g.k..][..g.c * g.k];
                            for (xv, w_row) in x_row.iter().zip(w_tap.chunks_exact(g.k)) {
                                for (sum, wv) in acc.iter_mut().zip(w_row) {
                                    *sum += xv * wv;
                                }
                            }
                        }
                    }
                }
                for (out, sum) in y_row.iter_mut().zip(acc.iter()) {
                    *out = T::from_f32(*sum);
                }
            },
        );
}

impl CudaKernel<CausalConv3d> for ConvKernel {
    type Error = ConvError;

    fn new(ty: TensorElementType, ordinal: i32) -> Result<Self, ConvError> {
        ConvKernel::new(ty, ordinal)
    }

    fn launch(
        &mut self,
        _: &(),
        sizes: &ConvDims,
        pointers: &[u64],
        stream: CUstream,
    ) -> Result<(), ConvError> {
        self.launch_conv(sizes, pointers, stream)
    }
}

#[cfg(test)]
pub(crate) mod tests;
