//! Manifests, layers, the schema and `runner plan`, through the real binary.

use crate::support::{Test, repo, tree};

/// Replaces this checkout's absolute path so snapshots read the same everywhere.
fn filtered<F: FnOnce()>(f: F) {
    let root = repo().display().to_string();
    let mut settings = insta::Settings::clone_current();
    settings.add_filter(&regex::escape(&root), "[REPO]");
    settings.set_prepend_module_to_snapshot(false);
    settings.bind(f);
}

fn experiments() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(repo().join("experiments"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".toml"))
        .collect();
    names.sort();
    names
}

#[test]
fn every_experiment_the_seed_names_is_committed() {
    let names = experiments();
    for want in [
        "unstep_speed.toml",
        "gb200_speed.toml",
        "one_prompt.toml",
        "full946.toml",
        "sigma001.toml",
        "smoke.toml",
    ] {
        assert!(
            names.iter().any(|n| n == want),
            "missing experiments/{want}"
        );
    }
}

#[test]
fn plans_of_committed_experiments() {
    let state_of_results =
        regex::Regex::new(r"(?m)^(  results +\S+) \((new|exists: .*|apply will refuse: .*)\)$")
            .unwrap();
    for name in experiments() {
        let stem = name.trim_end_matches(".toml").to_string();
        let text = Test::new()
            .cwd(&repo())
            .cmd()
            .args(["plan", &format!("experiments/{name}")])
            .run();
        assert_eq!(text.code, 0, "{}", text.render());
        let json = Test::new()
            .cwd(&repo())
            .cmd()
            .args(["plan", "--json", &format!("experiments/{name}")])
            .run();
        assert_eq!(json.code, 0, "{}", json.render());
        let parsed: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
        // What the repository's results/ holds (say, from the quickstart's smoke run) is not
        // part of the committed plan: the results line and field keep their shape, not state.
        let state = &parsed["results_state"]["state"];
        assert!(
            ["new", "resumes", "remeasures", "refused"].contains(&state.as_str().unwrap()),
            "{state}"
        );
        let text = state_of_results
            .replace(&text.stdout, "$1 ([state of results/])")
            .into_owned();
        filtered(|| {
            insta::assert_snapshot!(format!("plan_{stem}"), text);
            insta::assert_json_snapshot!(format!("plan_{stem}_json"), parsed, {
                ".results_state" => "[state of results/]"
            });
        });
    }
}

#[test]
fn committed_schema_is_current() {
    let committed = std::fs::read_to_string(repo().join("schemas/manifest.schema.json")).unwrap();
    let current = unstep::manifest::schema::manifest_schema_text();
    assert!(
        committed == current,
        "schemas/manifest.schema.json is stale; run `cargo run -- schema > schemas/manifest.schema.json`"
    );
    let out = Test::new().cmd().args(["schema"]).run();
    assert_eq!(out.code, 0);
    assert_eq!(out.stdout, current);
}

#[test]
fn every_experiment_validates_against_the_schema_and_names_it() {
    let schema = unstep::manifest::schema::manifest_schema();
    let validator = jsonschema::validator_for(&schema).expect("the schema compiles");
    for name in experiments() {
        let text = std::fs::read_to_string(repo().join("experiments").join(&name)).unwrap();
        assert_eq!(
            text.lines().next(),
            Some("#:schema ../schemas/manifest.schema.json"),
            "{name} must start with the schema line"
        );
        let value: toml::Value = toml::from_str(&text).unwrap();
        let json = serde_json::to_value(value).unwrap();
        let errors: Vec<String> = validator
            .iter_errors(&json)
            .map(|e| e.to_string())
            .collect();
        assert!(errors.is_empty(), "{name}: {errors:?}");
    }
    // And the schema really checks: a wrong value fails it.
    let bad = serde_json::json!({ "kind": "probe", "method": { "emit": "final" } });
    assert!(!validator.is_valid(&bad));
    let bad = serde_json::json!({ "kind": "probe", "cache": { "scpoe": "shard" } });
    assert!(!validator.is_valid(&bad));
}

/// A copy of the full protocol's manifest beside a 946-line prompt file.
fn full946_checkout() -> Test {
    let manifest = std::fs::read_to_string(repo().join("experiments/full946.toml")).unwrap();
    let prompts: String = (0..946).map(|i| format!("prompt number {i}\n")).collect();
    Test::new()
        .file("experiments/full946.toml", &manifest)
        .file("assets/prompts/vbench_extended.txt", &prompts)
}

