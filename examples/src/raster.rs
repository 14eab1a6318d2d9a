//! A small RGB raster for the training plots: filled rectangles, thick lines, text in a
//! built-in 5x7 pixel font (digits, capitals, a few signs; lowercase is drawn as capitals)
//! and PNG encoding (8-bit RGB, zlib through `flate2`, chunk CRCs through `crc32fast`).
//! Enough to draw axes, ticks, labels and line series without a plotting library.

use std::io::Write;
use std::path::Path;

use crate::error::{Error, Result};

/// An RGB colour.
pub type Rgb = [u8; 3];

/// Width and height of a glyph of the built-in font, in font pixels.
const GLYPH_W: i64 = 5;
const GLYPH_H: i64 = 7;

/// The 5x7 glyph of `c` (rows top to bottom, bit 4 the leftmost pixel); lowercase letters
/// use the capitals, unknown characters a question mark.
fn glyph(c: char) -> [u8; 7] {
    match c.to_ascii_uppercase() {
        ' ' => [0; 7],
        '0' => [0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E],
        '1' => [0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E],
        '2' => [0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F],
        '3' => [0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E],
        '4' => [0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02],
        '5' => [0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E],
        '6' => [0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E],
        '7' => [0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08],
        '8' => [0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E],
        '9' => [0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C],
        'A' => [0x0E, 0x11, 0x11, 0x11, 0x1F, 0x11, 0x11],
        'B' => [0x1E, 0x11, 0x11, 0x1E, 0x11, 0x11, 0x1E],
        'C' => [0x0E, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0E],
        'D' => [0x1C, 0x12, 0x11, 0x11, 0x11, 0x12, 0x1C],
        'E' => [0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x1F],
        'F' => [0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x10],
        'G' => [0x0E, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0F],
        'H' => [0x11, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11],
        'I' => [0x0E, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E],
        'J' => [0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0C],
        'K' => [0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11],
        'L' => [0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1F],
        'M' => [0x11, 0x1B, 0x15, 0x15, 0x11, 0x11, 0x11],
        'N' => [0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11],
        'O' => [0x0E, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E],
        'P' => [0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10, 0x10],
        'Q' => [0x0E, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0D],
        'R' => [0x1E, 0x11, 0x11, 0x1E, 0x14, 0x12, 0x11],
        'S' => [0x0F, 0x10, 0x10, 0x0E, 0x01, 0x01, 0x1E],
        'T' => [0x1F, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04],
        'U' => [0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E],
        'V' => [0x11, 0x11, 0x11, 0x11, 0x11, 0x0A, 0x04],
        'W' => [0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0A],
        'X' => [0x11, 0x11, 0x0A, 0x04, 0x0A, 0x11, 0x11],
        'Y' => [0x11, 0x11, 0x11, 0x0A, 0x04, 0x04, 0x04],
        'Z' => [0x1F, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1F],
        '.' => [0, 0, 0, 0, 0, 0x0C, 0x0C],
        ',' => [0, 0, 0, 0, 0x0C, 0x04, 0x08],
        ':' => [0, 0x0C, 0x0C, 0, 0x0C, 0x0C, 0],
        '-' => [0, 0, 0, 0x1F, 0, 0, 0],
        '+' => [0, 0x04, 0x04, 0x1F, 0x04, 0x04, 0],
        '=' => [0, 0, 0x1F, 0, 0x1F, 0, 0],
        '_' => [0, 0, 0, 0, 0, 0, 0x1F],
        '/' => [0, 0x01, 0x02, 0x04, 0x08, 0x10, 0],
        '%' => [0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03],
        '(' => [0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02],
        ')' => [0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08],
        _ => [0x0E, 0x11, 0x01, 0x02, 0x04, 0, 0x04],
    }
}

/// An 8-bit RGB image, row-major from the top-left corner. Drawing outside it is clipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RgbImage {
    width: u32,
    height: u32,
    pixels: Vec<u8>,
}

impl RgbImage {
    /// A `width` x `height` image filled with `background`.
    pub fn new(width: u32, height: u32, background: Rgb) -> Self {
        let n = width as usize * height as usize;
        Self {
            width,
            height,
            pixels: background.repeat(n),
        }
    }

    /// Width in pixels.
    pub fn width(&self) -> u32 {
        self.width
    }

    /// Height in pixels.
    pub fn height(&self) -> u32 {
        self.height
    }

    /// The pixel at (`x`, `y`), `None` outside the image.
    pub fn pixel(&self, x: u32, y: u32) -> Option<Rgb> {
        if x >= self.width || y >= self.height {
            return None;
        }
        let i = 3 * (y as usize * self.width as usize + x as usize);
        Some([self.pixels[i], self.pixels[i + 1], self.pixels[i + 2]])
    }

