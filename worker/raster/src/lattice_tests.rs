use super::*;

fn gt(x0: f64, y0: f64, res: f64) -> GeoTransform {
    GeoTransform([x0, res, 0.0, y0, 0.0, -res])
}

fn place(x0: f64, y0: f64, res: f64, chip: u32, stride: u32) -> Result<Lattice, LatticeError> {
    Lattice::of_scene(
        Some(&gt(x0, y0, res)),
        Some(&Crs::Epsg(32633)),
        chip,
        stride,
    )
}

/// Every chip of a scene as (cell, CRS x, CRS y of its top-left corner).
fn chips(l: &Lattice, w: u32, h: u32) -> Vec<(String, f64, f64)> {
    let g = l.grid(w, h);
    g.windows(0..g.rows())
        .map(|win| {
            let (lx, ly) = l.lattice_pixel(win);
            let (x, y) = l.transform().apply(lx as f64, ly as f64);
            (l.cell(win).to_string(), x, y)
        })
        .collect()
}

#[test]
fn a_crop_of_a_scene_cuts_the_same_chips_where_they_overlap() {
    // A 10 m scene at (600000, 5000040) and a crop of it 37 columns and 53
    // rows in: the crop's chips are the scene's chips that overlap the crop.
    let a = place(600_000.0, 5_000_040.0, 10.0, 64, 64).unwrap();
    let b = place(600_370.0, 4_999_510.0, 10.0, 64, 64).unwrap();
    assert_eq!((a.col0, a.row0), (60_000, -500_004));
    assert_eq!((b.col0, b.row0), (60_037, -499_951));
    let ca = chips(&a, 300, 300);
    let cb = chips(&b, 200, 200);
    for c in &cb {
        let same = ca.iter().find(|x| x.0 == c.0);
        if let Some(s) = same {
            assert_eq!(s, c, "one cell, one place");
        }
    }
    // The crop's first chip starts left of and above it, on the lattice.
    let g = b.grid(200, 200);
    assert_eq!(g.origin, [60_032 - 60_037, -499_968 + 499_951]);
    let first = g.window(0, 0);
    assert_eq!(b.cell(first).to_string(), "EPSG:32633/10/64/938/-7812");
    // Lattice column 938·64 = 60032: x = 600320 m; row −7812·64 = −499968:
    // y = 4999680 m.
    assert_eq!(cb[0].1, 600_320.0);
    assert_eq!(cb[0].2, 4_999_680.0);
    assert!(g.origin[0] <= 0 && g.origin[0] > -64 && g.origin[1] <= 0 && g.origin[1] > -64);
}

#[test]
fn negative_coordinates_and_southern_false_northing() {
    // West of the CRS origin (a negative x) and a southern UTM zone, whose
    // northings start at 10,000,000 at the equator: rows are lattice rows
    // from the CRS origin whatever the false northing.
    let l = Lattice::of_scene(
        Some(&gt(-1_230.0, 7_200_000.0, 30.0)),
        Some(&Crs::Epsg(32733)),
        256,
        256,
    )
    .unwrap();
    assert_eq!((l.col0, l.row0), (-41, -240_000));
    let g = l.grid(100, 100);
    // Column −1 covers lattice pixels −256..0, where the scene's column 0 is
    // 215 in; row −938 covers −240128..−239872, its row 0 128 in.
    assert_eq!(g.origin, [-215, -128]);
    assert_eq!(
        l.cell(g.window(0, 0)).to_string(),
        "EPSG:32733/30/256/-1/-938"
    );
    // The scene's 100 columns reach lattice column 59: cell column 0 too.
    assert_eq!((g.columns(), g.rows()), (2, 1));
    assert_eq!(l.cell(g.window(1, 0)).col, 0);
    // The next row of chips south is row −937.
    let g = l.grid(100, 300);
    assert_eq!(
        l.cell(g.window(0, 1)).to_string(),
        "EPSG:32733/30/256/-1/-937"
    );
}

