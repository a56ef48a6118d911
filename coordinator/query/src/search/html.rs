//! `search --html FILE`: the results as one self-contained HTML page.
//!
//! Each hit shows its chip's picture (read by a [`ChipImages`]), rank,
//! score, cosine, date, scene and window, centre and a link to its source;
//! an SVG overview draws every footprint on lon/lat axes. Nothing is loaded
//! from elsewhere: pictures are data URIs, styles inline, no script, no font,
//! no tile server; the page's Content-Security-Policy forbids everything
//! else, so a browser enforces that too.
//!
//! Decisions:
//! - Every text and attribute value is escaped (`esc`); links are made
//!   only for `http(s)://` and `file://` sources (anything else, `s3://`
//!   included, is shown as text), so no source name or item id can inject
//!   markup or a `javascript:` link.
//! - The overview is equirectangular with its standard parallel at the
//!   hits' middle latitude (x = lon·cos φ₀, y = lat), fitted to the hits'
//!   extent with a margin: true shapes at chip scale, no projection library.
//!   Footprints across the antimeridian are drawn as they are stored.

use std::fmt::Write as _;
use std::path::Path;

use base64::Engine;
use futures::future::BoxFuture;
use futures::StreamExt;
use rsembed_raster::image::Rgb8;
use serde_json::Value;

use super::{SearchArgs, SearchResult};
use crate::{Error, Result};

/// Hits read at once: each is a few range reads (or one archive streamed).
const CONCURRENCY: usize = 4;

/// Most pictures on one page, whatever `--top-k` is: beyond this the page
/// would be tens of megabytes of PNG and minutes of reads.
pub const MAX_THUMBNAILS: usize = 200;

/// The chip of a hit, read again from its source as the model saw it (the
/// coordinator's reader: this crate reads no imagery); `Err` is why not.
pub trait ChipImages: Send + Sync {
    /// The 8-bit RGB picture of `r`'s chip.
    fn chip<'a>(&'a self, r: &'a SearchResult) -> BoxFuture<'a, Result<Rgb8, String>>;
}

/// One hit's picture, or why there is none.
#[derive(Debug, Clone, PartialEq)]
pub enum Thumb {
    /// `data:image/png;base64,…` and its size in pixels.
    Png {
        /// The picture.
        data_uri: String,
        /// Width in pixels.
        width: u32,
        /// Height in pixels.
        height: u32,
    },
    /// The source could not be read (the reason), or the hit is past
    /// [`MAX_THUMBNAILS`].
    Missing(String),
}

/// What the page says about the search besides its results.
pub(crate) struct PageInfo {
    /// The query as the user gave it.
    pub(crate) query: String,
    /// The index searched.
    pub(crate) index: String,
    /// When the page was written, RFC 3339.
    pub(crate) created: String,
}

/// The pictures of `results`, in their order. A hit whose chip cannot be
/// read is a placeholder with the reason, never a failed search: the
/// results are already printed.
pub async fn thumbnails(results: &[SearchResult], chips: &dyn ChipImages) -> Vec<Thumb> {
    futures::stream::iter(results.iter().enumerate())
        .map(|(i, r)| async move {
            if i >= MAX_THUMBNAILS {
                return Thumb::Missing(format!(
                    "not drawn: pages show the first {MAX_THUMBNAILS} hits' pictures"
                ));
            }
            let png = chips.chip(r).await.and_then(|img| {
                Ok(Thumb::Png {
                    data_uri: png_data_uri(&img)?,
                    width: img.width,
                    height: img.height,
                })
            });
            png.unwrap_or_else(|reason| {
                tracing::warn!(target: crate::LOG, uri = %r.source_uri, cause = %reason, "no thumbnail");
                Thumb::Missing(reason)
            })
        })
        .buffered(CONCURRENCY)
        .collect()
        .await
}

/// `img` as a `data:image/png;base64,` URI.
pub(crate) fn png_data_uri(img: &Rgb8) -> Result<String, String> {
    let mut out = Vec::new();
    {
        let mut e = png::Encoder::new(&mut out, img.width, img.height);
        e.set_color(png::ColorType::Rgb);
        e.set_depth(png::BitDepth::Eight);
        let mut w = e.write_header().map_err(|e| e.to_string())?;
        w.write_image_data(&img.data).map_err(|e| e.to_string())?;
    }
    Ok(format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(out)
    ))
}

