//! Opening a scene: its bands, georeferencing, chip grid and `--scale auto`
//! stretch, read once per task from the headers and a bounded sample; and the
//! same grid for the planner, from the headers alone.

use std::sync::Arc;

use rsembed_schemas::align::Align;
use rsembed_schemas::ids::Window;
use rsembed_schemas::job::TilingSpec;

use rsembed_schemas::task::Units;

use super::{MaskSource, Scene, SceneError, ScenePart, SceneParts, Source, StretchMemo};
use crate::geo::{self, Crs, GeoTransform, Projector, Tolerance};
use crate::grid::ChipGrid;
use crate::lattice::Lattice;
use crate::scale::{percentile_stretch, ScaleSpec, Stretch};
use crate::tiff::{RangeRead, SampleType, TiffFile, TiffLimits, WindowData};

/// Pixels per band the `--scale auto` sample aims at when the scene has no
/// overview: enough for stable 2nd/98th percentiles (a 512² square).
const STRETCH_SAMPLE_PIXELS: u64 = 1 << 19;
/// Fewest blocks sampled, so that a scene of large tiles is still sampled in
/// several places.
const STRETCH_MIN_BLOCKS: u64 = 8;

/// Georeferencing of one file, with warnings for what cannot be used.
struct FileGeo {
    gt: Option<GeoTransform>,
    crs: Option<Crs>,
}

/// A structurally broken GeoKey directory fails the scene: its georeferencing
/// cannot be trusted, and footprints from it would be worse than none. Keys that
/// are valid but name a CRS we cannot rebuild only null `crs` and `geometry`.
fn file_geo(tiff: &TiffFile, uri: &str) -> Result<FileGeo, SceneError> {
    let tags = tiff.geo_tags();
    let keys = geo::parse_geokeys(tags).map_err(SceneError::GeoKeys)?;
    let gt = geo::geotransform(tags, keys.as_ref()).unwrap_or_else(|e| {
        tracing::warn!(uri, cause = %e, "bad georeferencing tags; no footprints for this scene");
        None
    });
    let crs = keys
        .as_ref()
        .and_then(|k| geo::crs_from_geokeys(k).ok().flatten());
    Ok(FileGeo { gt, crs })
}

impl Scene {
    /// Reads the header, decides bands, georeferencing, grid and stretch.
    ///
    /// With `memo`, a `--scale auto` stretch another task of this process
    /// already computed for the scene is reused instead of read again.
    pub async fn open(
        reader: Arc<dyn RangeRead>,
        tiling: &TilingSpec,
        scale: ScaleSpec,
        limits: TiffLimits,
        uri: &str,
        memo: Option<StretchMemo<'_>>,
    ) -> Result<Scene, SceneError> {
        let tiff = TiffFile::open(reader, limits).await?;
        let bands = select_bands(&tiling.bands, tiff.image().bands)?;
        let g = file_geo(&tiff, uri)?;
        let sources = vec![Source {
            tiff,
            bands,
            factor: 1,
        }];
        Scene::assemble(sources, g, Extras::default(), tiling, scale, uri, memo).await
    }

    /// A scene stored one file per band (`--band-files`), files in channel
    /// order, each giving its first band: [`Scene::open_parts`] with nothing
    /// but the files.
    pub async fn open_band_files(
        readers: Vec<(String, Arc<dyn RangeRead>)>,
        tiling: &TilingSpec,
        scale: ScaleSpec,
        limits: TiffLimits,
        uri: &str,
        memo: Option<StretchMemo<'_>>,
    ) -> Result<Scene, SceneError> {
        let parts = SceneParts {
            files: readers
                .into_iter()
                .map(|(uri, reader)| ScenePart {
                    uri,
                    reader,
                    bands: vec![],
                })
                .collect(),
            mask: None,
            units: vec![],
            grid: None,
        };
        Scene::open_parts(parts, tiling, scale, limits, uri, memo).await
    }

