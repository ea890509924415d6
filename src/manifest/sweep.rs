//! Sweeps: a `[sweep]` table expands one manifest into several runs, its points.
//!
//! ```toml
//! [sweep]
//! "method.clean_sigma" = [0.005, 0.01]
//! "method.emit" = ["cache_pass", "denoised"]
//! mode = "product"   # the default; "zip" pairs the lists instead
//! ```
//!
//! Each point is the manifest plus one more layer, above the manifest files and below the
//! environment, holding one value of each swept setting with the `file:line:col` of that value
//! in the list. [`super::load::load_sweep`] loads every point as a run of its own, so a value is
//! validated exactly as a `--set` of its key would be. A point's run name is
//! `<name>-<key>=<value>[-<key>=<value>…]` ([`SweepPoint::suffix`], rule in `docs/runs.md`).

use sha2::{Digest, Sha256};

use super::diagnostic::{Diagnostic, Origin, display_path};
use super::layers::{Entry, Layer, unknown_key};
use super::schema::{MethodClass, SWEEP_TABLE, keys};
use super::settings::SweepMode;
use super::source::SourceFile;

/// The name of the layer of a sweep point's values, in `runner plan --explain` and run records.
pub const LAYER: &str = "sweep";

/// The most points one sweep may have: more is almost surely a mistake in the lists.
pub const MAX_POINTS: usize = 1000;

/// A value text longer than this is cut and given a hash, to keep run names short.
const MAX_VALUE_TEXT: usize = 40;

/// One swept setting: its key, the label it has in run names, and its values.
#[derive(Debug, Clone)]
pub struct Axis {
    pub key: String,
    /// The key's last segment (`clean_sigma`), or the whole key when two swept keys share it.
    pub label: String,
    pub values: Vec<Entry>,
}

/// A manifest's `[sweep]` table, checked.
#[derive(Debug, Clone)]
pub struct Sweep {
    pub mode: SweepMode,
    pub axes: Vec<Axis>,
}

/// One point of a sweep: one value of each swept setting.
#[derive(Debug, Clone)]
pub struct SweepPoint {
    /// 0-based position among the sweep's points.
    pub index: usize,
    pub count: usize,
    /// How the sweep's lists combine.
    pub mode: SweepMode,
    /// The run name of the manifest, which the point's name extends.
    pub base: String,
    /// The swept settings, in the table's order, with their values and origins.
    pub values: Vec<(String, Entry)>,
    /// `<label>=<value>` for each swept setting, joined with `-`.
    pub suffix: String,
    /// The position of each value in its list.
    picks: Vec<usize>,
}

impl SweepPoint {
    /// The layer this point adds above the manifest files.
    pub fn layer(&self) -> Layer {
        Layer {
            entries: self.values.iter().cloned().collect(),
        }
    }

    /// How the sweep's points come from its lists, in words.
    pub fn mode_words(&self) -> String {
        match (self.values.len(), self.mode) {
            (1, _) => format!("one per value of `{}`", self.values[0].0),
            (n, SweepMode::Product) => format!("every combination of {n} settings"),
            (n, SweepMode::Zip) => format!("{n} settings side by side (zip)"),
        }
    }

