//! Bad input loses nothing else: bad images become error rows, bad model
//! directories and unwritable outputs stop the run before any work, with a
//! message that names what is wrong.

use std::io::Cursor;
use std::path::{Path, PathBuf};

use rsembed_integration_tests::*;
use serde_json::Value;

fn good_png(seed: u8) -> Vec<u8> {
    let img = image::RgbImage::from_fn(96, 80, |x, y| {
        image::Rgb([x as u8 ^ seed, y as u8, (x + y) as u8])
    });
    let mut out = Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png).unwrap();
    out.into_inner()
}

fn good_jpeg() -> Vec<u8> {
    let img = image::RgbImage::from_fn(128, 128, |x, y| {
        image::Rgb([(x * 2) as u8, (y * 2) as u8, ((x * y) % 251) as u8])
    });
    let mut out = Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Jpeg).unwrap();
    out.into_inner()
}

/// A folder of good images plus every kind of bad one the issue names.
fn bad_folder(dir: &Path) -> Vec<(&'static str, bool)> {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("good1.png"), good_png(1)).unwrap();
    std::fs::write(dir.join("good2.png"), good_png(2)).unwrap();
    std::fs::write(dir.join("good3.jpg"), good_jpeg()).unwrap();
    std::fs::write(dir.join("zero.png"), b"").unwrap();
    let png = good_png(3);
    std::fs::write(dir.join("truncated.png"), &png[..png.len() / 2]).unwrap();
    let mut jpg = good_jpeg();
    // Keep the headers and the end marker; wreck the entropy-coded scan.
    let sos = jpg.windows(2).position(|w| w == [0xFF, 0xDA]).unwrap();
    let end = jpg.len() - 2;
    for (i, b) in jpg[sos + 20..end].iter_mut().enumerate() {
        *b = if i % 7 == 0 {
            0xFF
        } else {
            (i * 37 % 256) as u8
        };
    }
    std::fs::write(dir.join("corrupt.jpg"), &jpg).unwrap();
    std::fs::write(dir.join("notes.jpg"), b"this is a text file, not a JPEG\n").unwrap();
    vec![
        ("good1.png", true),
        ("good2.png", true),
        ("good3.jpg", true),
        ("zero.png", false),
        ("truncated.png", false),
        ("corrupt.jpg", false),
        ("notes.jpg", false),
    ]
}

#[test]
fn bad_images_become_error_rows_and_exit_3() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    let out = tmp.path().join("out");
    let files = bad_folder(&input);
    let o = run(run_cmd(&input, &out, &tiny_model()).args(["--task-size", "2"]));
    assert_eq!(o.status.code(), Some(3), "finished, with failed inputs");

    let chips = duckdb(&format!(
        "SELECT source_uri FROM '{}/chips/*.parquet' ORDER BY 1",
        out.display()
    ));
    let errors = duckdb(&format!(
        "SELECT source_uri, stage, error FROM '{}/errors/*.parquet' ORDER BY 1",
        out.display()
    ));
    let uri = |name: &str| format!("file://{}", input.join(name).display());
    let chip_uris: Vec<&str> = chips
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r[0].as_str().unwrap())
        .collect();
    let err_uris: Vec<&str> = errors
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r[0].as_str().unwrap())
        .collect();
    for (name, good) in &files {
        let u = uri(name);
        if *good {
            assert!(chip_uris.contains(&u.as_str()), "{name} has its row");
            assert!(!err_uris.contains(&u.as_str()));
        } else {
            assert!(err_uris.contains(&u.as_str()), "{name} has an error row");
            assert!(!chip_uris.contains(&u.as_str()));
        }
    }
    assert_eq!(chip_uris.len(), 3);
    assert_eq!(err_uris.len(), 4);
    for r in errors.as_array().unwrap() {
        let reason = r[2].as_str().unwrap();
        assert!(!reason.is_empty());
        assert_eq!(r[1], "decode", "{r:?}");
    }
    let reason_of = |name: &str| {
        errors
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r[0] == uri(name).as_str())
            .unwrap()[2]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert!(
        reason_of("zero.png").contains("empty"),
        "{}",
        reason_of("zero.png")
    );
    assert!(reason_of("notes.jpg").contains("not a PNG, JPEG or TIFF"));

    let manifest: Value =
        serde_json::from_slice(&std::fs::read(out.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["failed_inputs"], 4);
    assert_eq!(manifest["rows"], 3);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("failed inputs   4"), "{stdout}");
}

