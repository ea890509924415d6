//! Small value types of manifest settings. Each checks itself when it is parsed (`FromStr`, and
//! `Deserialize` through it), so a bad value is reported at the value's own location.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub use crate::vocab::values::{AttentionWindow, Bounded, DenoisingSteps, Positive, Sigma};

/// Implements `Serialize` as a string (via `Display`) and `Deserialize` from a string (via
/// `FromStr`), so the error of a bad value is the type's own message.
macro_rules! string_value {
    ($ty:ty) => {
        impl Serialize for $ty {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = Cow::<str>::deserialize(d)?;
                text.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

/// The name of a run: `[A-Za-z0-9._=-]+`, used as a folder name under `results/`. `=` is
/// allowed for the names of sweep points (`sigma001-clean_sigma=0.005`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RunName(String);

impl RunName {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Why a text is not a run name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunNameError {
    #[error("a run name cannot be empty")]
    Empty,
    /// `.` or `..`.
    #[error("`{0}` is not a usable run name")]
    DotName(String),
    /// A name holding a character outside `[A-Za-z0-9._=-]`: the name and the first such one.
    #[error("run name `{name}` contains `{bad}`; use letters, digits, `.`, `_`, `-` and `=` only")]
    Character { name: String, bad: char },
    /// A name longer than 200 bytes, by its length.
    #[error("a run name of {0} characters is too long for a folder name; use at most 200")]
    TooLong(usize),
}

impl FromStr for RunName {
    type Err = RunNameError;
    fn from_str(s: &str) -> Result<Self, RunNameError> {
        if s.is_empty() {
            return Err(RunNameError::Empty);
        }
        if s == "." || s == ".." {
            return Err(RunNameError::DotName(s.to_owned()));
        }
        if let Some(bad) = s
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '=')))
        {
            return Err(RunNameError::Character {
                name: s.to_owned(),
                bad,
            });
        }
        // The name is a folder's name (and part of lock and marker file names): file systems
        // hold 255 bytes, and 200 leaves room for what is added to it.
        if s.len() > 200 {
            return Err(RunNameError::TooLong(s.len()));
        }
        Ok(RunName(s.to_owned()))
    }
}

impl fmt::Display for RunName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

string_value!(RunName);

impl JsonSchema for RunName {
    fn schema_name() -> Cow<'static, str> {
        "RunName".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "pattern": "^[A-Za-z0-9._=-]+$",
            "maxLength": 200,
            "description": "A run name: letters, digits, `.`, `_`, `-` and `=`, at most 200 of them."
        })
    }
}

/// A selection of prompt indices: `all`, or a sorted comma list with ranges (`0-19`, `0,3,5-7`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IndexList {
    All,
    /// Sorted, without duplicates.
    List(Vec<u32>),
}

impl IndexList {
    /// The indices for a prompt file of `count` lines.
    pub fn resolve(&self, count: u32) -> Vec<u32> {
        match self {
            IndexList::All => (0..count).collect(),
            IndexList::List(v) => v.clone(),
        }
    }

    /// The largest index named, if the list is explicit.
    pub fn max(&self) -> Option<u32> {
        match self {
            IndexList::All => None,
            IndexList::List(v) => v.last().copied(),
        }
    }

    /// Formats indices compactly, joining runs into ranges: `[0,1,2,5]` → `0-2,5`.
    pub fn compact(indices: &[u32]) -> String {
        let mut out = String::new();
        let mut i = 0;
        while i < indices.len() {
            let start = indices[i];
            let mut end = start;
            while i + 1 < indices.len() && indices[i + 1] == end + 1 {
                i += 1;
                end = indices[i];
            }
            if !out.is_empty() {
                out.push(',');
            }
            if end > start {
                out.push_str(&format!("{start}-{end}"));
            } else {
                out.push_str(&start.to_string());
            }
            i += 1;
        }
        out
    }
}

/// Why a text is not an index list.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IndexListError {
    #[error("an index list cannot be empty; write `all` or e.g. `0-19`")]
    Empty,
    /// A list with an empty entry, as written.
    #[error("`{0}` has an empty entry; list indices like `0,3,5-7`")]
    EmptyEntry(String),
    /// An entry starting with `-`.
    #[error("`{0}` is negative; prompt indices count from 0 (e.g. `0-19`)")]
    Negative(String),
    /// A bound that is not a `u32`.
    #[error("`{0}` is not a prompt index; use non-negative integers like `0,3,5-7`")]
    NotIndex(String),
    /// A range `part` whose end `hi` is below its start `lo`.
    #[error("range `{part}` runs backwards; write `{hi}-{lo}`")]
    Backwards { part: String, lo: u32, hi: u32 },
    #[error("index {0} appears twice; list each prompt once")]
    Twice(u32),
    /// Index `index` listed after the larger `last`.
    #[error("indices must be sorted: {index} comes after {last}; sort the list")]
    Unsorted { index: u32, last: u32 },
}