#[test]
fn full946_makes_eight_contiguous_shards_covering_every_prompt_once() {
    let t = full946_checkout();
    let out = t
        .cmd()
        .args(["plan", "--json", "experiments/full946.toml"])
        .run();
    assert_eq!(out.code, 0, "{}", out.render());
    let plan: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let shards = plan["shards"].as_array().unwrap();
    let sizes: Vec<usize> = shards
        .iter()
        .map(|s| s["prompts"].as_array().unwrap().len())
        .collect();
    assert_eq!(sizes, vec![119, 119, 118, 118, 118, 118, 118, 118]);
    let all: Vec<u64> = shards
        .iter()
        .flat_map(|s| {
            s["prompts"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap())
        })
        .collect();
    assert_eq!(
        all,
        (0..946).collect::<Vec<u64>>(),
        "every prompt once, in order"
    );
    for s in shards {
        let p = s["prompts"].as_array().unwrap();
        let (first, last) = (p[0].as_u64().unwrap(), p[p.len() - 1].as_u64().unwrap());
        assert_eq!(last - first + 1, p.len() as u64, "shard is contiguous");
        assert_eq!(s["noise_from"].as_u64(), Some(first));
    }
    assert_eq!(plan["prompt_count"], 946);
}

/// The `PATH` of a stand-in `nvidia-smi` that lists `gpus` GPUs as the driver does.
fn fake_driver(t: &Test, gpus: usize) -> String {
    let lines: Vec<String> = (0..gpus)
        .map(|i| format!("{i}, NVIDIA H200, 143771, 580.65.06, 9.0"))
        .collect();
    crate::support::fake_nvidia_smi(t, Some(&lines.join("\n")))
}

/// With `CUDA_VISIBLE_DEVICES` unset, a generation spreads its shards over every GPU the driver
/// lists, and the plan says so; a probe keeps to GPU 0; `CUDA_VISIBLE_DEVICES` still decides
/// when set.
#[test]
fn a_generation_uses_every_gpu_the_driver_lists_when_none_are_named() {
    let t = full946_checkout();
    let path = fake_driver(&t, 4);
    let plan = |extra: &[(&str, &str)], manifest: &str| {
        let mut cmd = t.cmd().env("PATH", &path);
        for (k, v) in extra {
            cmd = cmd.env(k, v);
        }
        let out = cmd.args(["plan", "--json", manifest]).run();
        assert_eq!(out.code, 0, "{}", out.render());
        serde_json::from_str::<serde_json::Value>(&out.stdout).unwrap()
    };
    let devices = |plan: &serde_json::Value| -> Vec<String> {
        plan["slots"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["device"].as_str().unwrap().to_string())
            .collect()
    };
    let all = plan(&[], "experiments/full946.toml");
    assert_eq!(devices(&all), ["0", "1", "2", "3"]);
    assert!(
        all["gpus_from"]
            .as_str()
            .unwrap()
            .contains("every GPU the driver lists (4)"),
        "{all}"
    );
    let text = t
        .cmd()
        .env("PATH", &path)
        .args(["plan", "experiments/full946.toml"])
        .run();
    assert!(
        text.stdout.contains(
            "  GPUs          every GPU the driver lists (4), as CUDA_VISIBLE_DEVICES is unset"
        ),
        "{}",
        text.stdout
    );
    let named = plan(&[("CUDA_VISIBLE_DEVICES", "2")], "experiments/full946.toml");
    assert_eq!(devices(&named), ["2"]);
    assert!(
        named["gpus_from"]
            .as_str()
            .unwrap()
            .contains("CUDA_VISIBLE_DEVICES"),
        "{named}"
    );
    let probe = t.path().join("experiments/probe.toml");
    std::fs::write(
        &probe,
        "kind = \"probe\"\n[prompts]\nfile = \"../assets/prompts/vbench_extended.txt\"\n",
    )
    .unwrap();
    let probe = plan(&[], "experiments/probe.toml");
    assert_eq!(devices(&probe), ["0"]);
}

