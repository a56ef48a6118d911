//! `--align scene|crs` and the `cell` column.
//!
//! Under `crs` every chip sits on the CRS's pixel lattice: pixel (i, j) of
//! the lattice covers x ∈ [i·res, (i+1)·res) and y ∈ (−(j+1)·res, −j·res] in
//! CRS units, so i counts east from the CRS origin and j counts south from it
//! (rows grow southward like pixel rows; both may be negative). Chip (col,
//! row) covers lattice pixels [col·S, col·S + C) × [row·S, row·S + C) for
//! stride S and chip size C. Its `cell` is `EPSG:<code>/<res>/<S>/<col>/<row>`
//! with `<res>` the pixel size in CRS units, written without trailing zeros
//! (`10`, `30`, `0.5`). The lattice passes through the CRS origin: a scene
//! whose corner is not on it (a sub-pixel phase) cannot be cut on it.

use serde::{Deserialize, Serialize};

/// Where chips start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Align {
    /// At multiples of the stride from each scene's own corner (the chip
    /// grid of DESIGN.md). The default, and what jobs before `--align` did.
    #[default]
    Scene,
    /// At multiples of the stride on the CRS's pixel lattice, counted from
    /// the CRS origin: scenes on one lattice cut identical chips.
    Crs,
}

impl Align {
    /// Whether this is the default, [`Align::Scene`] (left out of `job.json`).
    pub fn is_scene(&self) -> bool {
        *self == Align::Scene
    }

    /// `scene` or `crs`.
    pub fn as_str(self) -> &'static str {
        match self {
            Align::Scene => "scene",
            Align::Crs => "crs",
        }
    }
}

impl std::fmt::Display for Align {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Align {
    type Err = String;

    fn from_str(s: &str) -> Result<Align, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "scene" => Ok(Align::Scene),
            "crs" => Ok(Align::Crs),
            _ => Err(format!("--align is `scene` or `crs`, not `{s}`")),
        }
    }
}

/// How far, in pixels, a scene's corner may lie from the CRS lattice and
/// still be cut on it: far below anything a pixel shows (a micrometre at
/// 10 m), far above the rounding of a corner written in decimal metres.
pub const PHASE_TOLERANCE: f64 = 1e-6;

/// A chip's place on the CRS lattice: the `cell` column.
#[derive(Debug, Clone, PartialEq)]
pub struct Cell {
    /// The CRS's EPSG code.
    pub epsg: u32,
    /// Pixel size in CRS units.
    pub res: f64,
    /// Stride in pixels: a cell's column and row count strides.
    pub stride: u32,
    /// Column: lattice pixel column / stride, east from the CRS origin.
    pub col: i64,
    /// Row: lattice pixel row / stride, south from the CRS origin.
    pub row: i64,
}

impl Cell {
    /// The lattice the cell is on, as the cell names it before its column
    /// and row: `EPSG:<code>/<res>/<stride>`.
    pub fn lattice(&self) -> String {
        format!("EPSG:{}/{}/{}", self.epsg, self.res, self.stride)
    }
}

impl std::fmt::Display for Cell {
    /// `EPSG:<code>/<res>/<stride>/<col>/<row>`; `<res>` is the shortest
    /// decimal that reads back as the pixel size (`10`, `0.5`), never with an
    /// exponent.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.lattice(), self.col, self.row)
    }
}

impl std::str::FromStr for Cell {
    type Err = String;

    fn from_str(s: &str) -> Result<Cell, String> {
        let bad = || format!("`{s}` is not a cell EPSG:<code>/<res>/<stride>/<col>/<row>");
        let rest = s.strip_prefix("EPSG:").ok_or_else(bad)?;
        let parts: Vec<&str> = rest.split('/').collect();
        let [epsg, res, stride, col, row] = parts[..] else {
            return Err(bad());
        };
        let res: f64 = res.parse().map_err(|_| bad())?;
        if !(res.is_finite() && res > 0.0) {
            return Err(bad());
        }
        Ok(Cell {
            epsg: epsg.parse().map_err(|_| bad())?,
            res,
            stride: stride.parse().map_err(|_| bad())?,
            col: col.parse().map_err(|_| bad())?,
            row: row.parse().map_err(|_| bad())?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_print_without_trailing_zeros_and_read_back() {
        let c = |res: f64, col: i64, row: i64| Cell {
            epsg: 32633,
            res,
            stride: 256,
            col,
            row,
        };
        assert_eq!(c(10.0, 3, -1954).to_string(), "EPSG:32633/10/256/3/-1954");
        assert_eq!(c(30.0, -1, 0).to_string(), "EPSG:32633/30/256/-1/0");
        assert_eq!(c(0.5, 0, 0).to_string(), "EPSG:32633/0.5/256/0/0");
        assert_eq!(
            c(8.983152841195215e-5, 0, 0).to_string(),
            "EPSG:32633/0.00008983152841195215/256/0/0"
        );
        for s in ["EPSG:32633/10/256/3/-1954", "EPSG:4326/0.0001/64/-17/9"] {
            assert_eq!(s.parse::<Cell>().unwrap().to_string(), s);
        }
        for bad in [
            "32633/10/256/3/4",
            "EPSG:32633/10/256/3",
            "EPSG:x/10/256/3/4",
            "EPSG:1/0/2/3/4",
        ] {
            assert!(bad.parse::<Cell>().is_err(), "{bad}");
        }
    }

    #[test]
    fn align_reads_and_prints() {
        assert_eq!("crs".parse::<Align>(), Ok(Align::Crs));
        assert_eq!("Scene".parse::<Align>(), Ok(Align::Scene));
        assert!("utm".parse::<Align>().unwrap_err().contains("--align"));
        assert_eq!(Align::default(), Align::Scene);
        assert_eq!(Align::Crs.to_string(), "crs");
        assert_eq!(serde_json::to_string(&Align::Crs).unwrap(), "\"crs\"");
    }
}
