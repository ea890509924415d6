//! Rewrites of a bundle's ONNX model before its session is built, on the protobuf bytes: the
//! nodes a rewrite is about are decoded and encoded again, every other field of the model is
//! copied byte for byte (initializers, other nodes, their order and any field this reader does not
//! know), so that the rewritten graph differs from the exported one in those nodes alone.
//!
//! One rewrite exists: the fused DiT's self-attention, the runner's `ai.unstep::Attention(Q, K,
//! V)` (attribute `num_heads`), as ONNX Runtime's `com.microsoft::MultiHeadAttention(query, key,
//! value)` with the same `num_heads`, so that the CUDA provider runs it with the kernel its
//! `sdpa_kernel` option selects. The two have one contract: Q `[B, S, D]`, K and V `[B, L, D]`
//! (`MultiHeadAttention`'s unpacked form; the exporter writes Q, K and V at rank 3), heads of
//! `D / num_heads` columns, scores scaled by `1 / sqrt(D / num_heads)` (`MultiHeadAttention`'s
//! default scale), a softmax over all L keys (no mask, no bias, no past) and O of Q's shape.
//!
//! Only the model's main graph is read: the exporter writes no subgraphs or functions.

use std::ops::Range;

/// The protobuf field numbers this module reads (onnx.proto3).
mod field {
    /// `ModelProto.graph`.
    pub(super) const MODEL_GRAPH: u64 = 7;
    /// `ModelProto.opset_import`.
    pub(super) const MODEL_OPSET_IMPORT: u64 = 8;
    /// `OperatorSetIdProto.domain` and `.version`.
    pub(super) const OPSET_DOMAIN: u64 = 1;
    pub(super) const OPSET_VERSION: u64 = 2;
    /// `GraphProto.node`.
    pub(super) const GRAPH_NODE: u64 = 1;
    /// `NodeProto.input`, `.output`, `.name`, `.op_type`, `.attribute`, `.domain`.
    pub(super) const NODE_INPUT: u64 = 1;
    pub(super) const NODE_OUTPUT: u64 = 2;
    pub(super) const NODE_NAME: u64 = 3;
    pub(super) const NODE_OP_TYPE: u64 = 4;
    pub(super) const NODE_ATTRIBUTE: u64 = 5;
    pub(super) const NODE_DOMAIN: u64 = 7;
    /// `AttributeProto.name`, `.i`, `.type`.
    pub(super) const ATTR_NAME: u64 = 1;
    pub(super) const ATTR_I: u64 = 3;
    pub(super) const ATTR_TYPE: u64 = 20;
}

/// `AttributeProto.AttributeType.INT`.
const ATTR_TYPE_INT: u64 = 2;

