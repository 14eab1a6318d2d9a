//! `datasets`' `Image` feature: a cell `{"bytes": ..., "path": ...}` (or a path) decoded as
//! `PIL.Image.open` decodes it — here PNG, whose decoding is lossless and so the same pixels
//! as PIL's, through the `png` crate. JPEG and the other lossy or exotic formats are refused
//! naming the file: a JPEG decoder other than PIL's libjpeg rounds its inverse DCT and chroma
//! upsampling differently, so the pixels would not be upstream's.

use std::path::Path;

use crate::error::{Error, Result};

/// A decoded image: 8-bit samples, rows top to bottom, interleaved channels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedImage {
    /// Width in pixels.
    pub width: usize,
    /// Height in pixels.
    pub height: usize,
    /// PIL's mode: `"L"`, `"LA"`, `"RGB"` or `"RGBA"` (a palette image expanded, as PIL's
    /// `convert` expands it).
    pub mode: &'static str,
    /// `height × width × channels` samples.
    pub data: Vec<u8>,
}

impl DecodedImage {
    /// Samples per pixel.
    pub fn channels(&self) -> usize {
        match self.mode {
            "L" => 1,
            "LA" => 2,
            "RGB" => 3,
            _ => 4,
        }
    }

    /// PIL's `image.convert("RGB")`: gray replicated, alpha dropped (PIL does not blend it).
    pub fn to_rgb(&self) -> DecodedImage {
        let c = self.channels();
        let mut data = Vec::with_capacity(self.width * self.height * 3);
        for px in self.data.chunks_exact(c) {
            match c {
                1 | 2 => data.extend_from_slice(&[px[0], px[0], px[0]]),
                _ => data.extend_from_slice(&px[..3]),
            }
        }
        DecodedImage {
            width: self.width,
            height: self.height,
            mode: "RGB",
            data,
        }
    }
}

/// Decodes an image file's bytes (`what` names it in errors).
pub fn decode_image(bytes: &[u8], what: &str) -> Result<DecodedImage> {
    const PNG: &[u8] = b"\x89PNG\r\n\x1a\n";
    if !bytes.starts_with(PNG) {
        let kind = if bytes.starts_with(&[0xFF, 0xD8]) {
            "a JPEG image"
        } else {
            "not a PNG image"
        };
        return Err(Error::Image {
            what: what.to_string(),
            detail: format!(
                "{kind}: only PNG is decoded here (lossless, so the pixels equal PIL's); convert the images to PNG"
            ),
        });
    }
    let bad = |detail: String| Error::Image {
        what: what.to_string(),
        detail,
    };
    let mut decoder = png::Decoder::new(std::io::Cursor::new(bytes));
    decoder.set_transformations(png::Transformations::EXPAND);
    let mut reader = decoder.read_info().map_err(|e| bad(e.to_string()))?;
    let mut buf = vec![0; reader.output_buffer_size().unwrap_or(0)];
    let info = reader
        .next_frame(&mut buf)
        .map_err(|e| bad(e.to_string()))?;
    if info.bit_depth != png::BitDepth::Eight {
        return Err(bad(format!(
            "{:?}-bit samples: PIL opens 16-bit PNGs in mode I;16, which image processors do not take; only 8-bit images are decoded here",
            info.bit_depth
        )));
    }
    let mode = match info.color_type {
        png::ColorType::Grayscale => "L",
        png::ColorType::GrayscaleAlpha => "LA",
        png::ColorType::Rgb => "RGB",
        png::ColorType::Rgba => "RGBA",
        other => return Err(bad(format!("color type {other:?} after expansion"))),
    };
    buf.truncate(info.buffer_size());
    Ok(DecodedImage {
        width: info.width as usize,
        height: info.height as usize,
        mode,
        data: buf,
    })
}

/// An `Image` cell as `datasets` decodes it: `{"bytes": ..., "path": ...}` (the bytes, as
/// their list of byte values, when present; else the file at `path`, relative to `base_dir`
/// when not absolute), or a path. `what` names the cell in errors.
pub fn image_from_cell(
    cell: &serde_json::Value,
    base_dir: Option<&Path>,
    what: &str,
) -> Result<DecodedImage> {
    let bad = |detail: String| Error::Image {
        what: what.to_string(),
        detail,
    };
    match crate::media::cell_bytes(cell, base_dir, "Image").map_err(bad)? {
        crate::media::CellBytes::Bytes(bytes) => decode_image(&bytes, what),
        crate::media::CellBytes::Path(path) => open_image(&path),
    }
}

/// Decodes the image file at `path`.
pub fn open_image(path: &Path) -> Result<DecodedImage> {
    let bytes = std::fs::read(path).map_err(|source| Error::Io {
        action: "reading",
        path: path.to_path_buf(),
        source,
    })?;
    decode_image(&bytes, &path.display().to_string())
}