    /// A scene stored as several files (band files, a STAC item's assets),
    /// in channel order, each giving the bands it names; three channels in all.
    ///
    /// The finest grid is the scene's; a file on a coarser grid must line up with
    /// it (same CRS, same origin, an integer multiple of its pixel size) and is
    /// upsampled by nearest neighbour. Anything else is an error for the scene.
    /// The cloud mask follows the same rules; the scene's grid must be
    /// `parts.grid` when that is given; `parts.units` turn `--scale MIN:MAX`
    /// into each channel's range of stored numbers.
    pub async fn open_parts(
        parts: SceneParts,
        tiling: &TilingSpec,
        scale: ScaleSpec,
        limits: TiffLimits,
        uri: &str,
        memo: Option<StretchMemo<'_>>,
    ) -> Result<Scene, SceneError> {
        let mut files = Vec::new();
        for p in parts.files {
            let tiff = TiffFile::open(p.reader, limits.clone()).await?;
            let bands = part_bands(&p.bands, tiff.image().bands)?;
            let g = file_geo(&tiff, &p.uri)?;
            files.push((p.uri, tiff, g, bands));
        }
        let channels: usize = files.iter().map(|f| f.3.len()).sum();
        if channels != 3 {
            let detail = files
                .iter()
                .map(|(u, _, _, b)| {
                    let b: Vec<usize> = b.iter().map(|b| b + 1).collect();
                    format!("{u}: bands {b:?}")
                })
                .collect::<Vec<_>>()
                .join("; ");
            return Err(SceneError::Channels {
                got: channels,
                detail,
            });
        }
        let finest = files
            .iter()
            .enumerate()
            .filter_map(|(i, (_, _, g, _))| g.gt.as_ref().map(|gt| (i, gt.0[1].abs())))
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(i, _)| i)
            .unwrap_or(0);
        let base = Base {
            gt: files[finest].2.gt.as_ref().map(|g| g.0),
            crs: files[finest].2.crs.as_ref().map(Crs::label),
            size: (
                files[finest].1.image().width,
                files[finest].1.image().height,
            ),
        };
        let mut factors = Vec::with_capacity(files.len());
        for (file_uri, _, g, _) in &files {
            factors.push(base.factor(file_uri, g, None)?);
        }
        let mask = match parts.mask {
            Some(m) => {
                let tiff = TiffFile::open(m.reader, limits.clone()).await?;
                let g = file_geo(&tiff, &m.uri)?;
                let size = (tiff.image().width, tiff.image().height);
                let factor = base.factor(&m.uri, &g, Some(size))?;
                Some(MaskSource {
                    tiff,
                    kind: m.kind,
                    factor,
                })
            }
            None => None,
        };
        let mut g = None;
        let mut srcs = Vec::new();
        for (i, ((_, tiff, fg, bands), factor)) in files.into_iter().zip(factors).enumerate() {
            if i == finest {
                g = Some(fg);
            }
            srcs.push(Source {
                tiff,
                bands,
                factor,
            });
        }
        let g = g.expect("the finest file is one of the files");
        let extras = Extras {
            mask,
            units: parts.units,
            grid: parts.grid,
        };
        Scene::assemble(srcs, g, extras, tiling, scale, uri, memo).await
    }

    async fn assemble(
        sources: Vec<Source>,
        g: FileGeo,
        extras: Extras,
        tiling: &TilingSpec,
        scale: ScaleSpec,
        uri: &str,
        memo: Option<StretchMemo<'_>>,
    ) -> Result<Scene, SceneError> {
        let info = sources
            .iter()
            .find(|s| s.factor == 1)
            .unwrap_or(&sources[0])
            .tiff
            .image()
            .clone();
        if let Some(planned) = extras.grid {
            let found = [info.width, info.height];
            if planned != found {
                return Err(SceneError::GridMismatch { planned, found });
            }
        }
        let crs_label = g.crs.as_ref().map(Crs::label);
        let georeferenced = g.gt.is_some();
        let lattice = match tiling.align {
            Align::Scene => None,
            Align::Crs => Some(Lattice::of_scene(
                g.gt.as_ref(),
                g.crs.as_ref(),
                tiling.chip_size,
                tiling.stride,
            )?),
        };
        let grid = match &lattice {
            Some(l) => Some(l.grid(info.width, info.height)),
            None => layout(info.width, info.height, georeferenced, tiling),
        };
        let geo = match (g.gt, g.crs) {
            (Some(gt), Some(crs)) => match Projector::new(&crs) {
                Ok(p) => {
                    let tolerance = Tolerance::of_job(tiling.footprint_tolerance);
                    Some((gt, crs, p.with_tolerance(tolerance)))
                }
                Err(e) => {
                    tracing::warn!(uri, cause = %e, "CRS not reprojectable; geometry is null");
                    None
                }
            },
            (Some(_), None) => {
                tracing::warn!(
                    uri,
                    "georeferenced but the CRS is unknown; crs and geometry are null"
                );
                None
            }
            _ => None,
        };
        let all_u8 = sources
            .iter()
            .all(|s| s.tiff.image().sample_type == SampleType::U8);
        let mut scene = Scene {
            sources,
            width: info.width,
            height: info.height,
            stretch: Stretch::identity(3),
            geo,
            mask: extras.mask,
            grid,
            lattice,
            crs_label,
            units: extras.units.clone(),
            u16_luts: std::sync::OnceLock::new(),
        };
        scene.stretch = match scale {
            ScaleSpec::None => Stretch::identity(3),
            ScaleSpec::Range(lo, hi) => physical_stretch(lo, hi, &extras.units)?,
            ScaleSpec::Auto if all_u8 => Stretch::identity(3),
            ScaleSpec::Auto => match memo {
                Some(m) => {
                    m.cache
                        .get_or_compute(&m.key, scene.scene_stretch())
                        .await?
                }
                None => scene.scene_stretch().await?,
            },
        };
        Ok(scene)
    }

    /// Scene-level percentiles, per source from its smallest overview with
    /// enough pixels, or else from whole blocks (tiles or strips) spread over
    /// it: a bounded read, a fraction of the file, the same for every task.
    async fn scene_stretch(&self) -> Result<Stretch, SceneError> {
        if self.sources.len() > 1 {
            // Band files may sit on different grids: sample on the scene's own,
            // at the finest file's blocks, so a scene stretches the same
            // whichever way its bands are stored.
            let finest = self
                .sources
                .iter()
                .find(|s| s.factor == 1)
                .unwrap_or(&self.sources[0])
                .tiff
                .image();
            let mut samples = vec![Vec::new(); 3];
            let blocks = stretch_blocks(
                self.width,
                self.height,
                finest.block_width,
                finest.block_height,
            );
            for (x, y, w, h) in blocks {
                let w = self
                    .read(Window {
                        x: x as i32,
                        y: y as i32,
                        width: w as i32,
                        height: h as i32,
                    })
                    .await?;
                take_valid(&mut samples, &w);
            }
            return Ok(percentile_stretch(samples));
        }
        let src = &self.sources[0];
        // A one-band raster is read as bands [0, 0, 0]: sample and sort it once.
        let mut distinct = src.bands.clone();
        distinct.sort_unstable();
        distinct.dedup();
        let mut samples = vec![Vec::new(); distinct.len()];
        let ovs = src.tiff.overviews();
        // COG pyramids end at a few dozen pixels: too few for stable percentiles.
        let pick = ovs
            .iter()
            .enumerate()
            .rev()
            .find(|(_, o)| u64::from(o.width) * u64::from(o.height) >= 256 * 256);
        if let Some((i, ov)) = pick {
            let w = src
                .tiff
                .read_window(i + 1, 0, 0, ov.width, ov.height, &distinct)
                .await?;
            take_valid(&mut samples, &w);
        } else {
            let info = src.tiff.image();
            let blocks =
                stretch_blocks(info.width, info.height, info.block_width, info.block_height);
            for (x, y, w, h) in blocks {
                let w = src
                    .tiff
                    .read_window(0, x.into(), y.into(), w, h, &distinct)
                    .await?;
                take_valid(&mut samples, &w);
            }
        }
        let per_band = percentile_stretch(samples);
        let bands = src
            .bands
            .iter()
            .map(|b| {
                let i = distinct
                    .binary_search(b)
                    .expect("every band is in the distinct list");
                per_band.bands[i]
            })
            .collect();
        Ok(Stretch { bands })
    }
}

