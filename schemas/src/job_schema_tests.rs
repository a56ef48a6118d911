//! A job keeps the chip schema version it started with; `--align` is part of
//! a job's identity only when it is `crs`.

use super::*;

fn tiling(version: u32) -> TilingSpec {
    TilingSpec {
        chip_size: 256,
        stride: 256,
        bands: vec![1, 2, 3],
        scale: "auto".into(),
        min_valid: None,
        band_files: None,
        assets: None,
        cloud_mask: None,
        max_cloud: None,
        footprint_tolerance: Some(DEFAULT_FOOTPRINT_TOLERANCE),
        embedding_type: EmbeddingType::F32,
        align: Align::Scene,
        windows: None,
        schema_version: version,
    }
}

fn model() -> ModelRef {
    ModelRef {
        name: "m".into(),
        embed_dim: 8,
        sha256: "aa".into(),
        files: vec![],
        preprocessor_sha256: "bb".into(),
        fp16: false,
    }
}

fn grouping(task_files: u64) -> GroupingSpec {
    GroupingSpec {
        task_files,
        task_bytes: 1 << 30,
        task_chips: 64,
        shard_bytes: 16 << 20,
    }
}

fn job(t: TilingSpec, g: GroupingSpec) -> JobSpec {
    JobSpec::new(
        "file:///in/".into(),
        "file:///out/".into(),
        model(),
        t,
        g,
        "2026-01-01T00:00:00Z".into(),
    )
}

/// The job at the output as an older rsembed wrote it: no schema version
/// in `job.json`.
fn written_before_v3(t: TilingSpec, g: GroupingSpec) -> JobSpec {
    let spec = job(t, g);
    let mut json = serde_json::to_value(&spec).unwrap();
    json["tiling"]
        .as_object_mut()
        .unwrap()
        .remove("schema_version");
    serde_json::from_value(json).unwrap()
}

#[test]
fn scene_alignment_and_version_2_keep_the_fingerprints_they_had() {
    // Computed by rsembed before `--align` and schema 3 existed.
    assert_eq!(tiling(2).fingerprint(), "d40afbc1be795bd86fbdd5f518f01b67");
    assert_eq!(
        JobSpec::fingerprint_of(&model(), &tiling(2)),
        "907238942c928d395b38c8413743eb70"
    );
    // The chip ids do not depend on the schema version; the job does.
    assert_eq!(tiling(3).fingerprint(), tiling(2).fingerprint());
    assert_ne!(
        JobSpec::fingerprint_of(&model(), &tiling(3)),
        JobSpec::fingerprint_of(&model(), &tiling(2))
    );
    let mut crs = tiling(3);
    crs.align = Align::Crs;
    assert_ne!(crs.fingerprint(), tiling(3).fingerprint(), "other chips");
}

#[test]
fn the_version_is_recorded_from_3_on_and_absent_means_2() {
    let new = job(tiling(crate::SCHEMA_VERSION), grouping(64));
    assert_eq!(new.tiling.schema_version, 3);
    let json = serde_json::to_value(&new).unwrap();
    assert_eq!(json["tiling"]["schema_version"], 3);
    assert!(json["tiling"].get("align").is_none(), "scene is left out");
    let back: JobSpec = serde_json::from_value(json).unwrap();
    assert_eq!(back, new);
    let old = written_before_v3(tiling(2), grouping(64));
    assert_eq!(old.tiling.schema_version, 2);
    assert_eq!(old.id(), old.job_id);
    let json = serde_json::to_string(&old).unwrap();
    assert!(!json.contains("schema_version"), "{json}");
    let mut crs = tiling(3);
    crs.align = Align::Crs;
    let json = serde_json::to_value(job(crs, grouping(64))).unwrap();
    assert_eq!(json["tiling"]["align"], "crs");
}

#[test]
fn a_version_2_job_resumes_as_version_2() {
    let theirs = written_before_v3(tiling(2), grouping(64));
    let ours = job(tiling(3), grouping(64));
    assert_ne!(ours.job_id, theirs.job_id);
    let resumed = ours.resuming_schema(Some(&theirs));
    assert_eq!(resumed.job_id, theirs.job_id);
    assert_eq!(resumed.fingerprint, theirs.fingerprint);
    assert_eq!(resumed.tiling.schema_version, 2);
    assert!(resumed.differences(&theirs).is_empty());
    // A new job at an empty output, or over a version 3 job, is version 3.
    let fresh = job(tiling(3), grouping(64)).resuming_schema(None);
    assert_eq!(fresh.tiling.schema_version, 3);
}