    /// Sets the pixel at (`x`, `y`); outside the image nothing happens.
    pub fn put(&mut self, x: i64, y: i64, color: Rgb) {
        if x < 0 || y < 0 || x >= i64::from(self.width) || y >= i64::from(self.height) {
            return;
        }
        let i = 3 * (y as usize * self.width as usize + x as usize);
        self.pixels[i..i + 3].copy_from_slice(&color);
    }

    /// Fills the rectangle with corner (`x`, `y`), `w` wide and `h` high.
    pub fn fill_rect(&mut self, x: i64, y: i64, w: i64, h: i64, color: Rgb) {
        for yy in y..y + h {
            for xx in x..x + w {
                self.put(xx, yy, color);
            }
        }
    }

    /// A line from (`x0`, `y0`) to (`x1`, `y1`), `thickness` pixels wide (Bresenham, each
    /// point drawn as a square).
    pub fn line(&mut self, (x0, y0): (i64, i64), (x1, y1): (i64, i64), thickness: i64, color: Rgb) {
        let (dx, dy) = ((x1 - x0).abs(), -(y1 - y0).abs());
        let (sx, sy) = (if x0 < x1 { 1 } else { -1 }, if y0 < y1 { 1 } else { -1 });
        let (mut x, mut y, mut err) = (x0, y0, dx + dy);
        let half = (thickness - 1) / 2;
        loop {
            self.fill_rect(
                x - half,
                y - half,
                thickness.max(1),
                thickness.max(1),
                color,
            );
            if x == x1 && y == y1 {
                break;
            }
            let e2 = 2 * err;
            if e2 >= dy {
                err += dy;
                x += sx;
            }
            if e2 <= dx {
                err += dx;
                y += sy;
            }
        }
    }

    /// The width in pixels of `text` drawn at `scale`.
    pub fn text_width(text: &str, scale: i64) -> i64 {
        let n = text.chars().count() as i64;
        if n == 0 {
            0
        } else {
            (n * (GLYPH_W + 1) - 1) * scale
        }
    }

    /// The height in pixels of a line of text drawn at `scale`.
    pub fn text_height(scale: i64) -> i64 {
        GLYPH_H * scale
    }

    /// Draws `text` with its top-left corner at (`x`, `y`), each font pixel `scale` pixels.
    pub fn text(&mut self, x: i64, y: i64, text: &str, scale: i64, color: Rgb) {
        for (k, c) in text.chars().enumerate() {
            let left = x + k as i64 * (GLYPH_W + 1) * scale;
            for (row, bits) in glyph(c).iter().enumerate() {
                for col in 0..GLYPH_W {
                    if bits & (0x10 >> col) != 0 {
                        self.fill_rect(
                            left + col * scale,
                            y + row as i64 * scale,
                            scale,
                            scale,
                            color,
                        );
                    }
                }
            }
        }
    }

    /// The image as a PNG file (8-bit RGB, no interlace, filter 0 on every row).
    pub fn to_png(&self) -> std::io::Result<Vec<u8>> {
        let mut raw = Vec::with_capacity(self.pixels.len() + self.height as usize);
        for row in self.pixels.chunks(3 * self.width.max(1) as usize) {
            raw.push(0);
            raw.extend_from_slice(row);
        }
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        z.write_all(&raw)?;
        let idat = z.finish()?;

        let mut ihdr = Vec::with_capacity(13);
        ihdr.extend_from_slice(&self.width.to_be_bytes());
        ihdr.extend_from_slice(&self.height.to_be_bytes());
        // bit depth 8, colour type 2 (RGB), deflate, filter method 0, no interlace
        ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);

        let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
        for (kind, data) in [(b"IHDR", &ihdr), (b"IDAT", &idat), (b"IEND", &Vec::new())] {
            png.extend_from_slice(&(data.len() as u32).to_be_bytes());
            let start = png.len();
            png.extend_from_slice(kind);
            png.extend_from_slice(data);
            let crc = crc32fast::hash(&png[start..]);
            png.extend_from_slice(&crc.to_be_bytes());
        }
        Ok(png)
    }

    /// Writes the image to `path` as PNG.
    pub fn write_png(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let bytes = self.to_png().map_err(|e| Error::io("encoding", path, e))?;
        std::fs::write(path, bytes).map_err(|e| Error::io("writing", path, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_clipped_lines_and_text() {
        let mut img = RgbImage::new(20, 10, [255; 3]);
        img.line((-5, 5), (30, 5), 1, [0, 0, 0]);
        assert_eq!(img.pixel(0, 5), Some([0, 0, 0]));
        assert_eq!(img.pixel(19, 5), Some([0, 0, 0]));
        assert_eq!(img.pixel(19, 4), Some([255; 3]));
        assert_eq!(img.pixel(20, 5), None);
        img.text(0, 0, "1", 1, [9, 9, 9]);
        // '1': the top row has its middle pixel set only.
        assert_eq!(img.pixel(2, 0), Some([9, 9, 9]));
        assert_eq!(img.pixel(0, 0), Some([255; 3]));
        assert_eq!(RgbImage::text_width("ab", 2), 22);
    }
}
