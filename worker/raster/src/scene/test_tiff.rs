//! A small GeoTIFF writer for the scene tests: one uncompressed strip,
//! interleaved samples, 8 or 16 bits, and the GeoTIFF tags GDAL writes for a
//! north-up UTM raster (ModelPixelScale, ModelTiepoint, a GeoKey directory).
//! The reader under test is checked against GDAL elsewhere (`tiff/tests_real.rs`);
//! these files only need to be valid and exactly what a test means.

/// Band-sequential samples: `[band][row][col]`.
pub(super) enum Planes {
    U8(Vec<u8>),
    U16(Vec<u16>),
}

/// Where a raster sits: its top-left corner and pixel size, in EPSG:`epsg`.
#[derive(Clone, Copy)]
pub(super) struct Place {
    pub x0: f64,
    pub y0: f64,
    pub pixel: f64,
    pub epsg: u16,
}

/// A tag's (type, count, value bytes).
type Field = (u16, u32, Vec<u8>);

/// A `width`×`height` GeoTIFF of `bands` bands (or a plain TIFF without `place`).
pub(super) fn write(
    width: u32,
    height: u32,
    bands: u16,
    planes: &Planes,
    place: Option<Place>,
    nodata: Option<&str>,
) -> Vec<u8> {
    let n = (width * height) as usize;
    let bits: u16 = match planes {
        Planes::U8(v) => {
            assert_eq!(v.len(), n * usize::from(bands));
            8
        }
        Planes::U16(v) => {
            assert_eq!(v.len(), n * usize::from(bands));
            16
        }
    };
    // Interleave: pixel by pixel, band by band.
    let mut pixels = Vec::with_capacity(n * usize::from(bands) * usize::from(bits / 8));
    for i in 0..n {
        for b in 0..usize::from(bands) {
            match planes {
                Planes::U8(v) => pixels.push(v[b * n + i]),
                Planes::U16(v) => pixels.extend_from_slice(&v[b * n + i].to_le_bytes()),
            }
        }
    }
    let shorts = |v: &[u16]| {
        (
            3u16,
            v.len() as u32,
            v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        )
    };
    let long = |v: u32| (4u16, 1u32, v.to_le_bytes().to_vec());
    let doubles = |v: &[f64]| {
        (
            12u16,
            v.len() as u32,
            v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        )
    };
    let data_at = 8u32;
    let mut tags: Vec<(u16, Field)> = vec![
        (256, long(width)),
        (257, long(height)),
        (258, shorts(&vec![bits; usize::from(bands)])),
        (259, shorts(&[1])),
        (262, shorts(&[if bands == 3 { 2 } else { 1 }])),
        (273, long(data_at)),
        (277, shorts(&[bands])),
        (278, long(height)),
        (279, long(pixels.len() as u32)),
        (284, shorts(&[1])),
        (339, shorts(&vec![1; usize::from(bands)])),
    ];
    if let Some(p) = place {
        tags.push((33550, doubles(&[p.pixel, p.pixel, 0.0])));
        tags.push((33922, doubles(&[0.0, 0.0, 0.0, p.x0, p.y0, 0.0])));
        // GTModelType projected, RasterType PixelIsArea, ProjectedCSType EPSG.
        let keys = [1, 1, 0, 3, 1024, 0, 1, 1, 1025, 0, 1, 1, 3072, 0, 1, p.epsg];
        tags.push((34735, shorts(&keys)));
    }
    if let Some(nd) = nodata {
        let mut s = nd.as_bytes().to_vec();
        s.push(0);
        tags.push((42113, (2, s.len() as u32, s)));
    }
    tags.sort_by_key(|t| t.0);

    let mut out = b"II\x2a\x00".to_vec();
    out.extend_from_slice(&[0; 4]); // the IFD's offset, filled below
    out.extend_from_slice(&pixels);
    // Values longer than 4 bytes go before the IFD, each word-aligned.
    let mut entries = Vec::new();
    for (tag, (ty, count, bytes)) in &tags {
        let field = if bytes.len() <= 4 {
            let mut f = bytes.clone();
            f.resize(4, 0);
            f
        } else {
            if out.len() % 2 == 1 {
                out.push(0);
            }
            let at = out.len() as u32;
            out.extend_from_slice(bytes);
            at.to_le_bytes().to_vec()
        };
        entries.push((*tag, *ty, *count, field));
    }
    if out.len() % 2 == 1 {
        out.push(0);
    }
    let ifd = out.len() as u32;
    out[4..8].copy_from_slice(&ifd.to_le_bytes());
    out.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    for (tag, ty, count, field) in entries {
        out.extend_from_slice(&tag.to_le_bytes());
        out.extend_from_slice(&ty.to_le_bytes());
        out.extend_from_slice(&count.to_le_bytes());
        out.extend_from_slice(&field);
    }
    out.extend_from_slice(&[0; 4]);
    out
}
