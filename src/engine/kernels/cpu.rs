//! The CPU kernels of the `ai.unstep` operators: one pass per row, rows in parallel (rayon), float32
//! arithmetic, each output element rounded to its type once.

use ort::operator::ComputeContext;
use ort::value::{DynTensorValueType, PrimitiveTensorElementType};
use rayon::prelude::*;

use super::{Attrs, Op, Plan, op_error, plan};

/// An element type of the operators: float32 or float16.
pub(crate) trait Element:
    PrimitiveTensorElementType + Copy + PartialEq + std::fmt::Debug + Send + Sync + 'static
{
    fn to_f32(self) -> f32;
    /// Rounds to nearest, ties to even (as `cvt.rn.f16.f32` on the GPU).
    fn from_f32(v: f32) -> Self;
    /// The values as float32: borrowed when they are float32 already.
    fn widen(values: &[Self]) -> std::borrow::Cow<'_, [f32]> {
        values.iter().map(|v| v.to_f32()).collect()
    }
}

impl Element for f32 {
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(v: f32) -> Self {
        v
    }
    fn widen(values: &[Self]) -> std::borrow::Cow<'_, [f32]> {
        std::borrow::Cow::Borrowed(values)
    }
}

impl Element for half::f16 {
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        half::f16::from_f32(v)
    }
}

/// Rows per rayon task at the least: a row is a few microseconds of work at most.
const MIN_ROWS_PER_TASK: usize = 16;

/// What [`bias_rms_norm`] does with the normed row n before it stores it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Epilogue<'a, T> {
    /// `BiasRmsNorm`: n.
    Plain,
    /// `BiasRmsNorm` with `silu = 1`: n · sigmoid(n).
    Silu,
    /// `BiasRmsNormRope`: n turned by the rotary tables `(cos, sin)`.
    Rope(&'a [T], &'a [T]),
}

/// SiLU, as the contract writes it: `n · sigmoid(n) = n / (1 + exp(−n))` (−0 for n below about
/// −88, where exp(−n) overflows to infinity).
pub(crate) fn silu(n: f32) -> f32 {
    n / (1.0 + (-n).exp())
}

/// `BiasRmsNorm` (epilogue `Plain` or `Silu`) or `BiasRmsNormRope` (`Rope`) over `plan.rows`
/// rows.
pub(crate) fn bias_rms_norm<T: Element>(
    plan: &Plan,
    epsilon: f32,
    x: &[T],
    bias: &[T],
    weight: &[T],
    epilogue: Epilogue<'_, T>,
    y: &mut [T],
) {
    let rows = Rows {
        stride: plan.d,
        offset: 0,
        first: 0,
    };
    norm_rows(plan, epsilon, x, rows, bias, weight, epilogue, y);
}

/// Where the rows of a [`norm_rows`] call are in its input: row i (of the call) is
/// `x[(first + i) · stride + offset ..][..D]`, and `first + i` is its row number for the rotary
/// tables.
#[derive(Debug, Clone, Copy)]
struct Rows {
    stride: usize,
    offset: usize,
    first: usize,
}

/// The RMS norm with its epilogue over the rows `rows` of `x`, one row of `y` each.
#[allow(clippy::too_many_arguments)]
fn norm_rows<T: Element>(
    plan: &Plan,
    epsilon: f32,
    x: &[T],
    rows: Rows,
    bias: &[T],
    weight: &[T],
    epilogue: Epilogue<'_, T>,
    y: &mut [T],
) {
    let d = plan.d;
    let half_hd = plan.half_hd;
    y.par_chunks_mut(d)
        .with_min_len(MIN_ROWS_PER_TASK)
        .enumerate()
        .for_each_init(
            || vec![0f32; d],
            |v, (i, y_row)| {
                let r = rows.first + i;
                let x_row = &x[r * rows.stride + rows.offset..][..d];
                let mut squares = 0f32;
                for c in 0..d {
                    v[c] = x_row[c].to_f32() + bias[c].to_f32();
                    squares += v[c] * v[c];
                }
                let inv = 1.0 / (squares / d as f32 + epsilon).sqrt();
                for c in 0..d {
                    v[c] = v[c] * inv * weight[c].to_f32();
                }
                match epilogue {
                    Epilogue::Plain => {
                        for c in 0..d {
                            y_row[c] = T::from_f32(v[c]);
                        }
                    }
                    Epilogue::Silu => {
                        for c in 0..d {
                            y_row[c] = T::from_f32(silu(v[c]));
                        }
                    }
                    Epilogue::Rope(cos, sin) => {
                        let table = (r % plan.table_rows) * half_hd;
                        for i in 0..d / 2 {
                            let j = table + i % half_hd;
                            let (c, s) = (cos[j].to_f32(), sin[j].to_f32());
                            let (u0, u1) = (v[2 * i], v[2 * i + 1]);
                            y_row[2 * i] = T::from_f32(u0 * c - u1 * s);
                            y_row[2 * i + 1] = T::from_f32(u0 * s + u1 * c);
                        }
                    }
                }
            },
        );
}

