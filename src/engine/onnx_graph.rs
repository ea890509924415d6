//! Small ONNX graphs the runner builds at start-up, so that the arithmetic between the bundle's
//! graphs runs where the tensors are (on the GPU, on the CUDA provider) instead of on the host:
//! the scheduler update between DiT passes, the de-normalisation of one latent frame for the VAE
//! and the clamp + uint8 layout of the decoded frames.
//!
//! They are written as ONNX protobuf bytes by hand (a few message kinds are enough), which keeps
//! the bundle contract unchanged and needs no protobuf dependency. Every op does exactly the float32
//! operations the exporter's reference does, in the same order.

use ort::value::TensorElementType;

/// ONNX `TensorProto.DataType` of an element type the runner uses.
fn onnx_type(ty: TensorElementType) -> u64 {
    match ty {
        TensorElementType::Float32 => 1,
        TensorElementType::Uint8 => 2,
        TensorElementType::Int64 => 7,
        TensorElementType::Float16 => 10,
        TensorElementType::Bfloat16 => 16,
        other => unreachable!("no small graph uses {other:?}"),
    }
}

/// A protobuf message being written.
#[derive(Default)]
struct Msg(Vec<u8>);

impl Msg {
    fn varint(&mut self, mut v: u64) {
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                self.0.push(byte);
                return;
            }
            self.0.push(byte | 0x80);
        }
    }

    fn key(&mut self, field: u64, wire: u64) {
        self.varint(field << 3 | wire);
    }

    fn int(&mut self, field: u64, v: u64) -> &mut Self {
        self.key(field, 0);
        self.varint(v);
        self
    }

    fn bytes(&mut self, field: u64, b: &[u8]) -> &mut Self {
        self.key(field, 2);
        self.varint(b.len() as u64);
        self.0.extend_from_slice(b);
        self
    }

    fn str(&mut self, field: u64, s: &str) -> &mut Self {
        self.bytes(field, s.as_bytes())
    }

    fn msg(&mut self, field: u64, m: Msg) -> &mut Self {
        self.bytes(field, &m.0)
    }

    #[cfg(test)]
    fn fixed32(&mut self, field: u64, v: u32) -> &mut Self {
        self.key(field, 5);
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
}

/// A graph under construction: nodes, inputs and outputs of unknown shape, scalar initializers.
struct Graph {
    g: Msg,
}

impl Graph {
    fn new(name: &str) -> Self {
        let mut g = Msg::default();
        g.str(2, name);
        Self { g }
    }

    fn value_info(name: &str, ty: TensorElementType) -> Msg {
        let mut tensor = Msg::default();
        tensor.int(1, onnx_type(ty));
        let mut type_proto = Msg::default();
        type_proto.msg(1, tensor);
        let mut vi = Msg::default();
        vi.str(1, name).msg(2, type_proto);
        vi
    }

    fn input(&mut self, name: &str, ty: TensorElementType) -> &mut Self {
        self.g.msg(11, Self::value_info(name, ty));
        self
    }

    fn output(&mut self, name: &str, ty: TensorElementType) -> &mut Self {
        self.g.msg(12, Self::value_info(name, ty));
        self
    }

    /// A float32 scalar initializer.
    fn scalar(&mut self, name: &str, value: f32) -> &mut Self {
        let mut t = Msg::default();
        t.int(2, 1).str(8, name).bytes(9, &value.to_le_bytes());
        self.g.msg(5, t);
        self
    }

    fn node(&mut self, op: &str, inputs: &[&str], outputs: &[&str], attrs: Vec<Msg>) -> &mut Self {
        self.node_in("", op, inputs, outputs, attrs)
    }