/// What a scene has besides its bands: a cloud mask, physical units, and
/// the grid it was planned on.
#[derive(Default)]
struct Extras {
    mask: Option<MaskSource>,
    units: Vec<Option<Units>>,
    grid: Option<[u32; 2]>,
}

/// The finest file of a scene, which every other file must line up with.
struct Base {
    gt: Option<[f64; 6]>,
    crs: Option<String>,
    size: (u32, u32),
}

impl Base {
    /// How many scene pixels one pixel of the file `uri` covers per axis.
    ///
    /// Without georeferencing anywhere a file is taken to be on the scene's
    /// grid, as band files always were; a file of known `size` (the mask,
    /// whose pixels are counted, not just shown) must then have the scene's size.
    fn factor(&self, uri: &str, g: &FileGeo, size: Option<(u32, u32)>) -> Result<u32, SceneError> {
        let misaligned = |reason: String| SceneError::Misaligned {
            uri: uri.to_owned(),
            reason,
        };
        match (self.gt, g.gt.as_ref().map(|g| g.0)) {
            (None, None) => match size {
                Some(s) if s != self.size => Err(misaligned(format!(
                    "neither it nor the finest band is georeferenced, and its size {s:?} \
                     differs from the scene's {:?}",
                    self.size
                ))),
                _ => Ok(1),
            },
            (Some(b), Some(f)) => {
                if g.crs.as_ref().map(Crs::label) != self.crs {
                    return Err(misaligned("its CRS differs from the finest band's".into()));
                }
                grid_factor(&b, &f).ok_or_else(|| {
                    misaligned(format!(
                        "its grid (geotransform {f:?}) does not line up with the finest band's ({b:?})"
                    ))
                })
            }
            _ => Err(misaligned(
                "only some of the scene's files are georeferenced".into(),
            )),
        }
    }
}

