//! The method table, declared once: each setting's type, default, class and documentation. The
//! manifest's `[method]` (its TOML form and JSON Schema), the worker's flags
//! ([`MethodFlags`]), the engine's defaults (`engine::MethodSettings`) and the config hash all
//! come from this one declaration.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::settings::{AttentionBackend, AttentionPrecision, Emit, Precision, SvdRank};
use super::values::{AttentionWindow, Bounded, DenoisingSteps, Positive, Sigma};

/// Declares the method table: `Method` (serde, schema, `Default`) and `MethodFlags`, its
/// settings as optional command-line flags. Each entry is its doc comment, its class (`flag`,
/// `config` or `export`, the schema's `x-unstep-class`), its flag's name when it is not the
/// key's, then `key: Type = default`.
macro_rules! method_table {
    ($(
        $(#[doc = $doc:literal])*
        #[class = $class:literal $(, flag = $long:literal)?]
        $key:ident: $ty:ty = $default:expr;
    )+) => {
        /// Method settings. Each has a class: `flag` (anywhere, extra args too), `config` (manifest or
        /// `--set` only) or `export` (fixed by the asset bundle; a differing value is refused).
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
        #[serde(deny_unknown_fields)]
        pub struct Method {
            $(
                $(#[doc = $doc])*
                #[schemars(extend("x-unstep-class" = $class))]
                pub $key: $ty,
            )+
        }

        impl Method {
            /// Every setting as the command line names it, in the table's order.
            pub const FLAGS: &'static [MethodFlag] = &[
                $(MethodFlag {
                    key: concat!("method.", stringify!($key)),
                    long: &[$($long)?],
                    class: $class,
                    ty: stringify!($ty),
                }),+
            ];
        }

        impl Default for Method {
            /// Self-Forcing's released sampling settings, at the export the runner's presets
            /// default to.
            fn default() -> Self {
                Method { $($key: $default),+ }
            }
        }

        /// The method settings as `runner worker` flags: each one given replaces its setting's
        /// default ([`MethodFlags::over`]).
        #[derive(Debug, Clone, Default, clap::Args)]
        #[command(next_help_heading = "Method settings (default: as in a manifest, docs/settings.md)")]
        pub struct MethodFlags {
            $(
                $(#[doc = $doc])*
                #[arg(long $(= $long)?, allow_negative_numbers = true)]
                pub $key: Option<$ty>,
            )+
        }

        impl MethodFlags {
            /// Every setting of `method` given, as a manifest states each.
            pub fn all(method: &Method) -> Self {
                MethodFlags { $($key: Some(method.$key.clone())),+ }
            }

            /// `method` with every setting a flag gave replaced by the flag's value.
            pub fn over(&self, mut method: Method) -> Method {
                $(
                    if let Some(value) = &self.$key {
                        method.$key = value.clone();
                    }
                )+
                method
            }
        }
    };
}

/// A method setting as the command line names it ([`Method::FLAGS`]): `runner worker`'s flag and
/// the extra args' spelling of it.
#[derive(Debug, Clone, Copy)]
pub struct MethodFlag {
    /// The manifest key, `method.<key>`.
    pub key: &'static str,
    /// The flag's name when it is not the key's (at most one).
    long: &'static [&'static str],
    /// `flag`, `config` or `export`.
    pub class: &'static str,
    /// The setting's type, as declared.
    ty: &'static str,
}

impl MethodFlag {
    /// The flag's name without `--`: the table's, or the key's with dashes.
    pub fn name(&self) -> String {
        match self.long.first() {
            Some(long) => long.to_string(),
            None => self.key_name(),
        }
    }

    /// The key's name with dashes (`frames-per-block`), which names the setting too.
    pub fn key_name(&self) -> String {
        self.key.trim_start_matches("method.").replace('_', "-")
    }

    /// Whether the flag is a switch, `--<name>` and `--no-<name>` (a `bool` setting).
    pub fn is_switch(&self) -> bool {
        self.ty == "bool"
    }
}

method_table! {
    /// Clean-cache noise level: re-noising of the clean input and the emitted prediction.
    /// Extra arg: `--clean-sigma-override`.
    #[class = "flag", flag = "clean-sigma-override"]
    clean_sigma: Sigma = Sigma(0.02);
    /// Timesteps of the denoising steps of each block. Extra arg: `--denoising-steps`.
    #[class = "flag"]
    denoising_steps: DenoisingSteps = DenoisingSteps::default();
    /// Warp the steps onto the flow-matching schedule with `timestep_shift`.
    /// Extra args: `--warp-denoising-steps`, `--no-warp-denoising-steps`.
    #[class = "flag"]
    warp_denoising_steps: bool = true;
    /// Shift of the flow-matching schedule.
    #[class = "config"]
    timestep_shift: Positive = Positive(5.0);
    /// Attention kernel. Env: `UNSTEP_ATTENTION_BACKEND`. Extra arg: `--attention-backend`.
    #[class = "flag"]
    attention_backend: AttentionBackend = AttentionBackend::Auto;
    /// The DiT's self-attention: `fp16` (exact) or `int8` (opt-in 8-bit attention: Q·Kᵀ in int8,
    /// P·V in float8; the runner's fused DiT on Hopper GPUs, or its CPU reference).
    /// Env: `UNSTEP_ATTENTION_PRECISION`. Extra arg: `--attention-precision`.
    #[class = "flag"]
    attention_precision: AttentionPrecision = AttentionPrecision::Fp16;
    /// Latent frames of past context each block attends to; -1 = all.
    #[class = "config"]
    attention_window: AttentionWindow = AttentionWindow(-1);
    /// What a block emits: `cache_pass` (the clean-cache pass's prediction) or `denoised`.
    #[class = "config"]
    emit: Emit = Emit::CachePass;
    /// Latent frames per block (export-time).
    #[class = "export"]
    frames_per_block: Bounded<1, 64> = Bounded(3);
    /// Latent frames per video (export-time).
    #[class = "export"]
    latent_frames: Bounded<1, 1024> = Bounded(21);
    /// Video height in pixels (export-time).
    #[class = "export"]
    height: Bounded<16, 4096> = Bounded(480);
    /// Video width in pixels (export-time).
    #[class = "export"]
    width: Bounded<16, 4096> = Bounded(832);
    /// Float precision of the exported graphs (export-time): fp32, fp16, bf16, or fp8 (opt-in
    /// reduced precision: fp16 tensors, the DiT's block matrix multiplies in float8, CUDA only).
    #[class = "export"]
    precision: Precision = Precision::Fp16;
    /// Low-rank factorisation of DiT linear layers (export-time).
    #[class = "export"]
    svd_rank: SvdRank = SvdRank::None;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every method setting has a row in docs/settings.md's table that states its class as the
    /// schema does.
    #[test]
    fn every_setting_is_in_the_documented_table_with_its_class() {
        let docs = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/settings.md"),
        )
        .unwrap();
        let schema = serde_json::to_value(schemars::schema_for!(Method)).unwrap();
        let properties = schema["properties"].as_object().unwrap();
        assert_eq!(properties.len(), 14);
        for (key, property) in properties {
            let class = property["x-unstep-class"].as_str().unwrap();
            let row = docs
                .lines()
                .find(|line| line.starts_with("| ") && line.contains(&format!("`{key}`")));
            let row = row.unwrap_or_else(|| panic!("docs/settings.md has no row for {key}"));
            assert!(row.contains(&format!(" | {class} | ")), "{key}: {row}");
        }
    }

    /// A flag given replaces its setting and nothing else; none given is the defaults.
    #[test]
    fn flags_replace_the_defaults_they_give() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            method: MethodFlags,
        }
        let parse = |args: &[&str]| {
            let cli = Cli::try_parse_from(std::iter::once("worker").chain(args.iter().copied()));
            cli.map(|cli| cli.method.over(Method::default()))
        };
        assert_eq!(parse(&[]).unwrap(), Method::default());
        let method = parse(&[
            "--clean-sigma-override",
            "0.01",
            "--attention-window",
            "-1",
            "--denoising-steps",
            "1000,500",
            "--warp-denoising-steps",
            "false",
            "--emit",
            "denoised",
            "--svd-rank",
            "8",
        ])
        .unwrap();
        assert_eq!(method.clean_sigma, Sigma(0.01));
        assert_eq!(method.denoising_steps, DenoisingSteps(vec![1000, 500]));
        assert!(!method.warp_denoising_steps);
        assert_eq!(method.emit, Emit::Denoised);
        assert_eq!(method.svd_rank, SvdRank::Rank(8));
        assert_eq!(method.timestep_shift, Method::default().timestep_shift);
        assert_eq!(
            MethodFlags::all(&method).over(Method::default()),
            method,
            "every setting given"
        );
        for bad in [
            &["--clean-sigma-override", "1.5"][..],
            &["--frames-per-block", "0"],
            &["--emit", "final"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