    /// A node of the operator `op` of `domain` (`""`: the default ONNX domain).
    fn node_in(
        &mut self,
        domain: &str,
        op: &str,
        inputs: &[&str],
        outputs: &[&str],
        attrs: Vec<Msg>,
    ) -> &mut Self {
        let mut n = Msg::default();
        for i in inputs {
            n.str(1, i);
        }
        for o in outputs {
            n.str(2, o);
        }
        n.str(3, &format!("{op}_{}", outputs[0])).str(4, op);
        if !domain.is_empty() {
            n.str(7, domain);
        }
        for a in attrs {
            n.msg(5, a);
        }
        self.g.msg(1, n);
        self
    }

    /// `Cast` to `ty`, or `Identity` when the value already has that type.
    fn cast(&mut self, from: TensorElementType, input: &str, to: TensorElementType, output: &str) {
        if from == to {
            self.node("Identity", &[input], &[output], vec![]);
        } else {
            self.node(
                "Cast",
                &[input],
                &[output],
                vec![attr_int("to", onnx_type(to))],
            );
        }
    }

    fn model(self) -> Vec<u8> {
        self.model_with(&[])
    }

    /// The model, importing opset 17 of the default domain and version 1 of each of `domains`.
    fn model_with(self, domains: &[&str]) -> Vec<u8> {
        let mut m = Msg::default();
        m.int(1, 8).str(2, "unstep").msg(7, self.g);
        let mut opset = Msg::default();
        opset.str(1, "").int(2, 17);
        m.msg(8, opset);
        for domain in domains {
            let mut opset = Msg::default();
            opset.str(1, domain).int(2, 1);
            m.msg(8, opset);
        }
        m.0
    }
}

fn attr_int(name: &str, v: u64) -> Msg {
    let mut a = Msg::default();
    a.str(1, name).int(3, v).int(20, 2);
    a
}

#[cfg(test)]
fn attr_float(name: &str, v: f32) -> Msg {
    let mut a = Msg::default();
    a.str(1, name).fixed32(2, v.to_bits()).int(20, 1);
    a
}

fn attr_ints(name: &str, v: &[u64]) -> Msg {
    let mut a = Msg::default();
    a.str(1, name);
    for &x in v {
        a.int(8, x);
    }
    a.int(20, 7);
    a
}

const F32: TensorElementType = TensorElementType::Float32;

/// `y = a * p + b * q` in float32 (q cast from `q_type` first), and `y_model = y` cast to the
/// bundle's float type for the DiT's `x` input. With (a, b) = (1, −σ) it is `x0 = x − σ·v`
/// (`1·x` and `x + (−σv)` are exact, so it equals the host's `x − σ·v` bit for bit); with
/// (1 − σ', σ') it is the re-noising `x = (1 − σ')·x0 + σ'·ε`.
pub fn axpby(q_type: TensorElementType, model: TensorElementType) -> Vec<u8> {
    let mut g = Graph::new("unstep_axpby");
    g.input("p", F32)
        .input("q", q_type)
        .input("a", F32)
        .input("b", F32)
        .output("y", F32)
        .output("y_model", model);
    g.cast(q_type, "q", F32, "q32");
    g.node("Mul", &["a", "p"], &["ap"], vec![])
        .node("Mul", &["b", "q32"], &["bq"], vec![])
        .node("Add", &["ap", "bq"], &["y"], vec![]);
    g.cast(F32, "y", model, "y_model");
    g.model()
}

/// One de-normalised latent frame for the VAE: `z = lat[:, :, idx] * std + mean` in float32,
/// cast to the bundle's float type. `lat` is one block `[1, C, F, h, w]`, `idx` int64 `[1]`,
/// `std` and `mean` `[1, C, 1, 1, 1]`.
pub fn latent_frame(model: TensorElementType) -> Vec<u8> {
    let mut g = Graph::new("unstep_latent_frame");
    g.input("lat", F32)
        .input("idx", TensorElementType::Int64)
        .input("std", F32)
        .input("mean", F32)
        .output("z", model);
    g.node(
        "Gather",
        &["lat", "idx"],
        &["frame"],
        vec![attr_int("axis", 2)],
    )
    .node("Mul", &["frame", "std"], &["scaled"], vec![])
    .node("Add", &["scaled", "mean"], &["z32"], vec![]);
    g.cast(F32, "z32", model, "z");
    g.model()
}