/// The runner's self-attention operator, as the exporter writes it.
const RUNNER_ATTENTION: (&str, &str) = ("ai.unstep", "Attention");
/// ONNX Runtime's operator it becomes, and the version of its domain that has it.
const MULTI_HEAD_ATTENTION: (&str, &str) = ("com.microsoft", "MultiHeadAttention");
const MICROSOFT_OPSET: u64 = 1;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RewriteError {
    #[error("the model is not ONNX protobuf as expected: {0}")]
    Malformed(String),
    #[error("node {node:?} ({domain}::{op}) is not as the rewrite expects: {problem}")]
    UnexpectedNode {
        node: String,
        domain: &'static str,
        op: &'static str,
        problem: String,
    },
    #[error("the model's graph has no {0} node to rewrite")]
    NothingToRewrite(&'static str),
}

/// `model` (a serialised `ModelProto`) with each `ai.unstep::Attention` node of its graph as
/// `com.microsoft::MultiHeadAttention` ([module docs](self)), and an import of `com.microsoft`
/// opset 1 added when the model has none. A model without such a node is an error: the caller
/// asked for a rewrite that would change nothing.
pub(crate) fn attention_to_multi_head_attention(model: &[u8]) -> Result<Vec<u8>, RewriteError> {
    let mut graph_field = None;
    let mut imports_microsoft = false;
    for f in fields(model) {
        let f = f?;
        match (f.number, f.payload) {
            (field::MODEL_GRAPH, Payload::Bytes(graph)) => {
                if graph_field.is_some() {
                    return Err(malformed("the model has two graph fields"));
                }
                graph_field = Some((f.span, graph));
            }
            (field::MODEL_OPSET_IMPORT, Payload::Bytes(opset)) => {
                imports_microsoft |= opset_domain(opset)? == MULTI_HEAD_ATTENTION.0;
            }
            _ => {}
        }
    }
    let Some((graph_span, graph)) = graph_field else {
        return Err(malformed("the model has no graph"));
    };
    // The nodes that change, as (their field's bytes in `graph`, the new field).
    let mut replaced: Vec<(Range<usize>, Vec<u8>)> = Vec::new();
    for f in fields(graph) {
        let f = f?;
        if let (field::GRAPH_NODE, Payload::Bytes(node)) = (f.number, f.payload)
            && let Some(new_node) = attention_node(node)?
        {
            let mut encoded = Vec::with_capacity(new_node.len() + 8);
            put_bytes(&mut encoded, field::GRAPH_NODE, &new_node);
            replaced.push((f.span, encoded));
        }
    }
    if replaced.is_empty() {
        return Err(RewriteError::NothingToRewrite("ai.unstep::Attention"));
    }
    let graph_len = replaced
        .iter()
        .fold(graph.len(), |len, (old, new)| len - old.len() + new.len());
    let mut out = Vec::with_capacity(model.len() + 64 + graph_len - graph.len());
    out.extend_from_slice(&model[..graph_span.start]);
    put_key(&mut out, field::MODEL_GRAPH, WIRE_LEN);
    put_varint(&mut out, graph_len as u64);
    let mut at = 0;
    for (old, new) in &replaced {
        out.extend_from_slice(&graph[at..old.start]);
        out.extend_from_slice(new);
        at = old.end;
    }
    out.extend_from_slice(&graph[at..]);
    out.extend_from_slice(&model[graph_span.end..]);
    if !imports_microsoft {
        let mut opset = Vec::new();
        put_bytes(
            &mut opset,
            field::OPSET_DOMAIN,
            MULTI_HEAD_ATTENTION.0.as_bytes(),
        );
        put_key(&mut opset, field::OPSET_VERSION, WIRE_VARINT);
        put_varint(&mut opset, MICROSOFT_OPSET);
        put_bytes(&mut out, field::MODEL_OPSET_IMPORT, &opset);
    }
    Ok(out)
}

/// The `NodeProto` `node` as `MultiHeadAttention` when it is the runner's `Attention`, after
/// checking that it has the inputs, output and attribute the contract has; `None` for any other
/// node. Fields other than the operator and its domain keep their bytes and order.
fn attention_node(node: &[u8]) -> Result<Option<Vec<u8>>, RewriteError> {
    let (mut op, mut domain) = ("", "");
    let (mut inputs, mut outputs, mut name) = (Vec::new(), 0usize, String::new());
    let mut attributes = Vec::new();
    for f in fields(node) {
        let f = f?;
        match (f.number, f.payload) {
            (field::NODE_OP_TYPE, Payload::Bytes(b)) => op = utf8(b)?,
            (field::NODE_DOMAIN, Payload::Bytes(b)) => domain = utf8(b)?,
            (field::NODE_INPUT, Payload::Bytes(b)) => inputs.push(utf8(b)?),
            (field::NODE_OUTPUT, Payload::Bytes(_)) => outputs += 1,
            (field::NODE_NAME, Payload::Bytes(b)) => name = utf8(b)?.to_string(),
            (field::NODE_ATTRIBUTE, Payload::Bytes(b)) => attributes.push(b),
            _ => {}
        }
    }
    if (domain, op) != RUNNER_ATTENTION {
        return Ok(None);
    }
    let unexpected = |problem: String| RewriteError::UnexpectedNode {
        node: name.clone(),
        domain: RUNNER_ATTENTION.0,
        op: RUNNER_ATTENTION.1,
        problem,
    };
    if inputs.len() != 3 || inputs.iter().any(|i| i.is_empty()) {
        return Err(unexpected(format!(
            "it has inputs {inputs:?}, not the three Q, K and V"
        )));
    }
    if outputs != 1 {
        return Err(unexpected(format!("it has {outputs} outputs, not one")));
    }
    let [attribute] = attributes[..] else {
        return Err(unexpected(format!(
            "it has {} attributes, not num_heads alone",
            attributes.len()
        )));
    };
    let heads = num_heads(attribute)?
        .ok_or_else(|| unexpected("its attribute is not num_heads, an integer".to_string()))?;
    if heads <= 0 {
        return Err(unexpected(format!("num_heads is {heads}")));
    }
    let mut out = Vec::with_capacity(node.len() + 16);
    for f in fields(node) {
        let f = f?;
        match f.number {
            field::NODE_OP_TYPE => put_bytes(&mut out, f.number, MULTI_HEAD_ATTENTION.1.as_bytes()),
            field::NODE_DOMAIN => put_bytes(&mut out, f.number, MULTI_HEAD_ATTENTION.0.as_bytes()),
            _ => out.extend_from_slice(&node[f.span]),
        }
    }
    Ok(Some(out))
}

/// The value of an `AttributeProto` named `num_heads` of type INT, `None` for another attribute.
fn num_heads(attribute: &[u8]) -> Result<Option<i64>, RewriteError> {
    let (mut name, mut value, mut ty) = ("", None, None);
    for f in fields(attribute) {
        let f = f?;
        match (f.number, f.payload) {
            (field::ATTR_NAME, Payload::Bytes(b)) => name = utf8(b)?,
            // int64 on the wire: a negative value is its two's complement.
            (field::ATTR_I, Payload::Varint(v)) => value = Some(v as i64),
            (field::ATTR_TYPE, Payload::Varint(v)) => ty = Some(v),
            _ => {}
        }
    }
    Ok(match (name, ty) {
        ("num_heads", Some(ATTR_TYPE_INT)) => Some(value.unwrap_or(0)),
        _ => None,
    })
}

/// The domain of an `OperatorSetIdProto` (`""`, the default domain, when absent).
fn opset_domain(opset: &[u8]) -> Result<&str, RewriteError> {
    let mut domain = "";
    for f in fields(opset) {
        if let Field {
            number: field::OPSET_DOMAIN,
            payload: Payload::Bytes(b),
            ..
        } = f?
        {
            domain = utf8(b)?;
        }
    }
    Ok(domain)
}

fn utf8(b: &[u8]) -> Result<&str, RewriteError> {
    std::str::from_utf8(b).map_err(|_| malformed("a string field is not UTF-8"))
}

fn malformed(problem: &str) -> RewriteError {
    RewriteError::Malformed(problem.to_string())
}

const WIRE_VARINT: u64 = 0;
const WIRE_I64: u64 = 1;
const WIRE_LEN: u64 = 2;
const WIRE_I32: u64 = 5;

/// A field's value as read: a number, or the bytes of a string, bytes or message field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Payload<'a> {
    Varint(u64),
    Fixed,
    Bytes(&'a [u8]),
}

/// One field of a message: its number, value and where its bytes (key included) lie.
#[derive(Debug)]
struct Field<'a> {
    number: u64,
    payload: Payload<'a>,
    span: Range<usize>,
}