/// GELU's tanh form, as the contract writes it, in float32.
pub(crate) fn gelu(v: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * v * (1.0 + (SQRT_2_OVER_PI * (v + 0.044715 * v * v * v)).tanh())
}

/// `BiasGelu` over `plan.rows` rows of `plan.d`.
pub(crate) fn bias_gelu<T: Element>(plan: &Plan, x: &[T], bias: &[T], y: &mut [T]) {
    let d = plan.d;
    y.par_chunks_mut(d)
        .zip(x.par_chunks(d))
        .with_min_len(MIN_ROWS_PER_TASK)
        .for_each(|(y_row, x_row)| {
            for c in 0..d {
                y_row[c] = T::from_f32(gelu(x_row[c].to_f32() + bias[c].to_f32()));
            }
        });
}

/// `MatMulBiasGelu`: `y[r, n] = GELU(Σ_k x[r, k]·w[n, k] + bias[n])` for `plan.rows` rows of
/// K = `plan.d` and N = `plan.cols`; the product in float32 (ndarray's matrix multiply, on the
/// inputs themselves when they are float32), each element rounded to T once, after the GELU.
pub(crate) fn matmul_bias_gelu<T: Element>(plan: &Plan, x: &[T], w: &[T], bias: &[T], y: &mut [T]) {
    let (m, k, n) = (plan.rows, plan.d, plan.cols);
    let (x, w) = (T::widen(&x[..m * k]), T::widen(&w[..n * k]));
    let x = ndarray::ArrayView2::from_shape((m, k), &x[..]).expect("M·K elements");
    let w = ndarray::ArrayView2::from_shape((n, k), &w[..]).expect("N·K elements");
    let product = x.dot(&w.t());
    let product = product.as_slice().expect("a new array is contiguous");
    y.par_chunks_mut(n)
        .zip(product.par_chunks(n))
        .with_min_len(MIN_ROWS_PER_TASK)
        .for_each(|(y_row, p_row)| {
            for c in 0..n {
                y_row[c] = T::from_f32(gelu(p_row[c] + bias[c].to_f32()));
            }
        });
}

/// `GatedResidualLayerNorm` over `plan.rows` rows: `s` and `y` are its two outputs.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gated_residual_layer_norm<T: Element>(
    plan: &Plan,
    epsilon: f32,
    r: &[T],
    x: &[T],
    bias: &[T],
    gate: &[T],
    scale: &[T],
    shift: &[T],
    s: &mut [T],
    y: &mut [T],
) {
    let d = plan.d;
    let [gate_div, scale_div, shift_div] = plan.divs;
    s.par_chunks_mut(d)
        .zip(y.par_chunks_mut(d))
        .with_min_len(MIN_ROWS_PER_TASK)
        .enumerate()
        .for_each_init(
            || vec![0f32; d],
            |v, (row, (s_row, y_row))| {
                let at = row * d;
                let g = &gate[(row / gate_div) * d..][..d];
                let sc = &scale[(row / scale_div) * d..][..d];
                let sh = &shift[(row / shift_div) * d..][..d];
                let mut sum = 0f32;
                for c in 0..d {
                    let value = r[at + c].to_f32()
                        + (x[at + c].to_f32() + bias[c].to_f32()) * g[c].to_f32();
                    s_row[c] = T::from_f32(value);
                    // The normalisation reads S as it is stored.
                    v[c] = s_row[c].to_f32();
                    sum += v[c];
                }
                let mean = sum / d as f32;
                let mut squares = 0f32;
                for &value in v.iter() {
                    squares += (value - mean) * (value - mean);
                }
                let inv = 1.0 / (squares / d as f32 + epsilon).sqrt();
                for c in 0..d {
                    y_row[c] = T::from_f32((v[c] - mean) * inv * sc[c].to_f32() + sh[c].to_f32());
                }
            },
        );
}

