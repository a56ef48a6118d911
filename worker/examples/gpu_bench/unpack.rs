//! `unpack`: joins and checks the chunks `bench/gpu/prepare.sh` made.

use super::*;

/// Reads a list of files one after the other.
pub(crate) struct Concat {
    files: std::vec::IntoIter<PathBuf>,
    cur: Option<std::fs::File>,
}

impl Read for Concat {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            if let Some(f) = &mut self.cur {
                let n = f.read(buf)?;
                if n > 0 {
                    return Ok(n);
                }
            }
            match self.files.next() {
                Some(p) => self.cur = Some(std::fs::File::open(p)?),
                None => return Ok(0),
            }
        }
    }
}

pub(crate) fn sha256_of(path: &Path) -> Res<(String, u64)> {
    rsembed_worker::model::sha256_file(path).map_err(|e| engine_err("hashing", &e))
}

pub(crate) fn unpack(a: &UnpackArgs) -> Res<()> {
    let t0 = Instant::now();
    let text = std::fs::read_to_string(&a.manifest)
        .map_err(|e| format!("reading {}: {e}", a.manifest.display()))?;
    let m: Value = serde_json::from_str(&text).map_err(err)?;
    let entry = m["chunked"]
        .as_array()
        .and_then(|l| l.iter().find(|e| e["name"] == a.name.as_str()))
        .ok_or_else(|| format!("{} has no chunked entry {}", a.manifest.display(), a.name))?;
    let want_sha = entry["sha256"].as_str().ok_or("entry without sha256")?;
    let want_bytes = entry["bytes"].as_u64().ok_or("entry without bytes")?;
    let out = a.dest.join(&a.name);
    if out.is_file() && sha256_of(&out)?.0 == want_sha {
        println!("{}: already there, sha256 ok", out.display());
        return Ok(());
    }
    let mut dirs = a.chunks_dirs.clone();
    dirs.push(a.manifest.parent().unwrap_or(Path::new(".")).to_owned());
    let mut files = Vec::new();
    let mut missing = Vec::new();
    for (i, c) in entry["chunks"]
        .as_array()
        .ok_or("entry without chunks")?
        .iter()
        .enumerate()
    {
        let rel = c["file"].as_str().ok_or("chunk without file")?;
        let base = Path::new(rel).file_name().ok_or("bad chunk name")?;
        let Some(p) = dirs
            .iter()
            .flat_map(|d| [d.join(base), d.join(rel)])
            .find(|p| p.is_file())
        else {
            missing.push(format!("#{} {rel} (carried by call {})", i + 1, c["call"]));
            continue;
        };
        let (sha, bytes) = sha256_of(&p)?;
        if sha != c["sha256"].as_str().unwrap_or_default() {
            return Err(format!(
                "chunk #{} {} is damaged: sha256 {sha} ({bytes} bytes), manifest {} ({} bytes); \
                 repeat call {}",
                i + 1,
                p.display(),
                c["sha256"],
                c["bytes"],
                c["call"]
            ));
        }
        files.push(p);
    }
    if !missing.is_empty() {
        return Err(format!(
            "chunks missing (looked in {dirs:?}): {}",
            missing.join(", ")
        ));
    }
    let n_chunks = files.len();
    std::fs::create_dir_all(&a.dest).map_err(err)?;
    let part = out.with_extension("part");
    let src = Concat {
        files: files.into_iter(),
        cur: None,
    };
    let mut dec =
        ruzstd::decoding::StreamingDecoder::new(std::io::BufReader::with_capacity(1 << 20, src))
            .map_err(|e| format!("zstd frame: {e}"))?;
    let mut f = std::io::BufWriter::with_capacity(
        1 << 20,
        std::fs::File::create(&part).map_err(|e| format!("{}: {e}", part.display()))?,
    );
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        let k = dec
            .read(&mut buf)
            .map_err(|e| format!("zstd decode: {e}"))?;
        if k == 0 {
            break;
        }
        h.update(&buf[..k]);
        f.write_all(&buf[..k]).map_err(err)?;
        n += k as u64;
    }
    f.flush().map_err(err)?;
    drop(f);
    let got = hex::encode(h.finalize());
    if got != want_sha || n != want_bytes {
        let _ = std::fs::remove_file(&part);
        return Err(format!(
            "{}: reassembled file has sha256 {got} ({n} bytes), manifest says {want_sha} \
             ({want_bytes} bytes)",
            a.name
        ));
    }
    std::fs::rename(&part, &out).map_err(err)?;
    println!(
        "{}: {n} bytes from {n_chunks} chunks, sha256 ok, {:.1} s",
        out.display(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
