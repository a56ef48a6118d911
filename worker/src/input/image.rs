//! Whole images (PNG, JPEG, WebP, ...): one object fetched at once, decoded
//! and preprocessed into one chip. A STAC item whose one asset is an image
//! comes here too: its asset is fetched, and the chip keeps the item.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use object_store::ObjectStoreExt;
use rsembed_schemas::chip::ErrorStage;
use rsembed_schemas::ids::Window;
use rsembed_schemas::task::TaskInput;

use crate::context::Counters;
use crate::error::Error;
use crate::input::{input_error, Prepared};
use crate::preprocess::Preprocessor;
use crate::sink::rows::ErrorRow;
use crate::store::StoreCache;
use rsembed_raster::image::{decode_rgb8, DecodeLimits};

pub(super) async fn prepare(
    stores: StoreCache,
    pre: Arc<Preprocessor>,
    limits: DecodeLimits,
    counters: Arc<Counters>,
    input: TaskInput,
) -> std::result::Result<Prepared, ErrorRow> {
    let fetch = async {
        let uri = super::object_uri(&input);
        let loc = stores.location(uri)?;
        let got = loc.store.get(&loc.prefix).await?;
        let size = got.meta.size;
        if size > limits.max_alloc {
            return Err(Error::Input {
                uri: uri.to_owned(),
                stage: ErrorStage::Fetch,
                message: format!(
                    "{size} bytes is over the {} byte limit for a whole image",
                    limits.max_alloc
                ),
            });
        }
        Ok(got.bytes().await?)
    };
    let bytes = fetch
        .await
        .map_err(|e| input_error(&input, ErrorStage::Fetch, e))?;
    counters
        .bytes_read
        .fetch_add(bytes.len() as u64, Ordering::Relaxed);
    let work = tokio::task::spawn_blocking(move || {
        let img = decode_rgb8(&bytes, limits).map_err(|e| {
            (
                ErrorStage::Decode,
                Box::new(e) as Box<dyn std::error::Error + Send + Sync>,
            )
        })?;
        let pixels = pre.run(&img).map_err(|e| {
            (
                ErrorStage::Preprocess,
                Box::new(e) as Box<dyn std::error::Error + Send + Sync>,
            )
        })?;
        Ok::<_, (ErrorStage, Box<dyn std::error::Error + Send + Sync>)>((
            img.width, img.height, pixels,
        ))
    });
    match work.await {
        Ok(Ok((width, height, pixels))) => Ok(Prepared {
            input,
            window: Window {
                x: 0,
                y: 0,
                width: width as i32,
                height: height as i32,
            },
            valid_fraction: 1.0,
            crs: None,
            footprint: None,
            centre: None,
            pixels,
            cloud_fraction: None,
            cell: None,
            identity: None,
            queued: crate::metrics::global().queue_chips.hold(1),
        }),
        Ok(Err((stage, e))) => Err(input_error(&input, stage, e)),
        Err(join) => {
            // A decoder panic is a bug in a dependency, but it must cost one
            // input, not the task.
            let e = std::io::Error::other(format!("decoder panicked: {join}"));
            Err(input_error(&input, ErrorStage::Decode, e))
        }
    }
}