/// 0-based bands a scene part gives: `asked` (1-based), or band 1 when empty.
fn part_bands(asked: &[u32], bands: usize) -> Result<Vec<usize>, SceneError> {
    if asked.is_empty() {
        return Ok(vec![0]);
    }
    if asked.iter().any(|b| *b == 0 || *b as usize > bands) {
        return Err(SceneError::NoSuchBand {
            asked: asked.to_vec(),
            bands,
        });
    }
    Ok(asked.iter().map(|b| *b as usize - 1).collect())
}

/// `--scale MIN:MAX` as each channel's range of stored numbers: with units
/// (physical = DN·scale + offset), MIN and MAX are physical values, so the
/// range is ((MIN − offset)/scale, (MAX − offset)/scale). A negative scale
/// gives a descending range, which [`Stretch::apply`] maps the same way (MIN
/// to 0, MAX to 255). Channels without units take MIN:MAX as stored numbers.
fn physical_stretch(lo: f64, hi: f64, units: &[Option<Units>]) -> Result<Stretch, SceneError> {
    if units.is_empty() {
        return Ok(Stretch::uniform(3, lo, hi));
    }
    if units.len() != 3 {
        return Err(SceneError::Units {
            channel: units.len().min(3),
            reason: format!("{} channels have units; a scene has 3", units.len()),
        });
    }
    let bands = units
        .iter()
        .enumerate()
        .map(|(c, u)| match u {
            None => Ok(Some((lo, hi))),
            Some(Units { scale, offset }) => {
                let dn = |v: f64| (v - offset) / scale;
                let (a, b) = (dn(lo), dn(hi));
                // A zero or infinite scale squeezes every stored number onto
                // one value: no range of them to stretch.
                if !(scale.is_finite() && offset.is_finite() && a.is_finite() && b.is_finite())
                    || a == b
                {
                    return Err(SceneError::Units {
                        channel: c,
                        reason: format!(
                            "scale {scale} and offset {offset} map no range of stored numbers \
                             onto --scale {lo}:{hi}"
                        ),
                    });
                }
                Ok(Some((a, b)))
            }
        })
        .collect::<Result<_, _>>()?;
    Ok(Stretch { bands })
}

/// The integer factor by which grid `f` is coarser than grid `b`, when `f`
/// lines up with `b`: no rotation, the same origin, pixel sizes k times `b`'s.
fn grid_factor(b: &[f64; 6], f: &[f64; 6]) -> Option<u32> {
    let tol = b[1].abs() * 1e-6;
    if b[2] != 0.0 || b[4] != 0.0 || f[2] != 0.0 || f[4] != 0.0 {
        return None;
    }
    if (b[0] - f[0]).abs() > tol || (b[3] - f[3]).abs() > tol {
        return None;
    }
    let kx = f[1] / b[1];
    let ky = f[5] / b[5];
    let k = kx.round();
    if k < 1.0 || (kx - k).abs() > 1e-6 || (ky - k).abs() > 1e-6 {
        return None;
    }
    Some(k as u32)
}