/// Reads the hits' pictures and writes the page to `path`; returns how many
/// pictures could not be drawn.
pub(crate) async fn write(
    args: &SearchArgs,
    results: &[SearchResult],
    chips: &dyn ChipImages,
    path: &Path,
) -> Result<usize> {
    let thumbs = thumbnails(results, chips).await;
    let query = if !args.texts.is_empty() {
        args.texts
            .iter()
            .map(|t| format!("“{t}”"))
            .collect::<Vec<_>>()
            .join(" + ")
    } else if let Some(id) = &args.like {
        format!("--like {id}")
    } else if let Some(v) = &args.vector {
        format!("--vector {}", v.display())
    } else {
        String::new()
    };
    let info = PageInfo {
        query,
        index: args.index.clone(),
        created: rsembed_schemas::datetime::now_rfc3339(),
    };
    let page = render(&info, results, &thumbs);
    std::fs::write(path, page).map_err(|e| Error::Write {
        path: path.display().to_string(),
        source: Box::new(e),
    })?;
    Ok(thumbs
        .iter()
        .filter(|t| matches!(t, Thumb::Missing(_)))
        .count())
}

/// `s` with `& < > " '` as entities: safe as element text and as a quoted
/// attribute value.
pub(crate) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

/// A link target for a source, for the schemes a browser opens by itself
/// (the part of a tar member's URI before `#` is the archive).
fn link_of(uri: &str) -> Option<&str> {
    let lower = uri.to_ascii_lowercase();
    ["https://", "http://", "file://"]
        .iter()
        .any(|s| lower.starts_with(s))
        .then_some(uri)
}

const STYLE: &str = "\
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;background:#fafafa}\
h1{font-size:1.3em;margin:0 0 .2em}\
.meta{color:#555;margin:0 0 1em}\
.overview{background:#fff;border:1px solid #ccc;max-width:100%;height:auto}\
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(300px,1fr));gap:1em;margin-top:1em}\
.hit{background:#fff;border:1px solid #ccc;border-radius:4px;padding:.6em;margin:0}\
.hit img,.missing{display:block;width:256px;height:256px;image-rendering:pixelated;border:1px solid #999}\
.missing{background:repeating-linear-gradient(45deg,#eee,#eee 8px,#ddd 8px,#ddd 16px);\
color:#a00;font-size:12px;overflow:auto;word-break:break-all;padding:4px;box-sizing:border-box}\
.hit table{border-collapse:collapse;margin-top:.4em;font-size:12px;width:100%}\
.hit th{text-align:left;color:#666;font-weight:normal;padding-right:.6em;vertical-align:top;white-space:nowrap}\
.hit td{word-break:break-all}\
.rank{font-weight:bold;font-size:1.1em}\
svg text{font:11px sans-serif}\
";

/// The whole page.
pub(crate) fn render(info: &PageInfo, results: &[SearchResult], thumbs: &[Thumb]) -> String {
    let mut h = String::new();
    let title = format!("rsembed search: {}", info.query);
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; \
         img-src data:; style-src 'unsafe-inline'\">\
         <meta name=\"viewport\" content=\"width=device-width\">\
         <title>{}</title><style>{STYLE}</style></head><body>\n\
         <h1>{}</h1><p class=\"meta\">index {} · {} hit(s) · written {} by rsembed {}</p>\n",
        esc(&title),
        esc(&title),
        esc(&info.index),
        results.len(),
        esc(&info.created),
        env!("CARGO_PKG_VERSION"),
    );
    h.push_str(&overview(results));
    h.push_str("\n<div class=\"grid\">\n");
    for (i, r) in results.iter().enumerate() {
        let t = thumbs.get(i);
        h.push_str(&card(r, t));
    }
    h.push_str("</div>\n</body></html>\n");
    h
}