/// `QkvNormRopeCache` over `plan.rows` rows of `qkv`: Q into `q`, the keys and values into the
/// last `plan.block_rows` rows of each batch entry of `k` and `v` (`plan.cache_rows` rows each).
#[allow(clippy::too_many_arguments)]
pub(crate) fn qkv_norm_rope_cache<T: Element>(
    plan: &Plan,
    epsilon: f32,
    qkv: &[T],
    [q_bias, k_bias, q_weight, k_weight]: [&[T]; 4],
    (cos, sin): (&[T], &[T]),
    q: &mut [T],
    k: &mut [T],
    v: &mut [T],
) {
    let d = plan.d;
    let (t, l) = (plan.block_rows, plan.cache_rows);
    let rope = Epilogue::Rope(cos, sin);
    let rows = |offset, first| Rows {
        stride: 3 * d,
        offset,
        first,
    };
    norm_rows(plan, epsilon, qkv, rows(0, 0), q_bias, q_weight, rope, q);
    let block = (l - t) * d..l * d;
    for (b, (k, v)) in k.chunks_mut(l * d).zip(v.chunks_mut(l * d)).enumerate() {
        let (k, v) = (&mut k[block.clone()], &mut v[block.clone()]);
        norm_rows(
            plan,
            epsilon,
            qkv,
            rows(d, b * t),
            k_bias,
            k_weight,
            rope,
            k,
        );
        v.par_chunks_mut(d)
            .with_min_len(MIN_ROWS_PER_TASK)
            .enumerate()
            .for_each(|(i, v_row)| {
                v_row.copy_from_slice(&qkv[(b * t + i) * 3 * d + 2 * d..][..d]);
            });
    }
}

/// `Attention` over `plan`'s rows: for each row of Q (batch b = r / S) and head h, the scores
/// `Q_h · K_h[l] / sqrt(hd)` over the L keys of batch b, their softmax (the largest score
/// subtracted before exp) and the weighted sum of `V_h[l]`, in float32, each element rounded once.
pub(crate) fn attention<T: Element>(plan: &Plan, q: &[T], k: &[T], v: &[T], o: &mut [T]) {
    let (d, s, l) = (plan.d, plan.block_rows, plan.cache_rows);
    let hd = 2 * plan.half_hd;
    let scale = 1.0 / (hd as f32).sqrt();
    o.par_chunks_mut(d)
        .with_min_len(MIN_ROWS_PER_TASK)
        .enumerate()
        .for_each_init(
            || (vec![0f32; l], vec![0f32; hd]),
            |(scores, acc), (r, o_row)| {
                let q_row = &q[r * d..][..d];
                let keys = &k[(r / s) * l * d..][..l * d];
                let values = &v[(r / s) * l * d..][..l * d];
                for h in 0..d / hd {
                    let qh = &q_row[h * hd..][..hd];
                    let mut max = f32::NEG_INFINITY;
                    for (j, score) in scores.iter_mut().enumerate() {
                        let kh = &keys[j * d + h * hd..][..hd];
                        let dot: f32 = qh
                            .iter()
                            .zip(kh)
                            .map(|(a, b)| a.to_f32() * b.to_f32())
                            .sum();
                        *score = dot * scale;
                        max = max.max(*score);
                    }
                    let mut total = 0f32;
                    acc.fill(0.0);
                    for (j, score) in scores.iter().enumerate() {
                        let p = (score - max).exp();
                        total += p;
                        let vh = &values[j * d + h * hd..][..hd];
                        for (a, x) in acc.iter_mut().zip(vh) {
                            *a += p * x.to_f32();
                        }
                    }
                    for (out, a) in o_row[h * hd..][..hd].iter_mut().zip(acc.iter()) {
                        *out = T::from_f32(a / total);
                    }
                }
            },
        );
}