#[test]
fn shards_go_round_robin_over_visible_gpus_with_one_warmup_each() {
    let t = full946_checkout();
    let out = t
        .cmd()
        .env("CUDA_VISIBLE_DEVICES", "2,3")
        .args(["plan", "--json", "experiments/full946.toml"])
        .run();
    assert_eq!(out.code, 0, "{}", out.render());
    let plan: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let slots: Vec<u64> = plan["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["slot"].as_u64().unwrap())
        .collect();
    assert_eq!(slots, vec![0, 1, 0, 1, 0, 1, 0, 1]);
    let warmups: Vec<&serde_json::Value> = plan["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["role"] == "warmup")
        .collect();
    assert_eq!(warmups.len(), 2, "one warmup per GPU with scope run_gpu");
    assert!(
        warmups[0]["cache_dir"]
            .as_str()
            .unwrap()
            .ends_with("runtime_state/gpu2")
    );
    let out = t
        .cmd()
        .env("UNSTEP_CACHE_SCOPE", "shard")
        .args(["plan", "--json", "experiments/full946.toml"])
        .run();
    let plan: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let warmups = plan["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["role"] == "warmup")
        .count();
    assert_eq!(
        warmups, 8,
        "a fresh cache and warmup per shard with scope shard"
    );
}

/// The `--explain` line of a setting.
fn setting_line<'a>(stdout: &'a str, key: &str) -> &'a str {
    stdout
        .lines()
        .find(|l| l.trim_start().starts_with(key))
        .unwrap_or_else(|| panic!("no line for {key}:\n{stdout}"))
}

#[test]
fn explain_shows_the_layer_of_each_setting() {
    let t = full946_checkout();
    let out = t
        .cmd()
        .env("UNSTEP_CACHE_SCOPE", "shard")
        .args(["plan", "--explain", "experiments/full946.toml"])
        .run();
    assert_eq!(out.code, 0, "{}", out.render());
    let line = setting_line(&out.stdout, "cache.scope");
    assert!(
        line.contains("\"shard\"") && line.contains("env UNSTEP_CACHE_SCOPE"),
        "{line}"
    );

    let out = t
        .cmd()
        .env("UNSTEP_CACHE_SCOPE", "shard")
        .args([
            "plan",
            "--explain",
            "experiments/full946.toml",
            "--set",
            "cache.scope=run_gpu",
        ])
        .run();
    assert_eq!(out.code, 0, "{}", out.render());
    let line = setting_line(&out.stdout, "cache.scope");
    assert!(
        line.contains("\"run_gpu\"") && line.contains("flag --set cache.scope=run_gpu"),
        "{line}"
    );
    let line = setting_line(&out.stdout, "shards.count");
    assert!(line.contains("experiments/full946.toml:16:9"), "{line}");
    let line = setting_line(&out.stdout, "method.clean_sigma");
    assert!(line.contains("default"), "{line}");
}

#[test]
fn ablation_overrides_its_parent_and_extra_args_override_both() {
    let out = Test::new()
        .cwd(&repo())
        .cmd()
        .env("UNSTEP_EXTRA_ARGS", "--clean-sigma-override 0.03")
        .args(["plan", "--explain", "experiments/sigma001.toml"])
        .run();
    assert_eq!(out.code, 0, "{}", out.render());
    let line = setting_line(&out.stdout, "method.clean_sigma");
    assert!(
        line.contains("0.03") && line.contains("UNSTEP_EXTRA_ARGS"),
        "{line}"
    );
    let line = setting_line(&out.stdout, "prompts.expect_count");
    assert!(
        line.contains("full946.toml"),
        "inherited from the parent: {line}"
    );
}

/// Runs `runner plan` on a manifest that is wrong, checks exit status 2 and that nothing was
/// written, and snapshots what the user sees.
fn error_case(name: &str, t: Test, env: &[(&str, &str)], args: &[&str]) {
    let before = tree(t.path());
    let mut run = t.cmd().args(["plan"]).args(args.iter().copied());
    for (k, v) in env {
        run = run.env(k, v);
    }
    let out = run.run();
    assert_eq!(out.code, 2, "{name}: {}", out.render());
    assert!(out.stdout.is_empty(), "{name}: nothing on stdout");
    assert_eq!(tree(t.path()), before, "{name}: nothing written");
    filtered(|| insta::assert_snapshot!(format!("error_{name}"), out.render()));
}

const PROMPTS: &str = "a\nb\nc\nd\ne\n";

#[test]
fn errors_are_located_and_hinted() {
    error_case(
        "toml_syntax",
        Test::new().file("m.toml", "kind = \"probe\"\nname = \n"),
        &[],
        &["m.toml"],
    );
    error_case(
        "unknown_key",
        Test::new().file("m.toml", "kind = \"probe\"\n\n[cache]\nscpoe = \"shard\"\n"),
        &[],
        &["m.toml"],
    );
    error_case(
        "wrong_type",
        Test::new().file("m.toml", "kind = \"probe\"\n[warmup]\nrepeats = \"two\"\n"),
        &[],
        &["m.toml"],
    );
    error_case(
        "out_of_range",
        Test::new().file("m.toml", "kind = \"probe\"\n[method]\nclean_sigma = 1.5\n"),
        &[],
        &["m.toml"],
    );
    error_case(
        "indices_unsorted",
        Test::new().file("p.txt", PROMPTS).file(
            "m.toml",
            "kind = \"probe\"\n[prompts]\nfile = \"p.txt\"\nindices = \"3,1\"\n",
        ),
        &[],
        &["m.toml"],
    );
    error_case(
        "indices_duplicate",
        Test::new().file("p.txt", PROMPTS).file(
            "m.toml",
            "kind = \"probe\"\n[prompts]\nfile = \"p.txt\"\nindices = \"0-2,2\"\n",
        ),
        &[],
        &["m.toml"],
    );
    error_case(
        "indices_out_of_range",
        Test::new().file("p.txt", PROMPTS).file(
            "m.toml",
            "kind = \"probe\"\n[prompts]\nfile = \"p.txt\"\nindices = \"0-7\"\n",
        ),
        &[],
        &["m.toml"],
    );
    error_case(
        "expect_count",
        Test::new().file("p.txt", PROMPTS).file(
            "m.toml",
            "kind = \"generation\"\n[prompts]\nfile = \"p.txt\"\nexpect_count = 946\n",
        ),
        &[],
        &["m.toml"],
    );
    error_case(
        "extra_args_unknown_and_launcher_owned",
        Test::new().file("m.toml", "kind = \"probe\"\n"),
        &[("UNSTEP_EXTRA_ARGS", "--clean-sigma-overide 0.01 --seed 3")],
        &["m.toml", "--extra-args", "--shard-index 2"],
    );
    error_case(
        "extra_args_config_and_export",
        Test::new().file("m.toml", "kind = \"probe\"\n"),
        &[],
        &["m.toml", "--extra-args", "--timestep-shift 3 --svd-rank 64"],
    );
    error_case(
        "extends_cycle",
        Test::new()
            .file("a.toml", "kind = \"probe\"\nextends = \"b.toml\"\n")
            .file("b.toml", "kind = \"probe\"\nextends = \"a.toml\"\n"),
        &[],
        &["a.toml"],
    );
    error_case(
        "extends_missing",
        Test::new().file("a.toml", "kind = \"probe\"\nextends = \"nope.toml\"\n"),
        &[],
        &["a.toml"],
    );
    error_case(
        "ablation_same_name",
        Test::new()
            .file("base.toml", "kind = \"generation\"\n")
            .file(
                "abl.toml",
                "extends = \"base.toml\"\nname = \"base\"\n[method]\nclean_sigma = 0.01\n",
            ),
        &[],
        &["abl.toml"],
    );
    error_case(
        "unsafe_paths",
        Test::new().file("bundle/bundle.toml", "").file(
            "m.toml",
            "kind = \"probe\"\n[assets]\nbundle = \"bundle\"\n[outputs]\ndir = \"bundle/out\"\n[staging]\nwork_root = \"/\"\n",
        ),
        &[],
        &["m.toml"],
    );
    error_case(
        "cache_inside_work_root",
        Test::new().file(
            "m.toml",
            "kind = \"probe\"\n[staging]\nwork_root = \"/tmp/unstep_case_stage\"\n[cache]\nrun_state_root = \"/tmp/unstep_case_stage/state\"\n",
        ),
        &[],
        &["m.toml"],
    );
    error_case(
        "env_and_set",
        Test::new().file("m.toml", "kind = \"probe\"\n"),
        &[("WARMUP_REPEATS", "many"), ("UNSTEP_CACHE__SCPOE", "shard")],
        &[
            "m.toml",
            "--set",
            "method.emit=final",
            "--set",
            "cache.scope=shard",
            "--set",
            "cache.scope=run_gpu",
        ],
    );
    error_case(
        "missing_kind",
        Test::new().file("m.toml", "[method]\nclean_sigma = 0.01\n"),
        &[],
        &["m.toml"],
    );
    error_case(
        "cuda_graphs",
        Test::new().file(
            "m.toml",
            "kind = \"probe\"\n[runtime]\nprovider = \"cpu\"\ncuda_graphs = true\n",
        ),
        &[],
        &["m.toml"],
    );
    error_case("missing_manifest", Test::new(), &[], &["nope.toml"]);
}

#[test]
fn several_independent_errors_come_out_together() {
    let t = Test::new().file(
        "m.toml",
        "kind = \"probe\"\n[method]\nclean_sigma = 2.0\nemit = \"final\"\n[warmup]\nrepeats = -1\n",
    );
    let out = t.cmd().args(["plan", "m.toml"]).run();
    assert_eq!(out.code, 2);
    assert_eq!(out.stderr.matches("error:").count(), 3, "{}", out.stderr);
    assert!(out.stderr.contains("3 errors"));
}

#[test]
fn a_closed_pipe_is_not_an_error() {
    use std::process::{Command, Stdio};
    let mut child = Command::new(env!("CARGO_BIN_EXE_runner"))
        .args(["plan", "experiments/full946.toml"])
        .current_dir(repo())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    crate::support::assert_exit_0(&out);
}

/// The documented environment variables (docs/settings.md's layers, the README's ONNX Runtime
/// section and docs/settings.md's diagnostics) are the tables the runner reads them from.
#[test]
fn the_docs_list_every_environment_variable() {
    let settings = std::fs::read_to_string(repo().join("docs/settings.md")).unwrap();
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let start = settings
        .find("3. environment variables")
        .expect("the layers list");
    let item = &settings[start..settings[start..].find("\n4. ").unwrap() + start];
    let listed: std::collections::BTreeSet<&str> = item
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|w| w.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
        .collect();
    let mut known: std::collections::BTreeSet<&str> = unstep::manifest::layers::ENV_VARS
        .iter()
        .map(|v| v.var)
        .collect();
    known.insert(unstep::manifest::layers::EXTRA_ARGS_VAR);
    assert_eq!(listed, known, "docs/settings.md's environment variables");

    // The variables that are not settings: the README's ONNX Runtime section and the
    // diagnostics of docs/settings.md.
    let ort = &readme[readme
        .find("## ONNX Runtime")
        .expect("the ONNX Runtime section")..];
    let diagnostics = &settings[settings.find("## Diagnostics").expect("the diagnostics")..];
    let listed: std::collections::BTreeSet<&str> = [ort, diagnostics]
        .iter()
        .flat_map(|text| text.split('`').skip(1).step_by(2))
        .map(|w| w.split('=').next().unwrap_or(w))
        .filter(|w| w.starts_with("UNSTEP_") || w.starts_with("ORT_"))
        .collect();
    let known: std::collections::BTreeSet<&str> = unstep::env_vars::OTHER_ENV_VARS
        .iter()
        .map(|(name, _)| *name)
        .collect();
    assert_eq!(listed, known, "the other environment variables");
}

/// A text setting given on the command line as a TOML string is the text inside the quotes, as
/// it would be in a manifest: `--set name="x"` names the run `x`.
#[test]
fn quoted_set_values_are_the_text_inside_the_quotes() {
    let t = full946_checkout();
    let out = t
        .cmd()
        .args([
            "plan",
            "--json",
            "experiments/full946.toml",
            "--set",
            "name=\"quoted\"",
            "--set",
            "outputs.dir='out dir'",
        ])
        .run();
    assert_eq!(out.code, 0, "{}", out.render());
    let plan: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(plan["run"], "quoted");
    assert!(
        plan["run_dir"]
            .as_str()
            .unwrap()
            .ends_with("out dir/quoted"),
        "{plan}"
    );
}

/// Only lines of `nvidia-smi` that read as the queried fields become GPUs: a GPU the driver could
/// not query (its line an error message, or `[Unknown Error]` values) is never a
/// `CUDA_VISIBLE_DEVICES` value, and the plan warns with the line as the driver wrote it.
#[test]
fn a_gpu_the_driver_could_not_query_is_reported_not_planned() {
    let t = full946_checkout();
    let csv = "0, NVIDIA H200, 143771, 580.65.06, 9.0\nUnable to determine the device handle \
               for GPU0000:3B:00.0: Unknown Error\n2, [Unknown Error], [Unknown Error], \
               580.65.06, [Unknown Error]\n3, NVIDIA H200, 143771, 580.65.06, 9.0";
    let path = crate::support::fake_nvidia_smi(&t, Some(csv));
    let out = t
        .cmd()
        .env("PATH", &path)
        .args(["plan", "--json", "experiments/full946.toml"])
        .run();
    assert_eq!(out.code, 0, "{}", out.render());
    let plan: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let devices: Vec<&str> = plan["slots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["device"].as_str().unwrap())
        .collect();
    assert_eq!(devices, ["0", "3"]);
    let warnings = plan["warnings"].to_string();
    assert!(
        warnings.contains("Unable to determine the device handle for GPU0000:3B:00.0")
            && warnings.contains("2, [Unknown Error]"),
        "{warnings}"
    );
}

/// A probe's runtime state follows its run folder wherever `outputs.dir` puts it, and a probe
/// with `cache.mode = "shared"` (whose state is still its own) is planned as fresh, not
/// warm-cache.
#[test]
fn a_probes_state_follows_outputs_dir_and_is_labelled_by_where_it_lives() {
    let t = Test::new();
    let text = crate::apply::manifest(&t, "probe", "")
        .replace("[prompts]\n", "[prompts]\nindices = \"0\"\n")
        .replace(
            &format!("dir = \"{}/results\"", t.path().display()),
            &format!("dir = \"{}/elsewhere\"", t.path().display()),
        );
    assert!(text.contains("/elsewhere"), "{text}");
    std::fs::write(t.path().join("p.toml"), &text).unwrap();
    let plan = |extra: &[&str]| {
        let out = t
            .cmd()
            .args(["plan", "--json", "p.toml"])
            .args(extra.iter().copied())
            .run();
        assert_eq!(out.code, 0, "{}", out.render());
        serde_json::from_str::<serde_json::Value>(&out.stdout).unwrap()
    };
    let p = plan(&[]);
    let state = t.path().join("elsewhere/p/runtime_state");
    for process in p["processes"].as_array().unwrap() {
        let dir = process["cache_dir"].as_str().unwrap();
        assert!(
            std::path::Path::new(dir).starts_with(&state),
            "{dir} is not under {}",
            state.display()
        );
    }
    assert_eq!(p["cache_label"], "fresh");
    let shared = plan(&["--set", "cache.mode=shared"]);
    assert_eq!(shared["cache_label"], "fresh", "{shared}");
    let text = t
        .cmd()
        .args(["plan", "p.toml", "--set", "cache.mode=shared"])
        .run();
    assert!(
        text.stdout
            .contains("cache.mode = \"shared\" does not apply to a probe"),
        "{}",
        text.stdout
    );
}

/// The guide's single-prompt smoke probe is the speed probe with prompt 0 and one warmup on
/// prompt 0 (`PROMPT_INDICES=0 WARMUP_PROMPT_INDICES=0 WARMUP_REPEATS=1`): `one_prompt.toml`
/// resolves to `unstep_speed.toml`'s settings in everything else.
#[test]
fn one_prompt_is_the_speed_probe_on_one_prompt() {
    let resolved = |name: &str| {
        let req = unstep::manifest::load::LoadRequest {
            manifest: repo().join("experiments").join(name),
            env: Default::default(),
            sets: vec![],
            extra_args: vec![],
            cwd: repo(),
        };
        let r = unstep::manifest::load::load(&req).unwrap_or_else(|e| panic!("{name}: {e:?}"));
        let mut v = serde_json::to_value(&r.manifest).unwrap();
        let m = v.as_object_mut().unwrap();
        for k in ["name", "extends", "warmup"] {
            m.remove(k);
        }
        m["prompts"].as_object_mut().unwrap().remove("indices");
        // Named after the run, as its results folder is.
        m["cache"].as_object_mut().unwrap().remove("run_state_root");
        (v, r.manifest.warmup, r.manifest.prompts.indices)
    };
    let (speed, _, _) = resolved("unstep_speed.toml");
    let (one, warmup, indices) = resolved("one_prompt.toml");
    assert_eq!(one, speed, "one_prompt.toml differs from unstep_speed.toml");
    assert_eq!(serde_json::to_value(&indices).unwrap(), "0");
    let warmup = serde_json::to_value(&warmup).unwrap();
    assert_eq!(warmup["indices"], "0");
    assert_eq!(warmup["repeats"], 1);
}
