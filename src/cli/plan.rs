//! `runner plan`: load, validate and expand a manifest, and print the plan.

use clap::Args;

use super::{ManifestArgs, out};

#[derive(Debug, Args)]
pub struct PlanArgs {
    #[command(flatten)]
    pub manifest: ManifestArgs,
    /// Print the plan as JSON.
    #[arg(long)]
    pub json: bool,
    /// Also print every setting with its value and the layer that set it.
    #[arg(long)]
    pub explain: bool,
}

pub fn run(args: &PlanArgs) -> i32 {
    let (resolved, plan) = match args.manifest.load_plan() {
        Ok(both) => both,
        Err(code) => return code,
    };
    if args.json {
        let mut value = serde_json::to_value(&plan).expect("plans serialise");
        if args.explain {
            let settings: serde_json::Map<String, serde_json::Value> = resolved
                .settings
                .iter()
                .map(|(k, s)| {
                    (
                        k.clone(),
                        serde_json::json!({
                            "value": serde_json::to_value(&s.value).unwrap_or_default(),
                            "layer": s.origin.layer_name(),
                            "origin": s.origin.to_string(),
                        }),
                    )
                })
                .collect();
            value["settings"] = serde_json::Value::Object(settings);
        }
        let mut text = serde_json::to_string_pretty(&value).expect("json");
        text.push('\n');
        return out(&text);
    }
    let mut text = crate::plan::render::text(&plan, &resolved);
    if args.explain {
        text.push('\n');
        text.push_str(&crate::plan::render::explain(&resolved));
    }
    out(&text)
}
