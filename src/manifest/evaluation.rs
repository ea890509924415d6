//! The value types of the `[evaluation]` table: the command template (a list of arguments, its
//! placeholders filled inside each argument when it runs: no shell ever sees it), the dimension
//! list, and where the command leaves its scores.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The placeholders of an evaluation command, each replaced inside the argument it is in.
pub const PLACEHOLDERS: &[(&str, &str)] = &[
    ("videos", "the run's videos folder"),
    ("run_dir", "the run's results folder"),
    ("run", "the run's name"),
    ("names_file", "the names file (prompts.names_file)"),
    (
        "dimensions",
        "evaluation.dimensions, separated by spaces, in one argument",
    ),
    ("eval_dir", "the run's eval/ folder"),
    (
        "scores_file",
        "where the scores are read (evaluation.scores_file)",
    ),
];

/// Why an argument list is not an evaluation command.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommandTemplateError {
    #[error(
        "the command is empty; write the program and its arguments, like [\"vbench\", \
         \"evaluate\", …]"
    )]
    Empty,
    #[error("the command's first element, the program, is empty")]
    EmptyProgram,
    /// `{name}` where `name` is not one of [`PLACEHOLDERS`].
    #[error(
        "unknown placeholder `{{{0}}}`; the command may use {known}",
        known = known_placeholders()
    )]
    UnknownPlaceholder(String),
}

/// The placeholders as written in a command, separated by commas.
fn known_placeholders() -> String {
    let known: Vec<String> = PLACEHOLDERS
        .iter()
        .map(|(p, _)| format!("{{{p}}}"))
        .collect();
    known.join(", ")
}

/// An evaluation command: a program and its arguments, as a list. It runs without a shell, so
/// nothing in it (or in what its placeholders stand for) is expanded, split or redirected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandTemplate {
    argv: Vec<String>,
}

impl CommandTemplate {
    /// A command of these arguments, checked: not empty, a program, known placeholders.
    pub fn new(argv: Vec<String>) -> Result<CommandTemplate, CommandTemplateError> {
        let Some(program) = argv.first() else {
            return Err(CommandTemplateError::Empty);
        };
        if program.trim().is_empty() {
            return Err(CommandTemplateError::EmptyProgram);
        }
        for arg in &argv {
            check_placeholders(arg)?;
        }
        Ok(CommandTemplate { argv })
    }

    /// The arguments before their placeholders are filled.
    pub fn argv(&self) -> &[String] {
        &self.argv
    }

    /// Whether an argument uses placeholder `name`.
    pub fn uses(&self, name: &str) -> bool {
        let p = format!("{{{name}}}");
        self.argv.iter().any(|a| a.contains(&p))
    }

    /// The arguments with each placeholder replaced by `value(name)`, in one pass over each
    /// argument (a value that holds `{…}` is not filled again).
    pub fn render(&self, value: impl Fn(&str) -> String) -> Vec<String> {
        self.argv
            .iter()
            .map(|arg| {
                let mut out = String::new();
                let mut rest = arg.as_str();
                while let Some(start) = rest.find('{') {
                    out.push_str(&rest[..start]);
                    let after = &rest[start + 1..];
                    match PLACEHOLDERS
                        .iter()
                        .find(|(name, _)| after.starts_with(&format!("{name}}}")))
                    {
                        Some((name, _)) => {
                            out.push_str(&value(name));
                            rest = &after[name.len() + 1..];
                        }
                        None => {
                            out.push('{');
                            rest = after;
                        }
                    }
                }
                out.push_str(rest);
                out
            })
            .collect()
    }
}

/// The arguments as a shell would need them quoted, for messages and records.
impl fmt::Display for CommandTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let words: Vec<String> = self.argv.iter().map(|a| quote(a)).collect();
        f.write_str(&words.join(" "))
    }
}