/// `CausalConv3d` over `plan.conv`'s sizes: output pixel (n, t, i, j) and channel k sums, in
/// float32, `X[n, t + a, i + b − kh/2, j + c − kw/2, ·] · W[k, a, b, c, ·]` over the taps whose
/// pixel is inside the frame (zero padding in space, none in time), rounded once; output pixels
/// in parallel. The weights are laid out tap by tap, channel by channel, with the K outputs
/// innermost, so that each input value updates all K sums in one contiguous (vectorised) pass.
pub(crate) fn causal_conv3d<T: Element>(plan: &Plan, x: &[T], w: &[T], y: &mut [T]) {
    let g = plan.conv;
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

/// One call of `op` on the CPU provider: reads the inputs, checks them against the contract,
/// allocates the outputs ([`Op::output_shape`]) and runs the kernel.
pub(super) fn compute<T: Element>(op: Op, attrs: &Attrs, ctx: &ComputeContext) -> ort::Result<()> {
    let names = op.inputs();
    let input = |i: usize| {
        ctx.input(i)?
            .ok_or_else(|| op_error(op, format!("input {} is missing", names[i])))
    };
    // The inputs the operator writes (K and V of QkvNormRopeCache) are not borrowed as slices:
    // they are written through ONNX Runtime's pointer below.
    let in_place = op.in_place_inputs();
    let mut values = Vec::with_capacity(names.len());
    let mut written = Vec::with_capacity(in_place.len());
    for i in 0..names.len() {
        if in_place.contains(&i) {
            written.push(input(i)?.downcast::<DynTensorValueType>()?);
            values.push(None);
        } else {
            values.push(Some(input(i)?));
        }
    }
    let mut written_shapes = written.iter().map(|tensor| &**tensor.shape());
    let mut inputs: Vec<(&[i64], &[T])> = Vec::with_capacity(names.len());
    for (value, name) in values.iter().zip(names) {
        let Some(value) = value else {
            let shape = written_shapes
                .next()
                .expect("one written tensor per in-place input");
            inputs.push((shape, &[]));
            continue;
        };
        let (shape, data) = value
            .try_extract_tensor::<T>()
            .map_err(|e| op_error(op, format!("input {name}: {e}")))?;
        inputs.push((shape, data));
    }
    let shapes: Vec<&[i64]> = inputs.iter().map(|(shape, _)| *shape).collect();
    let plan = plan(op, attrs, &shapes).map_err(ort::Error::new)?;
    let data: Vec<&[T]> = inputs.iter().map(|(_, data)| *data).collect();
    let output = |idx: usize| {
        ctx.output(idx, op.output_shape(&shapes, idx))?
            .ok_or_else(|| op_error(op, format!("ONNX Runtime gave no output {idx}")))
    };
    match op {
        Op::BiasRmsNormRope | Op::BiasRmsNorm | Op::PrefixBiasRmsNorm => {
            let mut y = output(0)?;
            let (_, y) = y.try_extract_tensor_mut::<T>()?;
            let epilogue = match op {
                Op::BiasRmsNormRope => Epilogue::Rope(data[3], data[4]),
                _ if attrs.silu => Epilogue::Silu,
                _ => Epilogue::Plain,
            };
            // PrefixBiasRmsNorm: the prefix's rows first (none for the others), the normed rows
            // after them, and the last prefix-sized rows again as the tail.
            let prefix_len = plan.prefix_rows * plan.d;
            let (prefix, rest) = y.split_at_mut(prefix_len);
            if op == Op::PrefixBiasRmsNorm {
                prefix.copy_from_slice(data[3]);
            }
            bias_rms_norm(
                &plan,
                attrs.epsilon,
                data[0],
                data[1],
                data[2],
                epilogue,
                rest,
            );
            if op == Op::PrefixBiasRmsNorm {
                let mut tail = output(1)?;
                let (_, tail) = tail.try_extract_tensor_mut::<T>()?;
                tail.copy_from_slice(&y[y.len() - prefix_len..]);
            }
        }
        Op::GatedResidualLayerNorm => {
            let mut s = output(0)?;
            let mut y = output(1)?;
            let (_, s) = s.try_extract_tensor_mut::<T>()?;
            let (_, y) = y.try_extract_tensor_mut::<T>()?;
            gated_residual_layer_norm(
                &plan,
                attrs.epsilon,
                data[0],
                data[1],
                data[2],
                data[3],
                data[4],
                data[5],
                s,
                y,
            );
        }
        Op::BiasGelu => {
            let mut y = output(0)?;
            let (_, y) = y.try_extract_tensor_mut::<T>()?;
            bias_gelu(&plan, data[0], data[1], y);
        }
        Op::Attention => {
            let mut o = output(0)?;
            let (_, o) = o.try_extract_tensor_mut::<T>()?;
            attention(&plan, data[0], data[1], data[2], o);
        }
        Op::MatMulBiasGelu => {
            let mut y = output(0)?;
            let (_, y) = y.try_extract_tensor_mut::<T>()?;
            matmul_bias_gelu(&plan, data[0], data[1], data[2], y);
        }
        Op::CausalConv3d => {
            let mut y = output(0)?;
            let (_, y) = y.try_extract_tensor_mut::<T>()?;
            causal_conv3d(&plan, data[0], data[1], y);
        }
        Op::QkvNormRopeCache => {
            let mut q = output(0)?;
            let (_, q) = q.try_extract_tensor_mut::<T>()?;
            let cache = |tensor: &ort::value::ValueRef<'_, DynTensorValueType>| {
                let len = tensor.shape().iter().product::<i64>().max(0) as usize;
                // SAFETY: ONNX Runtime's writable pointer (GetTensorMutableData) to the tensor's
                // `len` elements of T (its type was checked with the others' by the kernel's
                // registration and its shape by `plan`), host memory on the CPU provider. No slice
                // of it is alive (see `in_place` above), and K and V are distinct inputs: the
                // graph's contract gives the node buffers that nothing reads before it has run.
                unsafe {
                    std::slice::from_raw_parts_mut(tensor.data_ptr().cast::<T>().cast_mut(), len)
                }
            };
            let (k, v) = (cache(&written[0]), cache(&written[1]));
            qkv_norm_rope_cache(
                &plan,
                attrs.epsilon,
                data[0],
                [data[1], data[2], data[3], data[4]],
                (data[5], data[6]),
                q,
                k,
                v,
            );
        }
    }
    Ok(())
}