/// A hit's label: its rank, and in a batch (`--vectors`, `--queries`) its
/// query's line too, since every query has a rank 1.
fn label(r: &SearchResult) -> String {
    match r.query {
        Some(q) => format!("{q}-{}", r.rank),
        None => r.rank.to_string(),
    }
}

fn card(r: &SearchResult, thumb: Option<&Thumb>) -> String {
    let mut h = format!("<figure class=\"hit\" id=\"hit-{}\">", label(r));
    match thumb {
        Some(Thumb::Png {
            data_uri,
            width,
            height,
        }) => {
            let _ = write!(
                h,
                "<img src=\"{}\" width=\"{width}\" height=\"{height}\" alt=\"chip {}\">",
                esc(data_uri),
                esc(&r.chip_id)
            );
        }
        Some(Thumb::Missing(reason)) => {
            let _ = write!(
                h,
                "<div class=\"missing\" role=\"img\">no picture: {}</div>",
                esc(reason)
            );
        }
        None => h.push_str("<div class=\"missing\" role=\"img\">no picture</div>"),
    }
    let mut rows: Vec<(&str, String)> = vec![
        (
            "score",
            r.score.map_or("-".to_owned(), |s| format!("{s:.3e}")),
        ),
        ("cosine", format!("{:.5}", r.cosine)),
    ];
    if let Some(d) = &r.datetime {
        let d = match &r.end_datetime {
            Some(e) => format!("{d} – {e}"),
            None => d.clone(),
        };
        rows.push(("datetime", esc(&d)));
    }
    if let Some(s) = &r.window_start {
        let w = match &r.window_end {
            Some(e) => format!("{s} – {e}"),
            None => s.clone(),
        };
        rows.push(("time window", esc(&w)));
    }
    if let Some(c) = &r.cell {
        rows.push(("cell", esc(c)));
    }
    if let Some(c) = &r.grid_cell {
        rows.push(("grid cell", esc(c)));
    }
    if let Some(id) = &r.item_id {
        rows.push(("item", esc(id)));
    }
    if let Some(c) = &r.collection {
        rows.push(("collection", esc(c)));
    }
    if let Some(c) = r.cloud_fraction {
        rows.push(("cloud", format!("{c:.3}")));
    }
    let src = match link_of(&r.source_uri) {
        Some(href) => format!("<a href=\"{}\">{}</a>", esc(href), esc(&r.source_uri)),
        None => esc(&r.source_uri),
    };
    rows.push(("source", src));
    rows.push((
        "window",
        format!("{},{} {}×{} px", r.x, r.y, r.width, r.height),
    ));
    if let (Some(lon), Some(lat)) = (r.centre_lon, r.centre_lat) {
        rows.push(("centre", format!("{lon:.5}, {lat:.5}")));
    }
    if let Some(crs) = &r.crs {
        rows.push(("crs", esc(crs)));
    }
    rows.push(("valid", format!("{:.3}", r.valid_fraction)));
    rows.push(("chip_id", esc(&r.chip_id)));
    let _ = write!(
        h,
        "<figcaption><span class=\"rank\">{}#{}</span><table>",
        r.query.map_or(String::new(), |q| format!("query {q} ")),
        r.rank
    );
    for (k, v) in rows {
        let _ = write!(h, "<tr><th>{k}</th><td>{v}</td></tr>");
    }
    h.push_str("</table></figcaption></figure>\n");
    h
}

/// A ring of (lon, lat) vertices.
type Ring = Vec<(f64, f64)>;

/// The outer rings of a GeoJSON Polygon or MultiPolygon.
fn rings(g: &Value) -> Vec<Ring> {
    let ring = |r: &Value| -> Option<Ring> {
        r.as_array()?
            .iter()
            .map(|p| {
                let p = p.as_array()?;
                let (x, y) = (p.first()?.as_f64()?, p.get(1)?.as_f64()?);
                (x.is_finite() && y.is_finite()).then_some((x, y))
            })
            .collect()
    };
    let coords = g.get("coordinates");
    match g.get("type").and_then(Value::as_str) {
        Some("Polygon") => coords
            .and_then(|c| c.get(0))
            .and_then(ring)
            .into_iter()
            .collect(),
        Some("MultiPolygon") => coords
            .and_then(Value::as_array)
            .map(|ps| ps.iter().filter_map(|p| p.get(0).and_then(ring)).collect())
            .unwrap_or_default(),
        _ => vec![],
    }
}

