//! The manifest's JSON Schema, generated from the Rust types, and the catalogue of setting keys
//! read from it: the schema is the one place that knows every key, its type and its class.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use serde_json::Value as Json;

use super::settings::{Manifest, Sweep};

/// The table of a manifest that is not a setting: `[sweep]` ([`super::sweep`]).
pub const SWEEP_TABLE: &str = "sweep";

/// The JSON Schema of a manifest file, as committed in `schemas/manifest.schema.json`.
pub fn manifest_schema() -> Json {
    let mut generator = schemars::generate::SchemaSettings::draft2020_12().into_generator();
    // `[sweep]` is in the schema (editors check it) but is not a field of `Manifest`: its keys
    // are not settings, so they must not become `--set` or environment keys.
    let sweep = generator.subschema_for::<Sweep>();
    let schema = generator.into_root_schema_for::<Manifest>();
    let mut json = serde_json::to_value(schema).expect("a schema is always JSON");
    json["properties"][SWEEP_TABLE] = serde_json::to_value(sweep).expect("a schema is JSON");
    // Every key of a manifest file is optional: the layers below supply what it leaves out.
    strip_required(&mut json);
    json
}

/// The committed schema file's text.
pub fn manifest_schema_text() -> String {
    let mut text = serde_json::to_string_pretty(&manifest_schema()).expect("schema serialises");
    text.push('\n');
    text
}

fn strip_required(v: &mut Json) {
    match v {
        Json::Object(map) => {
            map.remove("required");
            map.values_mut().for_each(strip_required);
        }
        Json::Array(items) => items.iter_mut().for_each(strip_required),
        _ => {}
    }
}

/// How a textual override (environment variable, `--set`) is turned into a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueType {
    Bool,
    Integer,
    Float,
    IntegerArray,
    /// Strings and anything parsed from a string by its own type (index lists, enums).
    Text,
}

/// The class of a method setting: flag (extra args), config (manifest or `--set`) or export
/// (fixed by the bundle).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MethodClass {
    /// Settable anywhere, including extra args.
    Flag,
    /// Manifest or `--set` only.
    Config,
    /// Fixed by the exported bundle.
    Export,
}

impl MethodClass {
    pub fn as_str(self) -> &'static str {
        match self {
            MethodClass::Flag => "flag",
            MethodClass::Config => "config",
            MethodClass::Export => "export",
        }
    }
}

/// One settable key.
#[derive(Debug, Clone)]
pub struct KeyInfo {
    pub ty: ValueType,
    pub class: Option<MethodClass>,
}

/// Every leaf key of a manifest (dotted), with its type and class.
pub fn keys() -> &'static BTreeMap<String, KeyInfo> {
    static KEYS: OnceLock<BTreeMap<String, KeyInfo>> = OnceLock::new();
    KEYS.get_or_init(|| {
        let schema = manifest_schema();
        let mut out = BTreeMap::new();
        walk(&schema, &schema, "", &mut out);
        out
    })
}

fn resolve<'a>(root: &'a Json, node: &'a Json) -> &'a Json {
    if let Some(Json::String(r)) = node.get("$ref") {
        let name = r.rsplit('/').next().unwrap_or_default();
        if let Some(target) = root.get("$defs").and_then(|d| d.get(name)) {
            return resolve(root, target);
        }
    }
    // Option<T> is `anyOf [T, null]`: the key's type is T's.
    if let Some(Json::Array(branches)) = node.get("anyOf") {
        let non_null: Vec<&Json> = branches
            .iter()
            .filter(|b| b.get("type") != Some(&Json::String("null".into())))
            .collect();
        if non_null.len() == 1 {
            return resolve(root, non_null[0]);
        }
    }
    node
}

fn walk(root: &Json, node: &Json, prefix: &str, out: &mut BTreeMap<String, KeyInfo>) {
    let node = resolve(root, node);
    let Some(Json::Object(props)) = node.get("properties") else {
        return;
    };
    for (name, prop) in props {
        if prefix.is_empty() && name == SWEEP_TABLE {
            continue;
        }
        let key = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}.{name}")
        };
        let class = prop
            .get("x-unstep-class")
            .and_then(Json::as_str)
            .map(|c| match c {
                "flag" => MethodClass::Flag,
                "config" => MethodClass::Config,
                _ => MethodClass::Export,
            });
        let target = resolve(root, prop);
        if target.get("properties").is_some() {
            walk(root, target, &key, out);
            continue;
        }
        out.insert(
            key,
            KeyInfo {
                ty: value_type(target),
                class,
            },
        );
    }
}

fn value_type(node: &Json) -> ValueType {
    let ty = match node.get("type") {
        Some(Json::String(t)) => t.as_str(),
        Some(Json::Array(ts)) => ts
            .iter()
            .filter_map(Json::as_str)
            .find(|t| *t != "null")
            .unwrap_or(""),
        _ => "",
    };
    match ty {
        "boolean" => ValueType::Bool,
        "integer" => ValueType::Integer,
        "number" => ValueType::Float,
        "array" => ValueType::IntegerArray,
        _ => ValueType::Text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_cover_every_table_with_types_and_classes() {
        let keys = keys();
        let expect = [
            ("prompts.indices", ValueType::Text, None),
            ("warmup.repeats", ValueType::Integer, None),
            ("timing.quiet_measurement", ValueType::Bool, None),
            (
                "method.clean_sigma",
                ValueType::Float,
                Some(MethodClass::Flag),
            ),
            (
                "method.timestep_shift",
                ValueType::Float,
                Some(MethodClass::Config),
            ),
            (
                "method.svd_rank",
                ValueType::Text,
                Some(MethodClass::Export),
            ),
            (
                "method.denoising_steps",
                ValueType::IntegerArray,
                Some(MethodClass::Flag),
            ),
            ("shards.gpu_map", ValueType::IntegerArray, None),
            ("evaluation.command", ValueType::Text, None),
            ("cache.scope", ValueType::Text, None),
        ];
        for (key, ty, class) in expect {
            let info = keys.get(key).unwrap_or_else(|| panic!("missing {key}"));
            assert_eq!(info.ty, ty, "{key}");
            assert_eq!(info.class, class, "{key}");
        }
        assert!(!keys.contains_key("method"));
    }
}
