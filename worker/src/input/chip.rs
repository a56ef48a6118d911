//! One chip read again, on its own, exactly as the task that embedded it read
//! it: for pictures of search results (`rsembed search --html`).
//!
//! The same openers as the task runner (`scene.rs`, the tar walk, the image
//! decoder), so a thumbnail is the pipeline's chip by construction, not a
//! look-alike: the same band selection, `--scale` (the scene-level `auto`
//! stretch is computed from the same sample), nodata padding at the edges,
//! tar members and STAC item assets.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use object_store::ObjectStoreExt;
use rsembed_raster::image::{decode_rgb8, is_tiff_content, DecodeLimits, Rgb8};
use rsembed_raster::scale::ScaleSpec;
use rsembed_raster::scene::{MemRange, Scene};
use rsembed_raster::tar::{member_uri, walk, Entry};
use rsembed_raster::tiff::TiffLimits;
use rsembed_schemas::ids::Window;
use rsembed_schemas::job::TilingSpec;
use rsembed_schemas::task::TaskInput;

use crate::context::Counters;
use crate::input::archive::tar_reader;
use crate::input::scene::{open_parts, open_single, Opener};
use crate::input::InputKind;
use crate::store::StoreCache;

/// Why a chip could not be read again.
#[derive(Debug, thiserror::Error)]
pub enum ChipError {
    /// The job's `--scale` does not parse (a spec from another version).
    #[error("the job's --scale `{0}`: {1}")]
    Scale(String, String),
    /// Reading or decoding the source failed.
    #[error("{0}")]
    Source(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The source no longer holds the chip (a member gone, a smaller image).
    #[error("{0}")]
    Missing(String),
}

fn source(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> ChipError {
    ChipError::Source(e.into())
}

/// Reads chips of one job's tiling from their sources.
pub struct ChipReader {
    stores: StoreCache,
    tiling: TilingSpec,
    scale: ScaleSpec,
    tiff_limits: TiffLimits,
    decode_limits: DecodeLimits,
    counters: Counters,
}

impl ChipReader {
    /// A reader for chips cut with `tiling` (a job's, from its file metadata).
    pub fn new(stores: StoreCache, tiling: TilingSpec) -> Result<ChipReader, ChipError> {
        let scale: ScaleSpec = tiling
            .scale
            .parse()
            .map_err(|e: String| ChipError::Scale(tiling.scale.clone(), e))?;
        Ok(ChipReader {
            stores,
            tiling,
            scale,
            tiff_limits: TiffLimits::default(),
            decode_limits: DecodeLimits::default(),
            counters: Counters::default(),
        })
    }

    /// Bytes fetched from storage so far.
    pub fn bytes_read(&self) -> u64 {
        self.counters.bytes_read.load(Ordering::Relaxed)
    }

    /// The chip at `window` of `input`, in 8 bits as the model's
    /// preprocessor received it (before any resize): padding and invalid
    /// pixels are 0, a whole image is itself.
    ///
    /// `input` is what the planner made: a file, a tar member
    /// (`<archive>#<member>`), a `--band-files` scene with its `parts`, or a
    /// STAC item with its `item`.
    pub async fn chip_rgb(&self, input: &TaskInput, window: Window) -> Result<Rgb8, ChipError> {
        let opener = Opener {
            stores: &self.stores,
            counters: &self.counters,
            tiling: &self.tiling,
            scale: self.scale,
            limits: &self.tiff_limits,
        };
        if let Some(reason) = input.item.as_ref().and_then(|i| i.error.as_ref()) {
            return Err(ChipError::Missing(reason.clone()));
        }
        if !input.parts.is_empty() || input.item.is_some() {
            let scene = open_parts(&opener, input)
                .await
                .map_err(|(_, e)| source(e))?;
            return self.cut(&scene, window, &input.uri).await;
        }
        if let Some((archive, _)) = split_member(&input.uri) {
            return self.member(archive, input, window).await;
        }
        match InputKind::of(&input.uri).unwrap_or(InputKind::Image) {
            InputKind::Scene => {
                let scene = open_single(&opener, input)
                    .await
                    .map_err(|(_, e)| source(e))?;
                self.cut(&scene, window, &input.uri).await
            }
            InputKind::Image => {
                let loc = self.stores.location(&input.uri).map_err(source)?;
                let got = loc.store.get(&loc.prefix).await.map_err(source)?;
                if got.meta.size > self.decode_limits.max_alloc {
                    return Err(ChipError::Missing(format!(
                        "{} bytes is over the {} byte limit for a whole image",
                        got.meta.size, self.decode_limits.max_alloc
                    )));
                }
                let bytes = got.bytes().await.map_err(source)?;
                self.counters
                    .bytes_read
                    .fetch_add(bytes.len() as u64, Ordering::Relaxed);
                let limits = self.decode_limits;
                tokio::task::spawn_blocking(move || decode_rgb8(&bytes, limits))
                    .await
                    .map_err(source)?
                    .map_err(source)
            }
            InputKind::Archive => Err(ChipError::Missing(format!(
                "{} is an archive, not one of its members",
                input.uri
            ))),
        }
    }

    async fn cut(&self, scene: &Scene, window: Window, uri: &str) -> Result<Rgb8, ChipError> {
        // Every window of the scene is the grid's (or the whole image);
        // another one was not cut by this tiling.
        if !scene.windows(None).contains(&window) {
            return Err(ChipError::Missing(format!(
                "{uri}: window {},{} {}×{} is not on its chip grid any more (a changed file?)",
                window.x, window.y, window.width, window.height
            )));
        }
        // Min-valid 0: the picture of a chip the job kept, whatever is valid.
        match scene.chip(window, Some(0.0)).await.map_err(source)? {
            Some(c) => Ok(c.rgb),
            None => Err(ChipError::Missing(format!("{uri}: the chip has no pixels"))),
        }
    }

    /// A tar member: the archive is streamed up to the member, as the task
    /// read it, and the member is read as that task read it.
    async fn member(
        &self,
        archive: &str,
        input: &TaskInput,
        window: Window,
    ) -> Result<Rgb8, ChipError> {
        let loc = self.stores.location(archive).map_err(source)?;
        let got = loc.store.get(&loc.prefix).await.map_err(source)?;
        let (reader, limits) = tar_reader(got, &self.counters, &self.decode_limits);
        let (archive, want) = (archive.to_owned(), input.uri.clone());
        let found = tokio::task::spawn_blocking(move || {
            let mut found = None;
            // Stopping the walk once found is a callback error, not a failure.
            let res = walk(reader, limits, |entry| match entry {
                Entry::Image(m) if member_uri(&archive, &m.path) == want => {
                    found = Some(m.data);
                    Err("found".into())
                }
                Entry::Rejected { path, reason } if member_uri(&archive, &path) == want => {
                    Err(reason)
                }
                _ => Ok(()),
            });
            match (found, res) {
                (Some(data), _) => Ok(data),
                (None, Err(e)) => Err(source(e)),
                (None, Ok(_)) => Err(ChipError::Missing(format!(
                    "{want}: no such member in the archive"
                ))),
            }
        })
        .await
        .map_err(source)??;
        if is_tiff_content(&found) {
            let scene = Scene::open(
                Arc::new(MemRange::new(found.into())),
                &self.tiling,
                self.scale,
                self.tiff_limits.clone(),
                &input.uri,
                None,
            )
            .await
            .map_err(source)?;
            return self.cut(&scene, window, &input.uri).await;
        }
        let limits = self.decode_limits;
        tokio::task::spawn_blocking(move || decode_rgb8(&found, limits))
            .await
            .map_err(source)?
            .map_err(source)
    }
}

/// `<archive>#<member>` as its archive and member, when the part before a
/// `#` names an archive.
pub fn split_member(uri: &str) -> Option<(&str, &str)> {
    uri.match_indices('#').find_map(|(i, _)| {
        let archive = &uri[..i];
        (InputKind::of(archive) == Some(InputKind::Archive)).then(|| (archive, &uri[i + 1..]))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_split_at_the_archive() {
        assert_eq!(
            split_member("s3://b/a.tar.gz#dir/x.png"),
            Some(("s3://b/a.tar.gz", "dir/x.png"))
        );
        assert_eq!(
            split_member("file:///t/we#ird.tar#m#1.tif"),
            Some(("file:///t/we#ird.tar", "m#1.tif"))
        );
        assert_eq!(split_member("file:///t/x.tif"), None);
        assert_eq!(split_member("https://h/i.json#frag"), None);
    }
}