/// `arg` as one shell word: as it is when it holds nothing a shell reads, else in `'…'`.
pub fn quote(arg: &str) -> String {
    let plain = !arg.is_empty()
        && arg
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=,+@%{}".contains(c));
    if plain {
        arg.to_string()
    } else {
        format!("'{}'", arg.replace('\'', "'\\''"))
    }
}

/// Refuses `{name}` where `name` is not a placeholder.
fn check_placeholders(arg: &str) -> Result<(), CommandTemplateError> {
    let mut rest = arg;
    while let Some(start) = rest.find('{') {
        let after = &rest[start + 1..];
        let len = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(after.len());
        if len > 0 && after[len..].starts_with('}') {
            let name = &after[..len];
            if !PLACEHOLDERS.iter().any(|(p, _)| *p == name) {
                return Err(CommandTemplateError::UnknownPlaceholder(name.to_string()));
            }
        }
        rest = after;
    }
    Ok(())
}

impl Serialize for CommandTemplate {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.argv.serialize(s)
    }
}

impl<'de> Deserialize<'de> for CommandTemplate {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = CommandTemplate;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of strings: the program and its arguments")
            }
            /// `--set` and environment variables give text: a TOML list there is the list.
            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<CommandTemplate, E> {
                if text.trim_start().starts_with('[') {
                    let parsed: Result<toml::Table, _> = toml::from_str(&format!("v = {text}"));
                    let argv = parsed.ok().and_then(|t| match t.get("v") {
                        Some(toml::Value::Array(items)) => items
                            .iter()
                            .map(|i| i.as_str().map(str::to_string))
                            .collect::<Option<Vec<String>>>(),
                        _ => None,
                    });
                    return match argv {
                        Some(argv) => CommandTemplate::new(argv).map_err(E::custom),
                        None => Err(E::custom(
                            "the command is not a list of strings; write it like \
                             [\"vbench\", \"evaluate\", \"--videos_path\", \"{videos}\"]",
                        )),
                    };
                }
                Err(E::custom(
                    "the command is a list of arguments, not one string (it runs without a \
                     shell); write it like [\"vbench\", \"evaluate\", \"--videos_path\", \"{videos}\"]",
                ))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<CommandTemplate, A::Error> {
                let mut argv = Vec::new();
                while let Some(v) = seq.next_element::<AnyText>()? {
                    match v.0 {
                        Some(a) => argv.push(a),
                        None => {
                            return Err(serde::de::Error::custom(
                                "every argument of the command is a string; quote numbers too",
                            ));
                        }
                    }
                }
                CommandTemplate::new(argv).map_err(serde::de::Error::custom)
            }
        }
        d.deserialize_any(V)
    }
}

impl JsonSchema for CommandTemplate {
    fn schema_name() -> Cow<'static, str> {
        "CommandTemplate".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        // A list, or text holding a TOML list (what `--set` and environment variables give).
        json_schema!({
            "description": "The program and its arguments, run without a shell; placeholders {videos}, {run_dir}, {run}, {names_file}, {dimensions}, {eval_dir} and {scores_file} are filled inside each argument.",
            "anyOf": [
                { "type": "array", "items": { "type": "string" }, "minItems": 1 },
                { "type": "string", "pattern": "^\\s*\\[" }
            ]
        })
    }
}

/// Evaluation dimensions: names of letters, digits and `_` (VBench hands them to a shell of its
/// own), each at most once. A list, or one string with the names separated by commas or spaces
/// (the form `--set` gives).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dimensions(pub Vec<String>);

/// Why a list of names is not a list of evaluation dimensions.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum DimensionsError {
    #[error(
        "`{0}` is not a dimension name; use letters, digits and `_` (VBench's names, like \
         subject_consistency)"
    )]
    BadName(String),
    #[error("dimension `{0}` is listed twice")]
    Twice(String),
}

impl Dimensions {
    fn of(names: Vec<String>) -> Result<Dimensions, DimensionsError> {
        let mut seen = Vec::new();
        for n in names {
            if n.is_empty() || !n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(DimensionsError::BadName(n));
            }
            if seen.contains(&n) {
                return Err(DimensionsError::Twice(n));
            }
            seen.push(n);
        }
        Ok(Dimensions(seen))
    }
}

