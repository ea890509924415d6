//! How a record's values are written in reports: a missing value, a setting's name, the
//! weights a run used. Shared by the text report, its warnings and the runs table.

use serde::Serialize;

use crate::results::records::WeightsRecord;

/// A value, or `n/a` where the record has none.
pub(super) fn opt(v: Option<&str>) -> &str {
    v.unwrap_or("n/a")
}

/// A bundle's weights in a few words: the summary, and each part's source when they differ.
pub(super) fn weights_of(w: &WeightsRecord) -> String {
    if w.source == "mixed" {
        format!(
            "mixed (DiT {}, VAE {}, text encoder {})",
            w.dit, w.vae, w.text_encoder
        )
    } else {
        w.source.clone()
    }
}

/// A setting's value as its serialised name (`cudnn_flash`, `fp16`), or its JSON text.
pub(super) fn name_of<T: Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => String::new(),
    }
}
