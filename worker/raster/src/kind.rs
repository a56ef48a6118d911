//! What an input is, by its name.

/// What an input is, by its name: the one place that decides which reader
/// takes it, for the planner (which objects of a listing are inputs), the
/// task (which reader runs) and a tar archive (which members are images).
/// Case-insensitive, by the name's ending. It lives here, below the worker,
/// so the tar reader can use it; the worker names it `input::InputKind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputKind {
    /// A whole image (PNG, JPEG): one chip.
    Image,
    /// A TIFF (GeoTIFF, COG, or one band file of a scene): cut into chips.
    Scene,
    /// A tar archive, plain or gzip: every image or TIFF member is read.
    Archive,
}

impl InputKind {
    /// Endings of whole images.
    pub const IMAGE: [&'static str; 3] = [".png", ".jpg", ".jpeg"];
    /// Endings of TIFF scenes.
    pub const SCENE: [&'static str; 2] = [".tif", ".tiff"];
    /// Endings of tar archives.
    pub const ARCHIVE: [&'static str; 3] = [".tar", ".tar.gz", ".tgz"];

    /// The kind of the input named `uri` (a URI or a file name); `None` for
    /// a name that is not an input (the planner skips it).
    pub fn of(uri: &str) -> Option<InputKind> {
        let lower = uri.to_ascii_lowercase();
        let ends = |endings: &[&str]| endings.iter().any(|e| lower.ends_with(e));
        if ends(&Self::ARCHIVE) {
            Some(InputKind::Archive)
        } else if ends(&Self::SCENE) {
            Some(InputKind::Scene)
        } else if ends(&Self::IMAGE) {
            Some(InputKind::Image)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_by_name() {
        for (name, kind) in [
            ("s3://b/a/c.PNG", Some(InputKind::Image)),
            ("x.jpeg", Some(InputKind::Image)),
            ("x.jpg", Some(InputKind::Image)),
            ("scene.TIF", Some(InputKind::Scene)),
            ("gs://b/B4.tiff", Some(InputKind::Scene)),
            ("s3://b/x.TAR", Some(InputKind::Archive)),
            ("chips/batch1.tar.gz", Some(InputKind::Archive)),
            ("A.TGZ", Some(InputKind::Archive)),
            ("a.tar.zst", None),
            ("labels.csv", None),
            ("noext", None),
            ("tar", None),
            ("png", None),
        ] {
            assert_eq!(InputKind::of(name), kind, "{name}");
        }
    }
}
