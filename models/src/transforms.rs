//! torchvision's `transforms` (0.28) on PIL images, the ones upstream's
//! `run_image_classification.py` composes: `RandomResizedCrop`, `RandomHorizontalFlip`,
//! `Resize`, `CenterCrop`, `ToTensor`, `Normalize`. The random ones draw from the global
//! generator (tch's, libtorch's CPU generator) exactly as torchvision does — `torch.empty(1)
//! .uniform_` for the scale and the log-ratio, `torch.randint` for the corner, `torch.rand(1)`
//! for the flip — so a seeded run crops and flips the same regions; the resizes are PIL's
//! (`pil_resize`, Pillow 13.0 byte for byte), `ToTensor` divides by 255 in float32 and
//! `Normalize` subtracts and divides in float32, as torchvision's.

use tch::{Device, Kind, Tensor};
use tchtrain_datasets::DecodedImage;

use crate::pil_resize::{Filter, resize_u8};
use crate::{Error, Result};

/// A target size: `(height, width)` exactly, or the shortest edge (the long one scaled
/// `int(size * long / short)`), as torchvision's `size` int / sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Size {
    /// `(height, width)`.
    Exact(usize, usize),
    /// The shortest edge's length.
    ShortestEdge(usize),
}

fn empty_image(what: &str) -> Error {
    Error::InvalidInput {
        name: "image",
        detail: format!("{what}: an empty image (0 pixels)"),
    }
}

/// PIL's `img.crop((left, top, left + width, top + height))`: pixels outside the image are 0.
pub fn crop(img: &DecodedImage, top: i64, left: i64, height: usize, width: usize) -> DecodedImage {
    let c = img.channels();
    let mut data = vec![0u8; height * width * c];
    for y in 0..height {
        let sy = top + y as i64;
        if sy < 0 || sy >= img.height as i64 {
            continue;
        }
        for x in 0..width {
            let sx = left + x as i64;
            if sx < 0 || sx >= img.width as i64 {
                continue;
            }
            let src = (sy as usize * img.width + sx as usize) * c;
            let dst = (y * width + x) * c;
            data[dst..dst + c].copy_from_slice(&img.data[src..src + c]);
        }
    }
    DecodedImage {
        width,
        height,
        mode: img.mode,
        data,
    }
}

/// `F.hflip` (PIL's `FLIP_LEFT_RIGHT`).
pub fn hflip(img: &DecodedImage) -> DecodedImage {
    let c = img.channels();
    let mut data = Vec::with_capacity(img.data.len());
    for row in img.data.chunks_exact(img.width * c) {
        for px in row.chunks_exact(c).rev() {
            data.extend_from_slice(px);
        }
    }
    DecodedImage {
        data,
        ..img.clone()
    }
}

/// torchvision's `_compute_resized_output_size`: `(height, width)`.
fn output_size(height: usize, width: usize, size: Size) -> (usize, usize) {
    match size {
        Size::Exact(h, w) => (h, w),
        Size::ShortestEdge(s) => {
            let (short, long) = if width <= height {
                (width, height)
            } else {
                (height, width)
            };
            let new_long = (s as f64 * long as f64 / short as f64) as usize;
            if width <= height {
                (new_long, s)
            } else {
                (s, new_long)
            }
        }
    }
}

/// `F.resize(img, size, BILINEAR)` on a PIL image: unchanged when already that size, else
/// PIL's resize (antialiased, as PIL always is).
pub fn resize(img: &DecodedImage, size: Size, filter: Filter) -> Result<DecodedImage> {
    if img.width == 0 || img.height == 0 {
        return Err(empty_image("resize"));
    }
    let (h, w) = output_size(img.height, img.width, size);
    if (h, w) == (img.height, img.width) {
        return Ok(img.clone());
    }
    if h == 0 || w == 0 {
        return Err(Error::InvalidInput {
            name: "size",
            detail: format!(
                "resizing {}x{} to {w}x{h}: a side of 0",
                img.width, img.height
            ),
        });
    }
    let data = resize_u8(
        &img.data,
        img.width,
        img.height,
        img.channels(),
        w,
        h,
        filter,
    );
    Ok(DecodedImage {
        width: w,
        height: h,
        mode: img.mode,
        data,
    })
}

/// `F.center_crop(img, (height, width))`: padded with 0 first where the crop is larger
/// (`(crop - side) // 2` before, `(crop - side + 1) // 2` after), then cut at
/// `int(round((side - crop) / 2))`.
pub fn center_crop(img: &DecodedImage, height: usize, width: usize) -> DecodedImage {
    let (mut top, mut left) = (0i64, 0i64);
    let (mut ih, mut iw) = (img.height as i64, img.width as i64);
    let (ch, cw) = (height as i64, width as i64);
    if cw > iw || ch > ih {
        let (pl, pt) = (
            if cw > iw { (cw - iw) / 2 } else { 0 },
            if ch > ih { (ch - ih) / 2 } else { 0 },
        );
        let (pr, pb) = (
            if cw > iw { (cw - iw + 1) / 2 } else { 0 },
            if ch > ih { (ch - ih + 1) / 2 } else { 0 },
        );
        top = -pt;
        left = -pl;
        ih += pt + pb;
        iw += pl + pr;
    }
    let round = |x: f64| x.round_ties_even() as i64;
    let crop_top = top + round((ih - ch) as f64 / 2.0);
    let crop_left = left + round((iw - cw) as f64 / 2.0);
    crop(img, crop_top, crop_left, height, width)
}