    /// The point in words: `method.clean_sigma = 0.005, method.emit = "denoised"`.
    pub fn describe(&self) -> String {
        self.values
            .iter()
            .map(|(k, e)| format!("{k} = {}", e.value))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Reads the `[sweep]` table of the top file of `chain`; `None` when it has none. Problems are
/// added to `errors` (and give `None`): a key that cannot be swept, a list that is not one, an
/// unknown mode, a `[sweep]` in an extended file.
pub fn read(chain: &[SourceFile], errors: &mut Vec<Diagnostic>) -> Option<Sweep> {
    let before = errors.len();
    for parent in &chain[1..] {
        // One error per file, at its first `[sweep]` key.
        if let Some(leaf) = parent
            .leaves
            .iter()
            .filter(|(k, _)| in_table(k))
            .map(|e| e.1)
            .min_by_key(|leaf| leaf.key_span.start)
        {
            errors.push(
                Diagnostic::new(format!(
                    "a `[sweep]` belongs to the manifest that is run, and {} is extended by {}",
                    display_path(&parent.path),
                    display_path(&chain[0].path)
                ))
                .at(parent.origin(&leaf.key_span))
                .excerpt(Some(parent.excerpt(&leaf.key_span)))
                .hint("move the [sweep] table into the manifest you run"),
            );
        }
    }
    let top = &chain[0];
    let mut mode = SweepMode::Product;
    let mut axes = Vec::new();
    // In the file's order, which is the order of the keys in run names.
    let mut table: Vec<_> = top.leaves.iter().filter(|(k, _)| in_table(k)).collect();
    table.sort_by_key(|(_, leaf)| leaf.key_span.start);
    for (path, leaf) in table {
        let at_key = |d: Diagnostic| {
            d.at(top.origin(&leaf.key_span))
                .excerpt(Some(top.excerpt(&leaf.key_span)))
        };
        let at_value = |d: Diagnostic| {
            d.at(top.origin(&leaf.value_span))
                .excerpt(Some(top.excerpt(&leaf.value_span)))
        };
        let Some(key) = path.strip_prefix("sweep.") else {
            errors.push(
                at_key(Diagnostic::new("`sweep` must be a table"))
                    .hint("write [sweep] and under it \"table.key\" = [value, …]"),
            );
            continue;
        };
        if key == "mode" {
            match leaf.value.as_str() {
                Some("product") => mode = SweepMode::Product,
                Some("zip") => mode = SweepMode::Zip,
                _ => errors.push(
                    at_value(Diagnostic::new(format!(
                        "unknown sweep mode {}",
                        leaf.value
                    )))
                    .hint("use \"product\" (every combination) or \"zip\" (lists side by side)"),
                ),
            }
            continue;
        }
        if let Some((message, hint)) = refusal(key) {
            errors.push(at_key(Diagnostic::new(message)).hint(hint));
            continue;
        }
        if !keys().contains_key(key) {
            errors.push(unknown_key(
                key,
                top.origin(&leaf.key_span),
                Some(top.excerpt(&leaf.key_span)),
            ));
            continue;
        }
        let toml::Value::Array(items) = &leaf.value else {
            errors.push(
                at_value(Diagnostic::new(format!(
                    "`{key}` in [sweep] takes a list of values"
                )))
                .hint(format!("write \"{key}\" = [first, second, …]")),
            );
            continue;
        };
        if items.is_empty() {
            errors.push(
                at_value(Diagnostic::new(format!("`{key}` in [sweep] has no values")))
                    .hint("list at least one value, or remove the key"),
            );
            continue;
        }
        let values = items
            .iter()
            .zip(&leaf.item_spans)
            .map(|(value, span)| Entry {
                value: value.clone(),
                origin: top.origin(span),
                excerpt: Some(top.excerpt(span)),
            })
            .collect();
        axes.push(Axis {
            key: key.to_string(),
            label: String::new(),
            values,
        });
    }
    if errors.len() > before {
        return None;
    }
    if axes.is_empty() {
        let leaf = top.leaves.iter().find(|(k, _)| in_table(k))?.1;
        errors.push(
            Diagnostic::new("[sweep] sweeps no setting")
                .at(top.origin(&leaf.key_span))
                .excerpt(Some(top.excerpt(&leaf.key_span)))
                .hint("add \"table.key\" = [value, …], or remove the [sweep] table"),
        );
        return None;
    }
    label_axes(&mut axes);
    Some(Sweep { mode, axes })
}

/// Whether a dotted key of a file belongs to its `[sweep]` table.
pub fn in_table(key: &str) -> bool {
    key == SWEEP_TABLE || key.starts_with("sweep.")
}

/// Why `key` may not be swept, with what to do instead; `None` when it may.
pub(super) fn refusal(key: &str) -> Option<(String, String)> {
    let another = "write a manifest of its own (it can `extends` this one)";
    match key {
        "name" | "extends" => Some((
            format!("`{key}` cannot be swept: a sweep's points are runs of this one manifest"),
            another.into(),
        )),
        "kind" => Some((
            "`kind` cannot be swept: a sweep's points are runs of one kind".into(),
            another.into(),
        )),
        "outputs.dir" => Some((
            "`outputs.dir` cannot be swept: a sweep's runs go side by side under one results \
             folder"
                .into(),
            "set `outputs.dir` once; each point writes `<dir>/<point name>/`".into(),
        )),
        _ if keys().get(key).and_then(|k| k.class) == Some(MethodClass::Export) => Some((
            format!(
                "`{key}` cannot be swept: it is fixed when the asset bundle is exported, so each \
                 value would need another bundle"
            ),
            "export a bundle per value and write one manifest per bundle (`assets.bundle`); \
             flag and config settings can be swept (`runner schema` gives each method \
             setting's class)"
                .into(),
        )),
        _ => None,
    }
}

/// Gives each axis its label: the key's last segment, or the whole key where two swept keys
/// share their last segment (`cache.mode` and `noise.mode`).
pub(super) fn label_axes(axes: &mut [Axis]) {
    let last = |k: &str| k.rsplit('.').next().unwrap_or(k).to_string();
    let lasts: Vec<String> = axes.iter().map(|a| last(&a.key)).collect();
    for (i, axis) in axes.iter_mut().enumerate() {
        let shared = lasts.iter().filter(|l| **l == lasts[i]).count() > 1;
        axis.label = if shared {
            axis.key.clone()
        } else {
            lasts[i].clone()
        };
    }
}

impl Sweep {
    /// The points, in order: for `product`, the last key varies fastest; for `zip`, the lists'
    /// positions. Refused (into `errors`, giving no points): `zip` lists of unequal lengths,
    /// more than [`MAX_POINTS`] points, and two points whose run names would be equal.
    pub fn points(&self, base: &str, errors: &mut Vec<Diagnostic>) -> Vec<SweepPoint> {
        let picks = match self.picks() {
            Ok(p) => p,
            Err(d) => {
                errors.push(*d);
                return Vec::new();
            }
        };
        let count = picks.len();
        let points: Vec<SweepPoint> = picks
            .into_iter()
            .enumerate()
            .map(|(index, picks)| {
                let values: Vec<(String, Entry)> = self
                    .axes
                    .iter()
                    .zip(&picks)
                    .map(|(a, &i)| (a.key.clone(), a.values[i].clone()))
                    .collect();
                let suffix = self
                    .axes
                    .iter()
                    .zip(&values)
                    .map(|(a, (_, e))| format!("{}={}", a.label, name_text(&e.value)))
                    .collect::<Vec<_>>()
                    .join("-");
                SweepPoint {
                    index,
                    count,
                    mode: self.mode,
                    base: base.to_string(),
                    values,
                    suffix,
                    picks,
                }
            })
            .collect();
        match self.same_names(&points) {
            Some(d) => {
                errors.push(d);
                Vec::new()
            }
            None => points,
        }
    }

    /// Each point's position in every list.
    fn picks(&self) -> Result<Vec<Vec<usize>>, Box<Diagnostic>> {
        let lens: Vec<usize> = self.axes.iter().map(|a| a.values.len()).collect();
        let picks: Vec<Vec<usize>> = match self.mode {
            SweepMode::Zip => {
                if let Some(axis) = self.axes.iter().find(|a| a.values.len() != lens[0]) {
                    let first = &self.axes[0];
                    return Err(Box::new(Diagnostic::new(format!(
                        "a zip sweep needs lists of equal length: `{}` has {} values, `{}` has {}",
                        first.key,
                        lens[0],
                        axis.key,
                        axis.values.len()
                    ))
                    .at(axis.values[0].origin.clone())
                    .excerpt(axis.values[0].excerpt.clone())
                    .hint("give every list as many values, or use mode = \"product\"")));
                }
                (0..lens[0]).map(|i| vec![i; lens.len()]).collect()
            }
            SweepMode::Product => {
                let total = lens.iter().try_fold(1usize, |n, l| n.checked_mul(*l));
                if total.is_none_or(|t| t > MAX_POINTS) {
                    return Err(Box::new(self.too_many(total)));
                }
                let mut all = vec![Vec::new()];
                for len in &lens {
                    all = all
                        .into_iter()
                        .flat_map(|p: Vec<usize>| {
                            (0..*len).map(move |i| [p.clone(), vec![i]].concat())
                        })
                        .collect();
                }
                all
            }
        };
        if picks.len() > MAX_POINTS {
            return Err(Box::new(self.too_many(Some(picks.len()))));
        }
        Ok(picks)
    }

    fn too_many(&self, total: Option<usize>) -> Diagnostic {
        let first = &self.axes[0].values[0];
        Diagnostic::new(format!(
            "the sweep has {} points; at most {MAX_POINTS} are allowed",
            total.map_or_else(|| "too many".into(), |t| t.to_string())
        ))
        .at(first.origin.clone())
        .excerpt(first.excerpt.clone())
        .hint("sweep fewer values, or split the sweep over several manifests")
    }

    /// The refusal for two points whose names would be equal, at the later point's value.
    fn same_names(&self, points: &[SweepPoint]) -> Option<Diagnostic> {
        for (j, later) in points.iter().enumerate() {
            let Some(earlier) = points[..j].iter().find(|p| p.suffix == later.suffix) else {
                continue;
            };
            let axis = (0..self.axes.len()).find(|&a| earlier.picks[a] != later.picks[a])?;
            let (key, entry) = &later.values[axis];
            let other = &earlier.values[axis].1;
            return Some(
                Diagnostic::new(format!(
                    "`{key}` value {} would give the same run name as {} (`{}-{}`)",
                    entry.value, other.value, later.base, later.suffix
                ))
                .at(entry.origin.clone())
                .excerpt(entry.excerpt.clone())
                .hint(format!(
                    "remove the repeated value (first at {}); run names keep letters, digits, \
                     `.`, `_` and `-` of a value and write other characters as `_`",
                    other.origin
                )),
            );
        }
        None
    }
}

/// A value as it appears in run names: its text with every character other than letters,
/// digits, `.`, `_` and `-` written as `_`, list items joined by `_`, and a text longer than
/// 40 characters (`MAX_VALUE_TEXT`) cut and ended with 8 hex digits of the SHA-256 of the whole.
pub fn name_text(value: &toml::Value) -> String {
    let text = plain(value);
    let safe: String = text
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if safe.len() <= MAX_VALUE_TEXT {
        return safe;
    }
    let hash: String = Sha256::digest(text.as_bytes())[..4]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{}-{hash}", &safe[..MAX_VALUE_TEXT - 9])
}

fn plain(value: &toml::Value) -> String {
    match value {
        toml::Value::String(s) => s.clone(),
        toml::Value::Integer(i) => i.to_string(),
        toml::Value::Float(f) => f.to_string(),
        toml::Value::Boolean(b) => b.to_string(),
        toml::Value::Datetime(d) => d.to_string(),
        toml::Value::Array(items) => items.iter().map(plain).collect::<Vec<_>>().join("_"),
        toml::Value::Table(t) => toml::Value::Table(t.clone()).to_string(),
    }
}

/// The error for a swept setting that the environment or the command line also sets: which of
/// the two applies would be ambiguous.
pub fn set_elsewhere(key: &str, swept: &Entry, other: &Entry) -> Diagnostic {
    let what = match other.origin {
        Origin::Flag { .. } => "the command line",
        _ => "the environment",
    };
    // Every point gives the same error, so it names the table, not the point's value.
    let table = match &swept.origin {
        Origin::File { path, .. } => format!("the [sweep] table of {}", display_path(path)),
        Origin::Flag { arg } => format!("`{arg}`"),
        _ => "the [sweep] table".into(),
    };
    Diagnostic::new(format!(
        "`{key}` is swept by {table} and also set by {what} ({}); which applies would be \
         ambiguous",
        other.origin
    ))
    .at(other.origin.clone())
    .hint(format!(
        "remove `{key}` from {what}, or from the [sweep] table"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sweep(text: &str) -> (Option<Sweep>, Vec<Diagnostic>) {
        let file = SourceFile::parse("m.toml".into(), text.into()).unwrap();
        let mut errors = Vec::new();
        (read(&[file], &mut errors), errors)
    }

    #[test]
    fn a_product_names_each_point_by_its_values() {
        let (s, errors) = sweep(
            "kind = \"probe\"\n[sweep]\n\"method.clean_sigma\" = [0.005, 0.01]\n\
             \"method.denoising_steps\" = [[1000, 500], [750]]\n",
        );
        assert!(errors.is_empty(), "{errors:?}");
        let mut errors = Vec::new();
        let points = s.unwrap().points("base", &mut errors);
        let names: Vec<&str> = points.iter().map(|p| p.suffix.as_str()).collect();
        // Keys in the file's order, the last varying fastest.
        assert_eq!(
            names,
            [
                "clean_sigma=0.005-denoising_steps=1000_500",
                "clean_sigma=0.005-denoising_steps=750",
                "clean_sigma=0.01-denoising_steps=1000_500",
                "clean_sigma=0.01-denoising_steps=750",
            ]
        );
        assert_eq!(points[3].index, 3);
        assert_eq!(points[3].count, 4);
        match &points[1].values[1].1.origin {
            Origin::File { line, col, .. } => assert_eq!((*line, *col), (4, 42)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn zip_pairs_lists_and_refuses_unequal_lengths() {
        let (s, _) = sweep(
            "[sweep]\nmode = \"zip\"\n\"method.clean_sigma\" = [0.005, 0.01]\n\
             \"noise.seed\" = [1, 2]\n",
        );
        let mut errors = Vec::new();
        let points = s.unwrap().points("b", &mut errors);
        assert_eq!(points.len(), 2);
        assert_eq!(points[1].suffix, "clean_sigma=0.01-seed=2");
        let (s, _) = sweep(
            "[sweep]\nmode = \"zip\"\n\"noise.seed\" = [1, 2, 3]\n\"method.emit\" = [\"denoised\"]\n",
        );
        let points = s.unwrap().points("b", &mut errors);
        assert!(points.is_empty());
        assert!(errors[0].message.contains("equal length"), "{errors:?}");
    }

    #[test]
    fn keys_that_cannot_be_swept_are_refused_at_the_key() {
        for (key, want) in [
            ("method.height", "fixed when the asset bundle is exported"),
            (
                "method.precision",
                "fixed when the asset bundle is exported",
            ),
            ("outputs.dir", "side by side"),
            ("kind", "one kind"),
            ("name", "one manifest"),
            ("method.clean_sigm", "unknown key"),
        ] {
            let (s, errors) = sweep(&format!("[sweep]\n\"{key}\" = [1, 2]\n"));
            assert!(s.is_none(), "{key}");
            assert_eq!(errors.len(), 1, "{key}: {errors:?}");
            assert!(errors[0].message.contains(want), "{key}: {errors:?}");
            match &errors[0].origin {
                Some(Origin::File { line, col, .. }) => assert_eq!((*line, *col), (2, 1)),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn equal_names_are_refused_and_long_values_are_cut_with_a_hash() {
        let (s, _) = sweep("[sweep]\n\"noise.seed\" = [1, 2, 1]\n");
        let mut errors = Vec::new();
        assert!(s.unwrap().points("b", &mut errors).is_empty());
        assert!(errors[0].message.contains("same run name"), "{errors:?}");
        // Two texts that differ only in characters names cannot hold.
        let (s, _) = sweep("[sweep]\n\"evaluation.command\" = [\"a b\", \"a/b\"]\n");
        let mut errors = Vec::new();
        assert!(s.unwrap().points("b", &mut errors).is_empty());
        assert_eq!(errors.len(), 1);
        let long = toml::Value::String("x".repeat(100));
        let text = name_text(&long);
        assert_eq!(text.len(), MAX_VALUE_TEXT);
        assert_ne!(text, name_text(&toml::Value::String("x".repeat(101))));
    }

    #[test]
    fn a_sweep_in_an_extended_file_is_refused() {
        let top = SourceFile::parse("top.toml".into(), "extends = \"base.toml\"\n".into());
        let base = SourceFile::parse("base.toml".into(), "[sweep]\n\"noise.seed\" = [1]\n".into());
        let mut errors = Vec::new();
        read(&[top.unwrap(), base.unwrap()], &mut errors);
        assert!(
            errors[0]
                .message
                .contains("belongs to the manifest that is run")
        );
    }
}