#[test]
fn another_job_is_not_taken_for_the_old_one() {
    let theirs = written_before_v3(tiling(2), grouping(64));
    let mut t = tiling(3);
    t.stride = 128;
    let ours = job(t, grouping(64)).resuming_schema(Some(&theirs));
    assert_eq!(
        ours.tiling.schema_version, 3,
        "a new job writes the new schema"
    );
    let d = ours.differences(&theirs);
    let what: Vec<_> = d.iter().map(|d| d.what).collect();
    assert_eq!(what, ["--stride", "the chip schema version"], "{d:?}");
    let mut t = tiling(3);
    t.align = Align::Crs;
    let ours = job(t, grouping(64)).resuming_schema(Some(&theirs));
    let what: Vec<_> = ours.differences(&theirs).iter().map(|d| d.what).collect();
    assert!(what.contains(&"--align"), "{what:?}");
}

#[test]
fn old_groupings_and_footprints_resume_with_the_old_version() {
    // Written before --footprint-tolerance and schema 3: both are taken.
    let mut t = tiling(2);
    t.footprint_tolerance = None;
    let theirs = written_before_v3(t, grouping(64));
    let ours = job(tiling(3), grouping(64))
        .resuming_old_footprints(Some(&theirs))
        .resuming_schema(Some(&theirs));
    assert_eq!(ours.job_id, theirs.job_id);
    assert_eq!(ours.tiling.footprint_tolerance, None);
    // Planned with another default grouping: taken with the version.
    let theirs = written_before_v3(tiling(2), grouping(16));
    let ours = job(tiling(3), grouping(64))
        .resuming_grouping(Some(&theirs))
        .resuming_schema(Some(&theirs));
    assert_eq!(ours.job_id, theirs.job_id);
    assert_eq!(ours.grouping, Some(grouping(16)));
}

#[test]
fn windows_are_the_job_s_identity_and_absent_without_them() {
    use crate::window::{Composite, WindowSpec};
    let quarters = WindowSpec {
        duration: "P3M".into(),
        composite: Composite::Best,
        max_scenes: 64,
        cell_blocks: true,
    };
    let windowed = |w: &WindowSpec| {
        let mut t = tiling(3);
        t.align = Align::Crs;
        t.windows = Some(w.clone());
        job(t, grouping(64))
    };
    let mut plain = tiling(3);
    plain.align = Align::Crs;
    let plain = job(plain, grouping(64));
    let ours = windowed(&quarters);
    // A best row's chip id is the chosen scene's chip id: the tiling is the
    // same, the job is not.
    assert_eq!(ours.tiling.fingerprint(), plain.tiling.fingerprint());
    assert_ne!(ours.fingerprint, plain.fingerprint);
    assert_ne!(ours.job_id, plain.job_id);
    let what: Vec<_> = ours.differences(&plain).iter().map(|d| d.what).collect();
    assert_eq!(what, ["--windows"]);
    // Each flag is named, and each is another job.
    let other = |f: &dyn Fn(&mut WindowSpec)| {
        let mut w = quarters.clone();
        f(&mut w);
        windowed(&w)
    };
    for (flag, theirs) in [
        ("--windows", other(&|w| w.duration = "P1M".into())),
        ("--composite", other(&|w| w.composite = Composite::Median)),
        ("--max-scenes", other(&|w| w.max_scenes = 8)),
    ] {
        assert_ne!(theirs.job_id, ours.job_id, "{flag}");
        assert_ne!(theirs.fingerprint, ours.fingerprint, "{flag}");
        let what: Vec<_> = ours.differences(&theirs).iter().map(|d| d.what).collect();
        assert_eq!(what, [flag]);
    }
    // Recorded, read back; absent from job.json without windows.
    let json = serde_json::to_value(&ours).unwrap();
    assert_eq!(
        json["tiling"]["windows"],
        serde_json::json!({"duration": "P3M", "composite": "best", "max_scenes": 64,
                           "cell_blocks": true})
    );
    let back: JobSpec = serde_json::from_value(json.clone()).unwrap();
    assert_eq!(back, ours);
    // A job the previous version started records no split: it is the same job
    // (the split is not in its id), and resuming it keeps whole windows.
    let mut old_json = json;
    old_json["tiling"]["windows"]
        .as_object_mut()
        .unwrap()
        .remove("cell_blocks");
    let old: JobSpec = serde_json::from_value(old_json).unwrap();
    assert!(!old.tiling.windows.as_ref().unwrap().cell_blocks);
    assert_eq!(old.job_id, ours.job_id);
    assert_eq!(old.fingerprint, ours.fingerprint);
    let resumed = ours.clone().resuming_cell_blocks(Some(&old));
    assert!(!resumed.tiling.windows.as_ref().unwrap().cell_blocks);
    let other = windowed(&WindowSpec {
        max_scenes: 8,
        cell_blocks: false,
        ..quarters.clone()
    });
    let fresh = ours.clone().resuming_cell_blocks(Some(&other));
    assert!(
        fresh.tiling.windows.unwrap().cell_blocks,
        "another job: ours"
    );
    let json = serde_json::to_value(&plain).unwrap();
    assert!(json["tiling"].get("windows").is_none(), "{json}");
}