/// A step of 1, 2 or 5 × 10ⁿ degrees giving about `n` lines over `span`.
fn nice_step(span: f64, n: f64) -> f64 {
    let raw = (span / n).max(1e-9);
    let p = 10f64.powf(raw.log10().floor());
    let m = raw / p;
    let m = if m < 1.5 {
        1.0
    } else if m < 3.5 {
        2.0
    } else if m < 7.5 {
        5.0
    } else {
        10.0
    };
    m * p
}

/// Digits after the point that a step of `step` degrees needs.
fn decimals(step: f64) -> usize {
    (-step.log10().floor()).clamp(0.0, 9.0) as usize
}

/// Overview width in SVG units.
const MAP_W: f64 = 900.0;

/// The SVG overview of every footprint, with a graticule and rank labels.
pub(crate) fn overview(results: &[SearchResult]) -> String {
    // Rank, outer rings and centre, of the hits that have any.
    type Shape = (String, Vec<Ring>, Option<(f64, f64)>);
    let shapes: Vec<Shape> = results
        .iter()
        .map(|r| {
            let rs = r.geometry().as_ref().map(rings).unwrap_or_default();
            let centre = r.centre_lon.zip(r.centre_lat);
            (label(r), rs, centre)
        })
        .filter(|(_, rs, c)| !rs.is_empty() || c.is_some())
        .collect();
    if shapes.is_empty() {
        return "<p class=\"meta\">No hit is georeferenced: no overview.</p>".into();
    }
    let pts = shapes.iter().flat_map(|(_, rs, c)| {
        rs.iter()
            .flat_map(|r| r.iter().copied())
            .chain(c.iter().copied())
    });
    let (mut x0, mut y0, mut x1, mut y1) = (f64::MAX, f64::MAX, f64::MIN, f64::MIN);
    for (x, y) in pts {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    let k = ((y0 + y1) / 2.0).to_radians().cos().max(0.01);
    // A margin of 8 %, and at least a few metres, so one chip is not a point.
    let (mx, my) = (
        ((x1 - x0) * 0.08).max(1e-4 / k),
        ((y1 - y0) * 0.08).max(1e-4),
    );
    let (x0, x1, y0, y1) = (x0 - mx, x1 + mx, y0 - my, y1 + my);
    let (w_deg, h_deg) = ((x1 - x0) * k, y1 - y0);
    let s = MAP_W / w_deg;
    let map_h = (h_deg * s).clamp(120.0, 900.0);
    // A view taller than the clamp is scaled to fit, keeping the aspect.
    let s = s.min(map_h / h_deg);
    let (ox, oy) = ((MAP_W - w_deg * s) / 2.0, (map_h - h_deg * s) / 2.0);
    let px = |lon: f64, lat: f64| (ox + (lon - x0) * k * s, oy + (y1 - lat) * s);
    let mut h = format!(
        "<svg class=\"overview\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{MAP_W}\" \
         height=\"{map_h:.0}\" viewBox=\"0 0 {MAP_W} {map_h:.1}\" role=\"img\" \
         aria-label=\"footprints of the hits, lon/lat\">"
    );
    // Graticule.
    h.push_str("<g stroke=\"#ddd\" stroke-width=\"1\" fill=\"#888\">");
    let step = nice_step((x1 - x0).max(y1 - y0), 5.0);
    let d = decimals(step);
    let mut lon = (x0 / step).ceil() * step;
    while lon <= x1 {
        let (x, _) = px(lon, y0);
        let _ = write!(
            h,
            "<line x1=\"{x:.1}\" y1=\"0\" x2=\"{x:.1}\" y2=\"{map_h:.1}\"/>"
        );
        // A label that would run off the right edge is left out.
        if x < MAP_W - 60.0 {
            let _ = write!(
                h,
                "<text x=\"{:.1}\" y=\"{:.1}\" stroke=\"none\">{lon:.d$}°</text>",
                x + 2.0,
                map_h - 4.0
            );
        }
        lon += step;
    }
    let mut lat = (y0 / step).ceil() * step;
    while lat <= y1 {
        let (_, y) = px(x0, lat);
        let _ = write!(
            h,
            "<line x1=\"0\" y1=\"{y:.1}\" x2=\"{MAP_W}\" y2=\"{y:.1}\"/>\
             <text x=\"2\" y=\"{:.1}\" stroke=\"none\">{lat:.d$}°</text>",
            y - 2.0
        );
        lat += step;
    }
    h.push_str("</g>");
    // Footprints, worst first so the best is drawn on top.
    for (rank, rs, centre) in shapes.iter().rev() {
        let _ = write!(
            h,
            "<a href=\"#hit-{rank}\"><title>#{rank}</title><g class=\"fp\" \
             fill=\"rgba(220,60,30,0.15)\" stroke=\"#c33\" stroke-width=\"1.5\">"
        );
        let mut sum = (0.0, 0.0, 0usize);
        for r in rs {
            let pts: Vec<String> = r
                .iter()
                .map(|&(lon, lat)| {
                    let (x, y) = px(lon, lat);
                    sum = (sum.0 + x, sum.1 + y, sum.2 + 1);
                    format!("{x:.1},{y:.1}")
                })
                .collect();
            let _ = write!(h, "<polygon points=\"{}\"/>", pts.join(" "));
        }
        let at = match centre {
            Some((lon, lat)) => Some(px(*lon, *lat)),
            None if sum.2 > 0 => Some((sum.0 / sum.2 as f64, sum.1 / sum.2 as f64)),
            None => None,
        };
        if let Some((x, y)) = at {
            let _ = write!(
                h,
                "<text x=\"{x:.1}\" y=\"{y:.1}\" text-anchor=\"middle\" dominant-baseline=\"middle\" \
                 fill=\"#600\" stroke=\"#fff\" stroke-width=\"3\" paint-order=\"stroke\">{rank}</text>"
            );
        }
        h.push_str("</g></a>");
    }
    h.push_str("</svg>");
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hit(rank: usize, uri: &str, lon: f64, lat: f64) -> SearchResult {
        let d = 0.01;
        SearchResult {
            query: None,
            rank,
            score: Some(0.5),
            cosine: 0.25,
            chip_id: "0123456789abcdef0123456789abcdef".into(),
            source_uri: uri.into(),
            x: 0,
            y: 0,
            width: 256,
            height: 256,
            valid_fraction: 1.0,
            crs: Some("EPSG:32618".into()),
            centre_lon: Some(lon),
            centre_lat: Some(lat),
            item_id: None,
            collection: None,
            datetime: None,
            end_datetime: None,
            cloud_fraction: None,
            cell: None,
            grid_cell: None,
            window_start: None,
            window_end: None,
            wkb: Some(rsembed_raster::geo::polygon_wkb(&[
                (lon - d, lat - d),
                (lon + d, lat - d),
                (lon + d, lat + d),
                (lon - d, lat + d),
                (lon - d, lat - d),
            ])),
            tiling: None,
        }
    }

    fn info() -> PageInfo {
        PageInfo {
            query: "“a harbour”".into(),
            index: "file:///d".into(),
            created: "2026-01-01T00:00:00Z".into(),
        }
    }

    #[test]
    fn hostile_names_stay_text() {
        let evil = "file:///x/\"><script>alert(1)</script><img src=x onerror=alert(2)>.tif";
        let mut r = hit(1, evil, 10.0, 50.0);
        r.item_id = Some("<b onmouseover='x'>id</b>".into());
        r.crs = Some("</td></tr></table><iframe src=\"https://e.vil\">".into());
        let mut info = info();
        info.query = "</title><script>alert(3)</script>".into();
        let page = render(
            &info,
            &[r],
            &[Thumb::Missing("<script>bad()</script>".into())],
        );
        for bad in ["<script", "<iframe", "<img src=x", "<b "] {
            assert!(!page.contains(bad), "{bad} made it into the page");
        }
        assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        // The link is the escaped URI, its attribute value closed only by us.
        assert!(page.contains("href=\"file:///x/&quot;&gt;&lt;script&gt;"));
        let js = hit(2, "javascript:alert(1)", 10.0, 50.0);
        let s3 = hit(3, "s3://bucket/a.tif", 10.0, 50.0);
        let page = render(&super::tests::info(), &[js, s3], &[]);
        assert!(!page.contains("href=\"javascript"));
        assert!(!page.contains("href=\"s3:"));
        assert!(page.contains("<td>s3://bucket/a.tif</td>"));
    }

    #[test]
    fn pages_load_nothing_from_elsewhere() {
        let hits = [
            hit(1, "https://h/a.tif", 10.0, 50.0),
            hit(2, "s3://b/c.tif", 10.1, 50.1),
        ];
        let thumbs = [
            Thumb::Png {
                data_uri: "data:image/png;base64,AAAA".into(),
                width: 4,
                height: 4,
            },
            Thumb::Missing("gone".into()),
        ];
        let page = render(&info(), &hits, &thumbs);
        assert!(page.contains("default-src 'none'"));
        assert!(!page.contains("<script") && !page.contains("<link") && !page.contains("url("));
        for (i, _) in page.match_indices(" src=\"") {
            assert!(page[i + 6..].starts_with("data:"), "{}", &page[i..i + 40]);
        }
        assert!(page.contains("no picture: gone"));
        assert!(page.contains("id=\"hit-2\""));
    }

    #[test]
    fn the_overview_fits_every_footprint_with_a_graticule() {
        let hits = [hit(1, "a", 10.0, 50.0), hit(2, "b", 10.5, 50.2)];
        let svg = overview(&hits);
        assert_eq!(svg.matches("<polygon").count(), 2);
        assert!(svg.contains(">1</text>") && svg.contains(">2</text>"));
        assert!(svg.contains("<line"), "no graticule");
        // Every vertex lies inside the view box.
        let h: f64 = svg
            .split("height=\"")
            .nth(1)
            .and_then(|s| s.split('"').next())
            .and_then(|s| s.parse().ok())
            .unwrap();
        for poly in svg.split("<polygon points=\"").skip(1) {
            for p in poly.split('"').next().unwrap().split(' ') {
                let (x, y) = p.split_once(',').unwrap();
                let (x, y): (f64, f64) = (x.parse().unwrap(), y.parse().unwrap());
                assert!((0.0..=MAP_W).contains(&x) && (0.0..=h).contains(&y), "{p}");
            }
        }
        // Worst first, so the best is drawn last (on top).
        assert!(svg.find(">2</text>").unwrap() < svg.find(">1</text>").unwrap());
        let mut none = hit(1, "a", 0.0, 0.0);
        none.wkb = None;
        none.centre_lon = None;
        assert!(overview(&[none]).contains("no overview"));
    }

    #[test]
    fn graticule_steps_are_round() {
        assert_eq!(nice_step(10.0, 5.0), 2.0);
        assert_eq!(nice_step(0.5, 5.0), 0.1);
        assert!((nice_step(0.03, 5.0) - 0.005).abs() < 1e-12);
        assert_eq!(decimals(0.005), 3);
        assert_eq!(decimals(2.0), 0);
    }

    #[test]
    fn png_data_uris_decode_to_the_pixels() {
        use base64::Engine;
        let img = Rgb8 {
            width: 2,
            height: 1,
            data: vec![1, 2, 3, 250, 251, 252],
        };
        let uri = png_data_uri(&img).unwrap();
        let b64 = uri.strip_prefix("data:image/png;base64,").unwrap();
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap();
        let mut r = png::Decoder::new(std::io::Cursor::new(bytes))
            .read_info()
            .unwrap();
        let mut buf = vec![0; r.output_buffer_size().unwrap()];
        let info = r.next_frame(&mut buf).unwrap();
        assert_eq!((info.width, info.height), (2, 1));
        assert_eq!(&buf[..info.buffer_size()], &img.data[..]);
    }
}