fn damaged_model(tmp: &Path, damage: impl FnOnce(&Path)) -> PathBuf {
    let m = tmp.join("model");
    copy_dir(&tiny_model(), &m);
    damage(&m);
    m
}

fn edit_manifest(m: &Path, f: impl FnOnce(&mut Value)) {
    let p = m.join("rsembed-model.json");
    let mut v: Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(&p, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
}

fn run_with_model(model: &Path, out: &Path) -> (Option<i32>, String) {
    let o = run(&mut run_cmd(&fixture_images(), out, model));
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn model_missing_a_file_names_it() {
    let tmp = tempfile::tempdir().unwrap();
    let m = damaged_model(tmp.path(), |m| {
        std::fs::remove_file(m.join("vision_model.onnx")).unwrap()
    });
    let out = tmp.path().join("out");
    let (code, err) = run_with_model(&m, &out);
    assert_ne!(code, Some(0));
    assert!(err.contains("vision_model.onnx"), "{err}");
    assert!(!out.join("manifest.json").exists());
    assert!(!out.join("job.json").exists());

    let m2 = tmp.path().join("model2");
    copy_dir(&tiny_model(), &m2);
    std::fs::remove_file(m2.join("preprocessor_config.json")).unwrap();
    let (code, err) = run_with_model(&m2, &out);
    assert_ne!(code, Some(0));
    assert!(err.contains("preprocessor_config.json"), "{err}");
}

#[test]
fn model_naming_a_missing_tensor_names_it() {
    let tmp = tempfile::tempdir().unwrap();
    let m = damaged_model(tmp.path(), |m| {
        edit_manifest(m, |v| v["vision"]["output"] = "pooled_nope".into())
    });
    let out = tmp.path().join("out");
    let (code, err) = run_with_model(&m, &out);
    assert_ne!(code, Some(0));
    assert!(err.contains("pooled_nope"), "{err}");
    assert!(err.contains("vision_model.onnx"), "{err}");
    assert!(!out.join("manifest.json").exists());
}

#[test]
fn model_with_wrong_embed_dim_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let m = damaged_model(tmp.path(), |m| {
        edit_manifest(m, |v| {
            v["embed_dim"] = (v["embed_dim"].as_u64().unwrap() + 1).into()
        })
    });
    let out = tmp.path().join("out");
    let (code, err) = run_with_model(&m, &out);
    assert_ne!(code, Some(0));
    assert!(err.contains("embed_dim"), "{err}");
    assert!(err.contains("image_embeds"), "{err}");
    assert!(!out.join("manifest.json").exists());
}

#[test]
fn unwritable_output_fails_before_work() {
    let tmp = tempfile::tempdir().unwrap();
    let blocker = tmp.path().join("a-file");
    std::fs::write(&blocker, b"x").unwrap();
    let out = blocker.join("out");
    let o = run(&mut run_cmd(&fixture_images(), &out, &tiny_model()));
    assert_ne!(o.status.code(), Some(0));
    assert_ne!(o.status.code(), Some(3));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("output"), "{err}");
    assert!(err.contains(out.to_str().unwrap()), "{err}");
}

#[test]
fn missing_ort_library_says_how_to_get_it() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let o = run(run_cmd(&fixture_images(), &out, &tiny_model())
        .env("ORT_DYLIB_PATH", tmp.path().join("libonnxruntime.so")));
    assert_ne!(o.status.code(), Some(0));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("ORT_DYLIB_PATH"), "{err}");
    assert!(err.contains("scripts/setup-ort.sh"), "{err}");
    assert!(err.contains("onnxruntime==1.31.1"), "{err}");
    assert!(!tmp.path().join("out/manifest.json").exists());
}