#[test]
fn a_stride_other_than_the_chip_counts_cells_in_strides() {
    // 128-pixel chips every 64: every lattice chip overlapping the scene,
    // the first up to a chip left of it.
    let l = place(100.0, 0.0, 1.0, 128, 64).unwrap();
    assert_eq!((l.col0, l.row0), (100, 0));
    let g = l.grid(200, 10);
    // Chips start at lattice 0, 64, 128, 192, 256: x = −100, …, 156; the
    // chip at lattice −64 ends at 64, short of the scene.
    let xs: Vec<_> = g.windows(0..1).map(|w| w.x).collect();
    assert_eq!(xs, [-100, -36, 28, 92, 156]);
    let cols: Vec<_> = g.windows(0..1).map(|w| l.cell(w).col).collect();
    assert_eq!(cols, [0, 1, 2, 3, 4]);
    assert!(l
        .cell(g.window(0, 0))
        .to_string()
        .starts_with("EPSG:32633/1/64/0/"));
    // Gaps between chips: a chip of 8 every 100 may start inside the scene.
    let l = place(-30.0, 0.0, 1.0, 8, 100).unwrap();
    let g = l.grid(200, 10);
    let xs: Vec<_> = g.windows(0..1).map(|w| w.x).collect();
    assert_eq!(xs, [30, 130]);
}

#[test]
fn scenes_off_the_lattice_say_why() {
    let e = place(399_585.0, 4_000_215.0, 30.0, 256, 256).unwrap_err();
    assert!(matches!(e, LatticeError::Phase { px, py, .. } if px.abs() == 0.5 && py.abs() == 0.5));
    let msg = e.to_string();
    assert!(
        msg.contains("sub-pixel phase") && msg.contains("399585"),
        "{msg}"
    );
    // Within the tolerance: on the lattice.
    assert!(place(600_000.000_001, 5_000_000.0, 10.0, 256, 256).is_ok());
    assert!(place(600_000.001, 5_000_000.0, 10.0, 256, 256).is_err());
    let rotated = GeoTransform([0.0, 10.0, 0.5, 0.0, 0.0, -10.0]);
    let e = Lattice::of_scene(Some(&rotated), Some(&Crs::Epsg(32633)), 8, 8).unwrap_err();
    assert!(e.to_string().contains("rotated raster"), "{e}");
    let flipped = GeoTransform([0.0, 10.0, 0.0, 0.0, 0.0, 10.0]);
    let e = Lattice::of_scene(Some(&flipped), Some(&Crs::Epsg(32633)), 8, 8).unwrap_err();
    assert!(e.to_string().contains("not north-up"), "{e}");
    let e = place(0.0, 0.0, f64::NAN, 8, 8).unwrap_err();
    assert!(matches!(e, LatticeError::Flipped { .. }), "{e}");
    let oblong = GeoTransform([0.0, 10.0, 0.0, 0.0, 0.0, -20.0]);
    let e = Lattice::of_scene(Some(&oblong), Some(&Crs::Epsg(4326)), 8, 8).unwrap_err();
    assert!(e.to_string().contains("not square"), "{e}");
    let user = Crs::UserDefined {
        proj4: "+proj=geos +h=35786023".into(),
    };
    let e = Lattice::of_scene(Some(&gt(0.0, 0.0, 10.0)), Some(&user), 8, 8).unwrap_err();
    assert!(e.to_string().contains("no EPSG code"), "{e}");
    let e = Lattice::of_scene(Some(&gt(0.0, 0.0, 10.0)), None, 8, 8).unwrap_err();
    assert_eq!(e, LatticeError::NoCrs);
    let e = Lattice::of_scene(None, Some(&Crs::Epsg(32633)), 8, 8).unwrap_err();
    assert_eq!(e, LatticeError::NotGeoreferenced);
    let e = place(1e300, 0.0, 1e-9, 8, 8).unwrap_err();
    assert!(matches!(e, LatticeError::TooFar { .. }), "{e}");
}

#[test]
fn the_lattice_transform_is_the_scene_transform_on_the_lattice() {
    let l = place(600_370.0, 4_999_510.0, 10.0, 64, 64).unwrap();
    let scene = gt(600_370.0, 4_999_510.0, 10.0);
    let w = Window {
        x: -5,
        y: 17,
        width: 64,
        height: 64,
    };
    let (lx, ly) = l.lattice_pixel(w);
    assert_eq!(
        l.transform().apply(lx as f64, ly as f64),
        scene.apply(-5.0, 17.0)
    );
}
