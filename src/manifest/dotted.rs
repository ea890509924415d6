//! A manifest's settings as dotted keys (`method.clean_sigma`) and back: how layers are merged
//! key by key and the merged keys deserialised as one table.

use std::collections::BTreeMap;

use super::layers::Entry;

/// Calls `f` with every leaf of `v` under its dotted key (`method.clean_sigma`).
pub(super) fn flatten(prefix: &str, v: &toml::Value, f: &mut dyn FnMut(&str, &toml::Value)) {
    match v {
        toml::Value::Table(t) => {
            for (k, v) in t {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, f);
            }
        }
        other => f(prefix, other),
    }
}

/// The nested TOML table of dotted keys and their values: `flatten`'s inverse.
pub(super) fn unflatten(entries: &BTreeMap<String, Entry>) -> toml::Value {
    let mut root = toml::Table::new();
    for (key, e) in entries {
        let mut table = &mut root;
        let mut parts = key.split('.').peekable();
        while let Some(part) = parts.next() {
            if parts.peek().is_none() {
                table.insert(part.to_string(), e.value.clone());
            } else {
                table = table
                    .entry(part.to_string())
                    .or_insert_with(|| toml::Value::Table(toml::Table::new()))
                    .as_table_mut()
                    .expect("keys of one manifest never collide with tables");
            }
        }
    }
    toml::Value::Table(root)
}