impl FromStr for IndexList {
    type Err = IndexListError;
    fn from_str(s: &str) -> Result<Self, IndexListError> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("all") {
            return Ok(IndexList::All);
        }
        if s.is_empty() {
            return Err(IndexListError::Empty);
        }
        let mut out: Vec<u32> = Vec::new();
        for part in s.split(',') {
            let part = part.trim();
            if part.is_empty() {
                return Err(IndexListError::EmptyEntry(s.to_owned()));
            }
            if part.starts_with('-') {
                return Err(IndexListError::Negative(part.to_owned()));
            }
            let (lo, hi) = match part.split_once('-') {
                Some((a, b)) => (parse_index(a)?, parse_index(b)?),
                None => {
                    let i = parse_index(part)?;
                    (i, i)
                }
            };
            if hi < lo {
                return Err(IndexListError::Backwards {
                    part: part.to_owned(),
                    lo,
                    hi,
                });
            }
            for i in lo..=hi {
                if let Some(&last) = out.last() {
                    if i == last {
                        return Err(IndexListError::Twice(i));
                    }
                    if i < last {
                        return Err(IndexListError::Unsorted { index: i, last });
                    }
                }
                out.push(i);
            }
        }
        Ok(IndexList::List(out))
    }
}

fn parse_index(s: &str) -> Result<u32, IndexListError> {
    let s = s.trim();
    s.parse::<u32>()
        .map_err(|_| IndexListError::NotIndex(s.to_owned()))
}

impl fmt::Display for IndexList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IndexList::All => f.write_str("all"),
            IndexList::List(v) => f.write_str(&IndexList::compact(v)),
        }
    }
}

impl Serialize for IndexList {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for IndexList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = IndexList;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("`all`, a sorted list like \"0,3,5-7\", or a single index")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<IndexList, E> {
                v.parse().map_err(E::custom)
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<IndexList, E> {
                u32::try_from(v)
                    .map(|i| IndexList::List(vec![i]))
                    .map_err(|_| E::custom(format!("`{v}` is not a prompt index")))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<IndexList, E> {
                self.visit_i64(v as i64)
            }
        }
        d.deserialize_any(V)
    }
}

impl JsonSchema for IndexList {
    fn schema_name() -> Cow<'static, str> {
        "IndexList".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "`all`, or a sorted comma list of prompt indices with ranges (`0-19`, `0,3,5-7`), or one index.",
            "anyOf": [
                { "type": "string", "pattern": "^\\s*(all|\\d+(\\s*-\\s*\\d+)?(\\s*,\\s*\\d+(\\s*-\\s*\\d+)?)*)\\s*$" },
                { "type": "integer", "minimum": 0 }
            ]
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_lists_parse_and_reject() {
        let ok = [
            ("all", IndexList::All),
            ("0", IndexList::List(vec![0])),
            ("0-3", IndexList::List(vec![0, 1, 2, 3])),
            ("0,3,5-7", IndexList::List(vec![0, 3, 5, 6, 7])),
            (" 1 , 2 ", IndexList::List(vec![1, 2])),
        ];
        for (text, want) in ok {
            assert_eq!(text.parse::<IndexList>().unwrap(), want, "{text}");
        }
        let bad = [
            ("", "cannot be empty"),
            ("3,1", "must be sorted"),
            ("1,1", "appears twice"),
            ("0-3,2", "must be sorted"),
            ("0-3,3", "appears twice"),
            ("5-2", "runs backwards"),
            ("a", "not a prompt index"),
            ("-1", "is negative"),
        ];
        for (text, want) in bad {
            let err = text.parse::<IndexList>().unwrap_err().to_string();
            assert!(err.contains(want), "{text}: {err}");
        }
    }

    #[test]
    fn index_lists_print_compactly() {
        assert_eq!(IndexList::compact(&[0, 1, 2, 5, 7, 8]), "0-2,5,7-8");
        assert_eq!(IndexList::compact(&[]), "");
        assert_eq!(
            "0,3,5-7".parse::<IndexList>().unwrap().to_string(),
            "0,3,5-7"
        );
    }

    #[test]
    fn run_names() {
        assert!("sigma001".parse::<RunName>().is_ok());
        assert!("a.b_c-1".parse::<RunName>().is_ok());
        for bad in ["", "..", "a/b", "a b", "ä"] {
            assert!(bad.parse::<RunName>().is_err(), "{bad}");
        }
    }

    #[test]
    fn run_names_fit_a_folder_name() {
        assert!("a".repeat(200).parse::<RunName>().is_ok());
        let e = "a".repeat(201).parse::<RunName>().unwrap_err().to_string();
        assert!(e.contains("too long"), "{e}");
    }

    #[test]
    fn negative_and_empty_index_entries_say_so() {
        let e = "-1".parse::<IndexList>().unwrap_err().to_string();
        assert!(e.contains("`-1` is negative"), "{e}");
        let e = "0,,2".parse::<IndexList>().unwrap_err().to_string();
        assert!(e.contains("empty entry"), "{e}");
    }
}