impl Serialize for Dimensions {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Dimensions {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Dimensions;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of dimension names, like [\"subject_consistency\"]")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Dimensions, E> {
                let names = v
                    .split(|c: char| c == ',' || c.is_whitespace())
                    .filter(|n| !n.is_empty())
                    .map(str::to_string)
                    .collect();
                Dimensions::of(names).map_err(E::custom)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Dimensions, A::Error> {
                let mut names = Vec::new();
                while let Some(v) = seq.next_element::<AnyText>()? {
                    match v.0 {
                        Some(n) => names.push(n),
                        None => {
                            return Err(serde::de::Error::custom(
                                "every dimension is a string, like \"subject_consistency\"",
                            ));
                        }
                    }
                }
                Dimensions::of(names).map_err(serde::de::Error::custom)
            }
        }
        d.deserialize_any(V)
    }
}

/// Any value, kept when it is a string: so that a wrong element is reported at the list.
struct AnyText(Option<String>);

impl<'de> Deserialize<'de> for AnyText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = serde_json::Value::deserialize(d)?;
        Ok(AnyText(v.as_str().map(str::to_string)))
    }
}

impl JsonSchema for Dimensions {
    fn schema_name() -> Cow<'static, str> {
        "Dimensions".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "Evaluation dimensions (VBench's names): a list, or one string separated by commas.",
            "anyOf": [
                { "type": "array", "items": { "type": "string", "pattern": "^[A-Za-z0-9_]+$" }, "uniqueItems": true },
                { "type": "string" }
            ]
        })
    }
}

/// Where the evaluation command leaves its scores, relative to the run's `eval/` folder: a path
/// without `..`, whose file name may hold one `*` (VBench names its results file after the
/// time). Files it matches are removed before the command runs, so exactly one must match after.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScoresFile(String);

/// The runner's own scores file in `eval/`, which the command's may not be.
pub const SCORES_JSON: &str = "scores.json";

impl ScoresFile {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether the file name is a pattern.
    pub fn is_pattern(&self) -> bool {
        self.0.contains('*')
    }
}

impl Default for ScoresFile {
    fn default() -> Self {
        ScoresFile("raw_scores.json".into())
    }
}

impl fmt::Display for ScoresFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why a text is not a scores file path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScoresFileError {
    /// An empty or absolute path, or one holding a NUL.
    #[error(
        "`{0}` is not a path inside the run's eval/ folder; write a relative path like \
         \"raw_scores.json\""
    )]
    NotRelative(String),
    #[error("`{0}` has an empty, `.` or `..` part; write a path inside the run's eval/ folder")]
    BadPart(String),
    /// A `*` in a folder, or more than one in the file name.
    #[error("`{0}`: only the file name may hold a `*`, and only one")]
    Star(String),
    /// [`SCORES_JSON`], the runner's own file.
    #[error(
        "eval/{SCORES_JSON} is where the runner keeps the scores it read; let the command write \
         another file"
    )]
    RunnersOwn,
}

impl FromStr for ScoresFile {
    type Err = ScoresFileError;
    fn from_str(s: &str) -> Result<Self, ScoresFileError> {
        let parts: Vec<&str> = s.split('/').collect();
        if s.is_empty() || s.starts_with('/') || s.contains('\0') {
            return Err(ScoresFileError::NotRelative(s.to_string()));
        }
        if parts
            .iter()
            .any(|p| p.is_empty() || *p == "." || *p == "..")
        {
            return Err(ScoresFileError::BadPart(s.to_string()));
        }
        let (last, folders) = parts.split_last().expect("split gives one part at least");
        if folders.iter().any(|p| p.contains('*')) || last.matches('*').count() > 1 {
            return Err(ScoresFileError::Star(s.to_string()));
        }
        if s == SCORES_JSON {
            return Err(ScoresFileError::RunnersOwn);
        }
        Ok(ScoresFile(s.to_string()))
    }
}