/// VAE frames `[1, 3, n, H, W]` → uint8 `[1, n, H, W, 3]`:
/// `v = (clamp(x, −1, 1) + 1) · 127.5` in float32, rounded half away from zero as
/// `floor(v) + (v − floor(v) ≥ 0.5)` (v ≥ 0; ONNX `Round` rounds half to even, which differs).
pub fn layout(model: TensorElementType) -> Vec<u8> {
    let mut g = Graph::new("unstep_layout");
    g.input("frames", model)
        .output("rgb", TensorElementType::Uint8)
        .scalar("lo", -1.0)
        .scalar("hi", 1.0)
        .scalar("one", 1.0)
        .scalar("scale", 127.5)
        .scalar("half", 0.5);
    g.cast(model, "frames", F32, "f");
    g.node("Clip", &["f", "lo", "hi"], &["c"], vec![])
        .node("Add", &["c", "one"], &["c1"], vec![])
        .node("Mul", &["c1", "scale"], &["v"], vec![])
        .node("Floor", &["v"], &["fl"], vec![])
        .node("Sub", &["v", "fl"], &["frac"], vec![])
        .node("GreaterOrEqual", &["frac", "half"], &["up"], vec![])
        .node("Cast", &["up"], &["up32"], vec![attr_int("to", 1)])
        .node("Add", &["fl", "up32"], &["r"], vec![])
        .node("Cast", &["r"], &["u8"], vec![attr_int("to", 2)])
        .node(
            "Transpose",
            &["u8"],
            &["rgb"],
            vec![attr_ints("perm", &[0, 2, 3, 4, 1])],
        );
    g.model()
}

/// `y = x`: host ↔ device copies (ONNX Runtime moves a bound input or output across devices).
pub fn identity(ty: TensorElementType) -> Vec<u8> {
    let mut g = Graph::new("unstep_identity");
    g.input("x", ty).output("y", ty);
    g.node("Identity", &["x"], &["y"], vec![]);
    g.model()
}

/// An attribute of a [`custom_node`].
#[cfg(test)]
pub(crate) enum Attr<'a> {
    Float(&'a str, f32),
    Int(&'a str, i64),
}

/// A graph of one node `op` of the custom operator domain `domain` (opset 1), for the tests of the
/// runner's own operators ([`super::kernels`]): graph inputs and outputs named as the node's, of
/// unknown shape, the inputs of the element types given and the outputs of element type `ty`.
#[cfg(test)]
pub(crate) fn custom_node(
    domain: &str,
    op: &str,
    ty: TensorElementType,
    inputs: &[(&str, TensorElementType)],
    outputs: &[&str],
    attrs: &[Attr],
) -> Vec<u8> {
    let mut g = Graph::new(&format!("unstep_{op}"));
    for (name, input_ty) in inputs {
        g.input(name, *input_ty);
    }
    for name in outputs {
        g.output(name, ty);
    }
    let attrs = attrs
        .iter()
        .map(|attr| match *attr {
            Attr::Float(name, v) => attr_float(name, v),
            Attr::Int(name, v) => attr_int(name, v as u64),
        })
        .collect();
    let names: Vec<&str> = inputs.iter().map(|(name, _)| *name).collect();
    g.node_in(domain, op, &names, outputs, attrs);
    g.model_with(&[domain])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_are_little_endian_base_128() {
        let mut m = Msg::default();
        m.varint(300);
        assert_eq!(m.0, [0xac, 0x02]);
        let mut m = Msg::default();
        m.int(1, 8);
        assert_eq!(m.0, [0x08, 0x08]);
    }
}