/// The chip grid of a raster cut from its corner (`--align scene`), or
/// `None` when it is one whole-image chip: a raster without a geotransform,
/// or one no larger than a chip.
fn layout(width: u32, height: u32, georeferenced: bool, tiling: &TilingSpec) -> Option<ChipGrid> {
    let whole = !georeferenced || (width <= tiling.chip_size && height <= tiling.chip_size);
    (!whole).then_some(ChipGrid::from_corner(
        width,
        height,
        tiling.chip_size,
        tiling.stride,
    ))
}

/// The chip grid the planner splits a `width` × `height` raster by, as the
/// worker will cut it: under `--align scene` the scene's own (none for a
/// whole-image chip: no georeferencing, or no larger than a chip); under
/// `--align crs` every georeferenced raster is cut on its lattice, whose grid the
/// planner bounds without knowing where the raster lies
/// ([`ChipGrid::lattice_bound`]), and a raster without georeferencing is
/// one input the worker refuses.
pub fn planned_layout(
    width: u32,
    height: u32,
    georeferenced: bool,
    tiling: &TilingSpec,
) -> Option<ChipGrid> {
    match tiling.align {
        Align::Scene => layout(width, height, georeferenced, tiling),
        Align::Crs => georeferenced
            .then(|| ChipGrid::lattice_bound(width, height, tiling.chip_size, tiling.stride)),
    }
}

/// The chip grid of a TIFF for planning, from its header alone: `None` when
/// the raster is one whole-image chip. The planner and the worker both derive
/// the grid this way, so the blocks a task names are the blocks it reads.
pub async fn plan_grid(
    reader: Arc<dyn RangeRead>,
    tiling: &TilingSpec,
    limits: TiffLimits,
) -> Result<Option<ChipGrid>, SceneError> {
    let tiff = TiffFile::open(reader, limits).await?;
    let info = tiff.image();
    let tags = tiff.geo_tags();
    let keys = geo::parse_geokeys(tags).ok().flatten();
    let georeferenced = matches!(geo::geotransform(tags, keys.as_ref()), Ok(Some(_)));
    Ok(planned_layout(
        info.width,
        info.height,
        georeferenced,
        tiling,
    ))
}

/// The chip grid of a band-file scene, as [`Scene::open_band_files`] lays it:
/// on the finest band's grid. Reads only the headers.
pub async fn plan_band_grid(
    readers: Vec<Arc<dyn RangeRead>>,
    tiling: &TilingSpec,
    limits: TiffLimits,
) -> Result<Option<ChipGrid>, SceneError> {
    // (pixel size, width, height, georeferenced) of the finest file so far;
    // the first of equals wins, as in `open_band_files`.
    let mut best: Option<(f64, u32, u32, bool)> = None;
    for r in readers {
        let tiff = TiffFile::open(r, limits.clone()).await?;
        let info = tiff.image();
        let tags = tiff.geo_tags();
        let keys = geo::parse_geokeys(tags).ok().flatten();
        let gt = geo::geotransform(tags, keys.as_ref()).ok().flatten();
        let px = gt.as_ref().map_or(f64::INFINITY, |g| g.0[1].abs());
        if best.is_none_or(|b| px < b.0) {
            best = Some((px, info.width, info.height, gt.is_some()));
        }
    }
    Ok(best.and_then(|(_, w, h, georeferenced)| planned_layout(w, h, georeferenced, tiling)))
}

