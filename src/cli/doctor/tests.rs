use super::*;

fn row(name: &str, ok: bool, required: bool, fix: Option<&str>) -> Row {
    Row {
        name: name.into(),
        ok,
        required,
        detail: format!("detail of {name}"),
        fix: fix.map(Into::into),
    }
}

/// Every detail and fix starts in one column, also after a name wider than its own; a
/// failed check is FAIL when required and MISS when not.
#[test]
fn details_and_fixes_share_one_column() {
    let long = "library CUDA runtime (libcudart.so.13 or libcudart.so.12)";
    let text = render(&[
        row("onnx runtime", true, true, None),
        row(long, false, true, Some("install it")),
        row("gpus", false, false, Some("add one")),
    ]);
    let column = 5 + NAME_WIDTH + 1;
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 6, "{text}");
    assert_eq!(lines[1], format!("FAIL {long}"));
    for (line, rest) in [
        (lines[0], "detail of onnx runtime"),
        (lines[2], &format!("detail of {long}")),
        (lines[3], "fix: install it"),
        (lines[4], "detail of gpus"),
        (lines[5], "fix: add one"),
    ] {
        assert_eq!(line.get(column..), Some(rest), "{text}");
    }
    assert!(lines[0].starts_with("ok   onnx runtime") && lines[4].starts_with("MISS gpus"));
}

/// The summary counts the failed required checks and names what was asked about; failed checks
/// that are not required do not count.
#[test]
fn the_summary_counts_the_failed_required_checks() {
    let needs = Needs {
        providers: vec![ProviderKind::Cuda],
        ..Needs::default()
    };
    let rows = [
        row("onnx runtime", true, true, None),
        row("gpus", false, true, Some("x")),
        row("execution provider cuda", false, true, Some("y")),
        row("bundle assets/other", false, false, Some("z")),
    ];
    assert_eq!(
        summary(&needs, &rows),
        "\nnot ready for a run on provider cuda: 2 required checks failed (FAIL above)\n\
         docs/gpu.md tells what each failure means and how to fix it\n"
    );
    let cpu = Needs::default();
    let text = summary(&cpu, &rows[..1]);
    assert!(
        text.starts_with("\nready for ONNX Runtime on the CPU: every required check passed\n")
            && text.contains("--provider cuda to require them"),
        "{text}"
    );
}

/// Driver versions compare as numbers, so 580.159 is newer than 580.65.06 and 575 older.
#[test]
fn driver_versions_compare_as_numbers() {
    let cases = [
        ("580.65.06", true),
        ("580.159.04", true),
        ("590.44.01", true),
        ("580.65", false),
        ("575.57.08", false),
        ("535.230.02", false),
    ];
    for (text, new_enough) in cases {
        let version = driver_version(text).unwrap();
        assert_eq!(version >= MIN_DRIVER, new_enough, "{text}");
    }
    assert_eq!(driver_version("580"), Some((580, 0, 0)));
    assert_eq!(driver_version("N/A"), None);
    assert_eq!(min_driver_text(), "580.65.06");
}

/// A library is loaded as a run would load it and named by the file mapped, by soname or
/// by path; a missing one gives the loader's message, which names it.
#[test]
fn libraries_are_loaded_and_named_by_their_file() {
    let libc = load_library("libc.so.6").unwrap();
    assert!(
        libc.starts_with('/') && libc.rsplit('/').next().unwrap().starts_with("libc"),
        "{libc}"
    );
    assert_eq!(load_library(&libc).unwrap(), libc);
    let missing = load_library("libunstep_absent.so.1").unwrap_err();
    assert!(missing.contains("libunstep_absent.so.1"), "{missing}");
}

/// The missing driver library is told apart from a missing CUDA library and from TensorRT.
#[test]
fn a_provider_library_fix_names_what_is_missing() {
    let driver = provider_library_fix(
        ProviderKind::Cuda,
        "libcuda.so.1: cannot open shared object file: No such file or directory",
        &[],
    );
    assert!(
        driver.contains("NVIDIA driver") && driver.contains("580.65.06"),
        "{driver}"
    );
    let cudnn = provider_library_fix(
        ProviderKind::Cuda,
        "libcublasLt.so.13: cannot open shared object file",
        &[PathBuf::from("/venv/nvidia/cu13/lib")],
    );
    assert!(
        cudnn.contains("scripts/setup-gpu") && cudnn.contains("(/venv/nvidia/cu13/lib)"),
        "{cudnn}"
    );
    let trt = provider_library_fix(
        ProviderKind::Tensorrt,
        "libnvinfer.so.10: cannot open shared object file",
        &[],
    );
    assert!(trt.contains("TensorRT 10"), "{trt}");
}

/// `ldd`'s lines for libraries it does not find give their sonames; found ones and the loader's
/// own lines give nothing.
#[test]
fn the_links_ldd_does_not_find_are_named() {
    let ldd = "\tlinux-vdso.so.1 (0x00007ffd)\n\
               \tlibcudnn.so.9 => not found\n\
               \tlibcublasLt.so.13 => /opt/cuda/lib/libcublasLt.so.13 (0x00007f00)\n\
               \tlibcuda.so.1 => not found\n\
               \t/lib64/ld-linux-x86-64.so.2 (0x00007f11)\n";
    assert_eq!(
        parse_missing_links(ldd),
        vec!["libcudnn.so.9".to_string(), "libcuda.so.1".to_string()]
    );
    // A library that links nothing missing, checked for real.
    let libc = std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .find_map(|l| {
            l.split_whitespace()
                .last()
                .filter(|p| p.contains("/libc.so"))
                .map(String::from)
        });
    if let Some(libc) = libc {
        assert_eq!(missing_links(Path::new(&libc)), Ok(vec![]));
    }
}

/// A missing GPU provider's fix on aarch64, where onnxruntime-gpu has no build, points at a CUDA
/// build of ONNX Runtime and `scripts/setup-gpu` with ORT_DYLIB_PATH; elsewhere at the wheel.
#[test]
fn a_missing_provider_fix_on_aarch64_asks_for_a_cuda_build() {
    let ort = engine::ort_lib::runtime(None).expect("ONNX Runtime: run through scripts/test");
    let arm = provider_missing_fix_on(ort, "aarch64");
    for part in [
        "onnxruntime-gpu has no aarch64 build",
        "with CUDA",
        "GB200 (Grace + Blackwell)",
        "`ORT_DYLIB_PATH=<its libonnxruntime.so.1.31.1> scripts/setup-gpu`",
    ] {
        assert!(arm.contains(part), "{part}: {arm}");
    }
    let x86 = provider_missing_fix_on(ort, "x86_64");
    assert!(
        x86.contains("scripts/setup-gpu") && !x86.contains("aarch64"),
        "{x86}"
    );
}