/// The fields of a serialised message in their order, each checked to lie inside it; groups
/// (wire types 3 and 4, which ONNX does not use) are errors.
fn fields(msg: &[u8]) -> impl Iterator<Item = Result<Field<'_>, RewriteError>> + '_ {
    let mut at = 0;
    let mut failed = false;
    std::iter::from_fn(move || {
        if at >= msg.len() || failed {
            return None;
        }
        let field = read_field(msg, &mut at);
        failed = field.is_err();
        Some(field)
    })
}

fn read_field<'a>(msg: &'a [u8], at: &mut usize) -> Result<Field<'a>, RewriteError> {
    let start = *at;
    let key = read_varint(msg, at)?;
    let number = key >> 3;
    if number == 0 {
        return Err(malformed("a field has number 0"));
    }
    let take = |at: &mut usize, n: usize| -> Result<&'a [u8], RewriteError> {
        let end = at
            .checked_add(n)
            .filter(|&end| end <= msg.len())
            .ok_or_else(|| malformed("a field runs past the end of its message"))?;
        let bytes = &msg[*at..end];
        *at = end;
        Ok(bytes)
    };
    let payload = match key & 7 {
        WIRE_VARINT => Payload::Varint(read_varint(msg, at)?),
        WIRE_I64 => {
            take(at, 8)?;
            Payload::Fixed
        }
        WIRE_LEN => {
            let len = usize::try_from(read_varint(msg, at)?)
                .map_err(|_| malformed("a length does not fit in memory"))?;
            Payload::Bytes(take(at, len)?)
        }
        WIRE_I32 => {
            take(at, 4)?;
            Payload::Fixed
        }
        wire => return Err(RewriteError::Malformed(format!("wire type {wire}"))),
    };
    Ok(Field {
        number,
        payload,
        span: start..*at,
    })
}

fn read_varint(msg: &[u8], at: &mut usize) -> Result<u64, RewriteError> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let &byte = msg
            .get(*at)
            .ok_or_else(|| malformed("a number runs past the end of its message"))?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(malformed("a number is longer than ten bytes"))
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

fn put_key(out: &mut Vec<u8>, number: u64, wire: u64) {
    put_varint(out, number << 3 | wire);
}

fn put_bytes(out: &mut Vec<u8>, number: u64, bytes: &[u8]) {
    put_key(out, number, WIRE_LEN);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

#[cfg(test)]
mod tests;
