use super::*;

#[test]
fn escapes_every_character_that_could_end_a_text_or_an_attribute() {
    assert_eq!(
        esc(r#"a "cat" <b>&</b> it's"#),
        "a &quot;cat&quot; &lt;b&gt;&amp;&lt;/b&gt; it&#39;s"
    );
}

#[test]
fn relative_paths_climb_to_the_common_folder_and_are_url_encoded() {
    let rel = relative(
        Path::new("/r/results"),
        Path::new("/r/results/run=1/videos/a cat #1?.mp4"),
    );
    assert_eq!(rel, Path::new("run=1/videos/a cat #1?.mp4"));
    assert_eq!(url_path(&rel), "run%3D1/videos/a%20cat%20%231%3F.mp4");
    let up = relative(
        Path::new("/r/out/pages"),
        Path::new("/r/results/a/videos/0.mp4"),
    );
    assert_eq!(url_path(&up), "../../results/a/videos/0.mp4");
    // Non-ASCII names are encoded byte by byte, as UTF-8.
    assert_eq!(url_path(Path::new("é.mp4")), "%C3%A9.mp4");
}

#[test]
fn comparison_pages_are_named_after_the_runs_and_long_names_are_cut_with_a_hash() {
    assert_eq!(compare_file_name(&["a", "b"]), "compare-a-vs-b.html");
    assert_eq!(
        compare_file_name(&["ref", "sig=0.01", "sig=0.02"]),
        "compare-ref-vs-sig=0.01-vs-sig=0.02.html"
    );
    let long: Vec<String> = (0..8)
        .map(|i| format!("sweep-clean_sigma=0.00{i}"))
        .collect();
    let long: Vec<&str> = long.iter().map(String::as_str).collect();
    let name = compare_file_name(&long);
    assert_eq!(name.len(), MAX_STEM + ".html".len());
    assert!(
        name.starts_with("compare-sweep-clean_sigma=0.000-vs-"),
        "{name}"
    );
    let mut other = long.clone();
    other[7] = "sweep-clean_sigma=0.009";
    assert_ne!(compare_file_name(&other), name);
}

#[test]
fn page_paths_must_be_html_files_in_existing_folders() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    assert!(check_page_path(&d.join("page.html")).is_ok());
    assert!(check_page_path(&d.join("PAGE.HTM")).is_ok());
    assert!(matches!(
        check_page_path(&d.join("run-b")),
        Err(HtmlError::NotHtml { .. })
    ));
    assert!(matches!(
        check_page_path(&d.join("missing/page.html")),
        Err(HtmlError::NoFolder { .. })
    ));
    std::fs::create_dir(d.join("x.html")).unwrap();
    assert!(matches!(
        check_page_path(&d.join("x.html")),
        Err(HtmlError::IsFolder { .. })
    ));
}
