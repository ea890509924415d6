//! One override layer (a flat map from dotted key to value and origin, each key set once) and
//! how an override's text becomes a value of its key's type: what `layers.rs` builds its layers
//! from and `extra_args.rs` sets its flags with.

use std::collections::BTreeMap;

use super::diagnostic::{Diagnostic, Excerpt, Origin};
use super::schema::{ValueType, keys};

/// One setting in one layer.
#[derive(Debug, Clone)]
pub struct Entry {
    pub value: toml::Value,
    pub origin: Origin,
    pub excerpt: Option<Excerpt>,
}

/// A flat map of settings from one layer.
#[derive(Debug, Clone, Default)]
pub struct Layer {
    pub entries: BTreeMap<String, Entry>,
}

impl Layer {
    /// Adds a setting; a key already set in this layer is an error naming both places.
    pub fn set(&mut self, key: &str, entry: Entry, errors: &mut Vec<Diagnostic>) {
        if let Some(first) = self.entries.get(key) {
            if first.value == entry.value && first.origin == entry.origin {
                return;
            }
            errors.push(
                Diagnostic::new(format!(
                    "`{key}` is set twice in one layer (first by {})",
                    first.origin
                ))
                .at(entry.origin.clone())
                .excerpt(entry.excerpt.clone())
                .hint("set it once; the same layer never silently overrides itself"),
            );
            return;
        }
        self.entries.insert(key.to_string(), entry);
    }
}

/// Why an override's text is not a value of its key's type; the message reads after the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OverrideValueError {
    #[error("`{0}` is not a boolean; use 1/0 or true/false")]
    NotBoolean(String),
    #[error("`{0}` is not an integer")]
    NotInteger(String),
    #[error("`{0}` is not a number")]
    NotNumber(String),
    /// Text in quotes that TOML reads as something other than a string.
    #[error("`{0}` is not a quoted string")]
    NotQuotedString(String),
    /// Text in quotes that is not TOML.
    #[error("`{0}` is not a TOML string; write it without quotes, or as a TOML string")]
    NotTomlString(String),
}

/// Converts an override's text to a value of the key's type. Text keys stay strings and are
/// checked by their own types when the layers are merged.
pub fn parse_text(key: &str, text: &str) -> Result<toml::Value, OverrideValueError> {
    let ty = keys().get(key).map_or(ValueType::Text, |k| k.ty);
    let t = text.trim();
    match ty {
        ValueType::Bool => match t.to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => Ok(toml::Value::Boolean(true)),
            "0" | "false" | "no" | "off" => Ok(toml::Value::Boolean(false)),
            _ => Err(OverrideValueError::NotBoolean(t.to_string())),
        },
        ValueType::Integer => t
            .parse::<i64>()
            .map(toml::Value::Integer)
            .map_err(|_| OverrideValueError::NotInteger(t.to_string())),
        ValueType::Float => t
            .parse::<f64>()
            .map(toml::Value::Float)
            .map_err(|_| OverrideValueError::NotNumber(t.to_string())),
        ValueType::IntegerArray => t
            .trim_start_matches('[')
            .trim_end_matches(']')
            .split(',')
            .filter(|p| !p.trim().is_empty())
            .map(|p| {
                p.trim()
                    .parse::<i64>()
                    .map(toml::Value::Integer)
                    .map_err(|_| OverrideValueError::NotInteger(p.trim().to_string()))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(toml::Value::Array),
        ValueType::Text => Ok(toml::Value::String(unquote(t)?)),
    }
}

/// A text value as given, or the string inside TOML quotes (`"x"`, `'x'`), as the value would be
/// written in a manifest: `--set name="abc"` is the name `abc`, not `"abc"`.
pub(super) fn unquote(t: &str) -> Result<String, OverrideValueError> {
    let quoted = t.len() >= 2
        && ((t.starts_with('"') && t.ends_with('"')) || (t.starts_with('\'') && t.ends_with('\'')));
    if !quoted {
        return Ok(t.to_string());
    }
    match toml::from_str::<toml::Table>(&format!("v = {t}")) {
        Ok(table) => match table.get("v") {
            Some(toml::Value::String(s)) => Ok(s.clone()),
            _ => Err(OverrideValueError::NotQuotedString(t.to_string())),
        },
        Err(_) => Err(OverrideValueError::NotTomlString(t.to_string())),
    }
}