/// torchvision's `RandomResizedCrop(size, scale, ratio)` (bilinear).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RandomResizedCrop {
    /// `(height, width)` of the output.
    pub size: (usize, usize),
    /// The range of the crop's area as a fraction of the image's (default `(0.08, 1.0)`).
    pub scale: (f64, f64),
    /// The range of the crop's aspect ratio (default `(3/4, 4/3)`).
    pub ratio: (f64, f64),
}

impl RandomResizedCrop {
    /// With torchvision's default scale and ratio.
    pub fn new(height: usize, width: usize) -> Self {
        Self {
            size: (height, width),
            scale: (0.08, 1.0),
            ratio: (3.0 / 4.0, 4.0 / 3.0),
        }
    }

    /// `RandomResizedCrop.get_params`: `(top, left, height, width)`, drawn from the global
    /// generator (up to 10 attempts, then the central crop bounded by the ratios).
    pub fn get_params(&self, height: usize, width: usize) -> (i64, i64, usize, usize) {
        let area = (height * width) as f64;
        // `torch.log(torch.tensor(ratio))`: float32.
        let log_ratio = Tensor::from_slice(&[self.ratio.0 as f32, self.ratio.1 as f32]).log();
        let (lr0, lr1) = (log_ratio.double_value(&[0]), log_ratio.double_value(&[1]));
        let round = |x: f64| x.round_ties_even() as i64;
        for _ in 0..10 {
            let draw = |a: f64, b: f64| {
                let mut t = Tensor::empty([1], (Kind::Float, Device::Cpu));
                let _ = t.uniform_(a, b);
                t
            };
            let target_area = area * draw(self.scale.0, self.scale.1).double_value(&[0]);
            let aspect_ratio = draw(lr0, lr1).exp().double_value(&[0]);
            let w = round((target_area * aspect_ratio).sqrt());
            let h = round((target_area / aspect_ratio).sqrt());
            if 0 < w && w <= width as i64 && 0 < h && h <= height as i64 {
                let randint = |n: i64| {
                    Tensor::randint_low(0, n, [1], (Kind::Int64, Device::Cpu)).int64_value(&[0])
                };
                let i = randint(height as i64 - h + 1);
                let j = randint(width as i64 - w + 1);
                return (i, j, h as usize, w as usize);
            }
        }
        let in_ratio = width as f64 / height as f64;
        let (min_r, max_r) = (
            self.ratio.0.min(self.ratio.1),
            self.ratio.0.max(self.ratio.1),
        );
        let (h, w) = if in_ratio < min_r {
            (round(width as f64 / min_r) as usize, width)
        } else if in_ratio > max_r {
            (height, round(height as f64 * max_r) as usize)
        } else {
            (height, width)
        };
        (
            (height as i64 - h as i64).div_euclid(2),
            (width as i64 - w as i64).div_euclid(2),
            h,
            w,
        )
    }

    /// The transform: `F.resized_crop(img, *get_params(img), size, BILINEAR)`.
    pub fn apply(&self, img: &DecodedImage) -> Result<DecodedImage> {
        if img.width == 0 || img.height == 0 {
            return Err(empty_image("RandomResizedCrop"));
        }
        let (i, j, h, w) = self.get_params(img.height, img.width);
        let cropped = crop(img, i, j, h, w);
        resize(
            &cropped,
            Size::Exact(self.size.0, self.size.1),
            Filter::Bilinear,
        )
    }
}

/// `RandomHorizontalFlip(p)`: flipped when `torch.rand(1) < p`.
pub fn random_horizontal_flip(img: &DecodedImage, p: f64) -> DecodedImage {
    let draw = Tensor::rand([1], (Kind::Float, Device::Cpu));
    if draw.lt(p).int64_value(&[0]) == 1 {
        hflip(img)
    } else {
        img.clone()
    }
}

/// `ToTensor()` of an 8-bit image: `[channels, height, width]` float32, `x / 255`.
pub fn to_tensor(img: &DecodedImage) -> Tensor {
    let c = img.channels() as i64;
    Tensor::from_slice(&img.data)
        .view([img.height as i64, img.width as i64, c])
        .permute([2, 0, 1])
        .contiguous()
        .to_kind(Kind::Float)
        / 255.0
}

/// `Normalize(mean, std)`: `(x - mean) / std` per channel, in float32.
pub fn normalize(t: &Tensor, mean: &[f32], std: &[f32]) -> Result<Tensor> {
    let c = t.size().first().copied().unwrap_or(0);
    if mean.len() as i64 != c || std.len() as i64 != c {
        return Err(Error::InvalidInput {
            name: "image_mean",
            detail: format!(
                "{} means and {} stds for {c} channels",
                mean.len(),
                std.len()
            ),
        });
    }
    if std.contains(&0.0) {
        return Err(Error::InvalidInput {
            name: "image_std",
            detail: "std evaluated to zero after conversion to torch.float32, leading to division by zero. (upstream's message)".into(),
        });
    }
    let m = Tensor::from_slice(mean).view([-1, 1, 1]);
    let s = Tensor::from_slice(std).view([-1, 1, 1]);
    Ok((t - m) / s)
}