impl Serialize for ScoresFile {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ScoresFile {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = Cow::<str>::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for ScoresFile {
    fn schema_name() -> Cow<'static, str> {
        "ScoresFile".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "minLength": 1,
            "description": "A path relative to the run's eval/ folder; its file name may hold one `*`."
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(v: &[&str]) -> Result<CommandTemplate, CommandTemplateError> {
        CommandTemplate::new(v.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn commands_are_argument_lists_with_known_placeholders() {
        let t: CommandTemplate =
            serde_json::from_str(r#"["vbench", "evaluate", "--videos_path", "{videos}"]"#).unwrap();
        assert_eq!(
            t.argv(),
            ["vbench", "evaluate", "--videos_path", "{videos}"]
        );
        assert_eq!(t.to_string(), "vbench evaluate --videos_path {videos}");
        for (bad, want) in [
            (
                r#""vbench evaluate""#,
                "a list of arguments, not one string",
            ),
            ("[]", "empty"),
            (r#"[""]"#, "the program, is empty"),
            (r#"["a", 1]"#, "every argument of the command is a string"),
            (r#"["a", "{video}"]"#, "unknown placeholder `{video}`"),
        ] {
            let e = serde_json::from_str::<CommandTemplate>(bad)
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{bad}: {e}");
        }
        // `--set` gives text; a TOML list in it is the list.
        let t: CommandTemplate = serde_json::from_str(r#""[\"run\", \"{videos}\"]""#).unwrap();
        assert_eq!(t.argv(), ["run", "{videos}"]);
        let e = serde_json::from_str::<CommandTemplate>(r#""[1, 2]""#).unwrap_err();
        assert!(e.to_string().contains("not a list of strings"), "{e}");
        // Braces that are no placeholder's name stay as they are.
        assert!(template(&["python3", "-c", "print({1: 2})", "{ x }"]).is_ok());
    }

    #[test]
    fn placeholders_are_filled_inside_each_argument() {
        let t = template(&[
            "run",
            "--out={eval_dir}/x",
            "{dimensions}",
            "{videos}",
            "{ x }",
        ])
        .unwrap();
        assert!(t.uses("eval_dir") && !t.uses("names_file"));
        let argv = t.render(|name| match name {
            "eval_dir" => "/r/eval".into(),
            "dimensions" => "a b".into(),
            // Prompt-like text stays one argument, whatever it holds, and is not filled again.
            "videos" => "/r/my videos; rm -rf ~ {eval_dir}".into(),
            _ => unreachable!(),
        });
        assert_eq!(
            argv,
            [
                "run",
                "--out=/r/eval/x",
                "a b",
                "/r/my videos; rm -rf ~ {eval_dir}",
                "{ x }"
            ]
        );
        assert_eq!(quote("it's a b"), r"'it'\''s a b'");
    }

    #[test]
    fn dimensions_and_scores_files_check_themselves() {
        let d: Dimensions = serde_json::from_str(r#"["color", "scene"]"#).unwrap();
        assert_eq!(d.0, ["color", "scene"]);
        let d: Dimensions = serde_json::from_str(r#""color, scene""#).unwrap();
        assert_eq!(d.0, ["color", "scene"]);
        for bad in [r#"["a b"]"#, r#"["a", "a"]"#, "[1]", r#"["x;y"]"#] {
            assert!(serde_json::from_str::<Dimensions>(bad).is_err(), "{bad}");
        }
        assert!(
            "vbench/results_*_eval_results.json"
                .parse::<ScoresFile>()
                .unwrap()
                .is_pattern()
        );
        for bad in [
            "",
            "/abs.json",
            "../x.json",
            "a//b",
            "*/x.json",
            "a**.json",
            "scores.json",
        ] {
            assert!(bad.parse::<ScoresFile>().is_err(), "{bad}");
        }
    }
}