/// The blocks (x, y, width, height) a raster without a usable overview is
/// sampled at for `--scale auto`: whole tiles or strips, so each costs one
/// block read and no neighbour, on an even grid of strata over the raster.
///
/// About [`STRETCH_SAMPLE_PIXELS`] pixels in at least [`STRETCH_MIN_BLOCKS`]
/// blocks, but never more than a quarter of the blocks (one block at least):
/// every task of a sharded scene computes the stretch, so what it costs is
/// paid once per task, and must stay well below what the task reads anyway.
fn stretch_blocks(width: u32, height: u32, bw: u32, bh: u32) -> Vec<(u32, u32, u32, u32)> {
    let (bw, bh) = (bw.clamp(1, width.max(1)), bh.clamp(1, height.max(1)));
    let (nx, ny) = (
        u64::from(width.max(1).div_ceil(bw)),
        u64::from(height.max(1).div_ceil(bh)),
    );
    let per_block = u64::from(bw) * u64::from(bh);
    let want = STRETCH_SAMPLE_PIXELS
        .div_ceil(per_block)
        .max(STRETCH_MIN_BLOCKS);
    let cap = (nx * ny / 4).max(1);
    let k = want.min(cap);
    // A kx × ky grid of strata shaped like the block grid, one block at the
    // centre of each.
    let kx = ((k as f64 * nx as f64 / ny as f64).sqrt().round() as u64).clamp(1, nx.min(k));
    let ky = k.div_ceil(kx).min(cap / kx).clamp(1, ny);
    let mut out = Vec::with_capacity((kx * ky) as usize);
    for j in 0..ky {
        let by = ((2 * j + 1) * ny / (2 * ky)) as u32;
        for i in 0..kx {
            let bx = ((2 * i + 1) * nx / (2 * kx)) as u32;
            let (x, y) = (bx * bw, by * bh);
            out.push((x, y, bw.min(width - x), bh.min(height - y)));
        }
    }
    out
}

/// Appends the valid, non-NaN samples of each band of `w`.
fn take_valid(samples: &mut [Vec<f64>], w: &WindowData) {
    let n = (w.width * w.height) as usize;
    for (b, s) in samples.iter_mut().enumerate() {
        let vals = w.values.to_f64(b * n..(b + 1) * n);
        s.extend(
            vals.iter()
                .zip(&w.valid)
                .filter(|(v, ok)| **ok && !v.is_nan())
                .map(|(v, _)| *v),
        );
    }
}

/// 0-based band indexes for `--bands`; a one-band raster replicates band 1
/// when the default 1,2,3 was not changed.
fn select_bands(asked: &[u32], bands: usize) -> Result<Vec<usize>, SceneError> {
    if bands == 1 && asked == [1, 2, 3] {
        return Ok(vec![0, 0, 0]);
    }
    if asked.iter().any(|b| *b == 0 || *b as usize > bands) {
        return Err(SceneError::NoSuchBand {
            asked: asked.to_vec(),
            bands,
        });
    }
    Ok(asked.iter().map(|b| *b as usize - 1).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stretch_sample_is_whole_blocks_and_a_bounded_share() {
        // (width, height, block width, block height)
        let cases = [
            (1550, 1578, 256, 256), // the Landsat band that read its file 16 times
            (1024, 1024, 256, 256),
            (438, 500, 32, 32),
            (10980, 10980, 512, 512),
            (7000, 5000, 7000, 1), // one-row strips
            (300, 200, 300, 200),  // one block
            (600, 600, 512, 512),
            (1, 1, 256, 256),
        ];
        for (w, h, bw, bh) in cases {
            let blocks = stretch_blocks(w, h, bw, bh);
            let n = u64::from(w.div_ceil(bw)) * u64::from(h.div_ceil(bh.min(h)));
            assert!(!blocks.is_empty());
            assert!(
                blocks.len() as u64 <= (n / 4).max(1),
                "{w}x{h}/{bw}x{bh}: {} of {n} blocks",
                blocks.len()
            );
            let mut seen = std::collections::HashSet::new();
            for &(x, y, bw2, bh2) in &blocks {
                assert_eq!((x % bw, y % bh), (0, 0), "block-aligned");
                assert!(x + bw2 <= w && y + bh2 <= h, "inside the raster");
                assert_eq!(bw2, bw.min(w - x));
                assert_eq!(bh2, bh.min(h - y));
                assert!(seen.insert((x, y)), "each block once");
            }
        }
        // Spread over the raster, not bunched in a row or a column.
        let b = stretch_blocks(1550, 1578, 256, 256);
        let xs: std::collections::HashSet<_> = b.iter().map(|b| b.0).collect();
        let ys: std::collections::HashSet<_> = b.iter().map(|b| b.1).collect();
        assert!(xs.len() >= 2 && ys.len() >= 2, "{b:?}");
        // Enough pixels where the raster has them.
        let px: u64 = stretch_blocks(7000, 5000, 7000, 1)
            .iter()
            .map(|b| u64::from(b.2) * u64::from(b.3))
            .sum();
        assert!(px >= STRETCH_SAMPLE_PIXELS, "{px}");
    }
}
