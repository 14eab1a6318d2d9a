//! transformers 5.23's image processors on their PIL backend (`image_processing_backends.py`'s
//! `PilBackend`, what transformers runs without torchvision; `ViTImageProcessorPil`,
//! `SiglipImageProcessorPil`, ...): per image, PIL's RGB conversion when asked, `resize`
//! through PIL's `Image.resize` (ported bit for bit in [`crate::pil_resize`]), the center crop,
//! `rescale` (`uint8 → float64 × factor → float32`, numpy's order) and `normalize` (`(x -
//! mean) / std` in float32), channels first. The torchvision backend (upstream's default when
//! torchvision is installed) resizes with other kernels and is not reproduced.
//!
//! ```no_run
//! use tchtrain_models::ImageProcessor;
//! let processor = ImageProcessor::from_pretrained("assets/vit".as_ref())?;
//! let image = tchtrain_datasets::open_image("cat.png".as_ref())?;
//! let pixel_values = processor.preprocess(&[image])?; // [1, 3, 224, 224] float32
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::path::Path;

use serde::Deserialize;
use tch::Tensor;
use tchtrain_datasets::DecodedImage;

use crate::pil_resize::{Filter, resize_u8};
use crate::{Error, Result};

/// `preprocessor_config.json`'s name.
pub const IMAGE_PROCESSOR_NAME: &str = "preprocessor_config.json";

/// `size` / `crop_size`: `{"height", "width"}` or `{"shortest_edge"}`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct SizeDict {
    /// Target height.
    pub height: Option<usize>,
    /// Target width.
    pub width: Option<usize>,
    /// The shorter side's target, the aspect ratio kept.
    pub shortest_edge: Option<usize>,
    /// With `shortest_edge`: the longer side's cap.
    pub longest_edge: Option<usize>,
}

/// The fields of `preprocessor_config.json` the PIL backend reads.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct ImageProcessorConfig {
    /// `image_processor_type` (`ViTImageProcessor`, ...).
    pub image_processor_type: Option<String>,
    /// `do_resize`.
    pub do_resize: bool,
    /// `size`.
    pub size: SizeDict,
    /// `resample`: PIL's filter number (0 nearest, 1 Lanczos, 2 bilinear, 3 bicubic).
    pub resample: i64,
    /// `do_center_crop`.
    pub do_center_crop: bool,
    /// `crop_size`.
    pub crop_size: Option<SizeDict>,
    /// `do_rescale`.
    pub do_rescale: bool,
    /// `rescale_factor` (1/255).
    pub rescale_factor: f64,
    /// `do_normalize`.
    pub do_normalize: bool,
    /// `image_mean` (one per channel).
    pub image_mean: Vec<f64>,
    /// `image_std`.
    pub image_std: Vec<f64>,
    /// `do_convert_rgb`: PIL's `convert("RGB")` first.
    pub do_convert_rgb: Option<bool>,
    /// `do_pad` (refused when true).
    pub do_pad: Option<bool>,
    /// Every other key: refused at [`ImageProcessor::new`] unless it only names the class
    /// (`image_processor_type`, `feature_extractor_type`, `processor_class`).
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Default for ImageProcessorConfig {
    /// `ViTImageProcessorPil`'s defaults (224 × 224, bilinear, mean and std 0.5).
    fn default() -> Self {
        Self {
            image_processor_type: None,
            do_resize: true,
            size: SizeDict {
                height: Some(224),
                width: Some(224),
                ..SizeDict::default()
            },
            resample: 2,
            do_center_crop: false,
            crop_size: None,
            do_rescale: true,
            rescale_factor: 1.0 / 255.0,
            do_normalize: true,
            image_mean: vec![0.5; 3],
            image_std: vec![0.5; 3],
            do_convert_rgb: None,
            do_pad: None,
            extra: serde_json::Map::new(),
        }
    }
}

/// An image processor on the PIL backend (upstream's `AutoImageProcessor` without
/// torchvision).
#[derive(Debug, Clone, PartialEq)]
pub struct ImageProcessor {
    /// Its configuration.
    pub config: ImageProcessorConfig,
}

fn invalid(field: &'static str, value: String, fix: &'static str) -> Error {
    Error::InvalidConfig { field, value, fix }
}

impl ImageProcessor {
    /// `AutoImageProcessor.from_pretrained(dir)`: `preprocessor_config.json`.
    pub fn from_pretrained(dir: &Path) -> Result<Self> {
        let path = dir.join(IMAGE_PROCESSOR_NAME);
        let config: ImageProcessorConfig = crate::configuration_utils::read_config(&path)?;
        Self::new(config)
    }

    /// A processor of `config` (checked).
    pub fn new(config: ImageProcessorConfig) -> Result<Self> {
        const NAMES_ONLY: [&str; 3] = [
            "image_processor_type",
            "feature_extractor_type",
            "processor_class",
        ];
        if let Some(key) = config
            .extra
            .keys()
            .find(|k| !NAMES_ONLY.contains(&k.as_str()))
        {
            return Err(invalid(
                "preprocessor_config.json",
                key.clone(),
                "this key of the image processor is not implemented here (the PIL backend's resize, center crop, rescale, normalize and RGB conversion are); remove it or process the images yourself",
            ));
        }
        filter(config.resample)?;
        if config.do_pad == Some(true) {
            return Err(invalid(
                "do_pad",
                "true".into(),
                "padding images to a common size is not implemented here; resize them to one size",
            ));
        }
        if config.do_normalize && config.image_mean.len() != config.image_std.len() {
            return Err(invalid(
                "image_std",
                format!("{:?} for mean {:?}", config.image_std, config.image_mean),
                "give one mean and one std per channel",
            ));
        }
        Ok(Self { config })
    }

    /// `processor(images, return_tensors="pt")["pixel_values"]`: `[batch, channels, height,
    /// width]` float32 (every image must come out the same size).
    pub fn preprocess(&self, images: &[DecodedImage]) -> Result<Tensor> {
        let (dims, flat) = stack_images(images, |image| self.process(image))?;
        Ok(Tensor::from_slice(&flat).f_reshape(dims.as_slice())?)
    }

    /// [`preprocess`](Self::preprocess) on the torchvision backend
    /// ([`process_torchvision`](Self::process_torchvision)): the shape `[batch, channels,
    /// height, width]` and the values.
    pub fn preprocess_torchvision(&self, images: &[DecodedImage]) -> Result<(Vec<i64>, Vec<f32>)> {
        stack_images(images, |image| self.process_torchvision(image))
    }

    /// One image: its `pixel_values` shape `[channels, height, width]` and values.
    pub fn process(&self, image: &DecodedImage) -> Result<(Vec<i64>, Vec<f32>)> {
        let c = &self.config;
        let image = if c.do_convert_rgb == Some(true) && image.mode != "RGB" {
            image.to_rgb()
        } else {
            image.clone()
        };
        let channels = image.channels();
        let (mut h, mut w, mut data) = (image.height, image.width, image.data);
        if c.do_resize {
            let (nh, nw) = self.output_size(h, w)?;
            if channels == 2 || channels == 4 {
                return Err(Error::InvalidInput {
                    name: "images",
                    detail: format!(
                        "a {} image: PIL resizes it premultiplied, which is not implemented here; set do_convert_rgb",
                        image.mode
                    ),
                });
            }
            data = resize_u8(&data, w, h, channels, nw, nh, filter(c.resample)?);
            (h, w) = (nh, nw);
        }
        if c.do_center_crop {
            let crop = c.crop_size.unwrap_or_default();
            let (Some(ch), Some(cw)) = (crop.height, crop.width) else {
                return Err(invalid(
                    "crop_size",
                    format!("{crop:?}"),
                    "The size dictionary must have keys 'height' and 'width'. (upstream's message)",
                ));
            };
            if ch > h || cw > w {
                return Err(invalid(
                    "crop_size",
                    format!("{ch}x{cw} of a {h}x{w} image"),
                    "padding a crop larger than the image is not implemented here",
                ));
            }
            // numpy's center_crop: top = (h - ch) // 2, left = (w - cw) // 2.
            let (top, left) = ((h - ch) / 2, (w - cw) / 2);
            let mut cropped = Vec::with_capacity(ch * cw * channels);
            for y in top..top + ch {
                let row = (y * w + left) * channels;
                cropped.extend_from_slice(&data[row..row + cw * channels]);
            }
            (h, w, data) = (ch, cw, cropped);
        }
        if c.do_normalize && c.image_mean.len() != channels {
            return Err(Error::InvalidInput {
                name: "images",
                detail: format!(
                    "mean must have {channels} elements if it is an iterable, got {} (upstream's message; a {} image: set do_convert_rgb)",
                    c.image_mean.len(),
                    image.mode
                ),
            });
        }
        // Channels first; `rescale`: float64 product, then float32; `normalize` in float32.
        let mut out = vec![0f32; channels * h * w];
        for ch in 0..channels {
            let (mean, std) = (
                c.image_mean.get(ch).copied().unwrap_or(0.0) as f32,
                c.image_std.get(ch).copied().unwrap_or(1.0) as f32,
            );
            for i in 0..h * w {
                let sample = data[i * channels + ch];
                let mut v = if c.do_rescale {
                    (f64::from(sample) * c.rescale_factor) as f32
                } else {
                    f32::from(sample)
                };
                if c.do_normalize {
                    v = (v - mean) / std;
                }
                out[ch * h * w + i] = v;
            }
        }
        Ok((vec![channels as i64, h as i64, w as i64], out))
    }

    /// One image through upstream's torchvision backend (`TorchvisionBackend`, what
    /// `AutoImageProcessor` picks when torchvision is installed): PIL's RGB conversion when
    /// asked, the `uint8` samples channels first, `tvF.resize` (bilinear with antialiasing:
    /// libtorch's `_upsample_bilinear2d_aa` on the `uint8` image, torchvision's path on CPUs
    /// with AVX2 / AVX-512 or on ARM; none when the size is already the target), and the fused
    /// `rescale_and_normalize` in float32 (`(x - mean / factor) / (std / factor)`). Resampling
    /// other than bilinear and the center crop are refused on this backend.
    pub fn process_torchvision(&self, image: &DecodedImage) -> Result<(Vec<i64>, Vec<f32>)> {
        let c = &self.config;
        let image = if c.do_convert_rgb == Some(true) && image.mode != "RGB" {
            image.to_rgb()
        } else {
            image.clone()
        };
        let channels = image.channels() as i64;
        if channels == 2 || channels == 4 {
            return Err(Error::InvalidInput {
                name: "images",
                detail: format!("a {} image: set do_convert_rgb", image.mode),
            });
        }
        if c.do_center_crop {
            return Err(invalid(
                "do_center_crop",
                "true".into(),
                "the center crop on the torchvision backend is not implemented here",
            ));
        }
        let (h, w) = (image.height as i64, image.width as i64);
        let mut t = Tensor::f_from_slice(&image.data)?
            .f_view([h, w, channels])?
            .f_permute([2, 0, 1])?
            .f_contiguous()?
            .f_unsqueeze(0)?;
        if c.do_resize {
            let (nh, nw) = self.output_size(image.height, image.width)?;
            let (nh, nw) = (nh as i64, nw as i64);
            if (nh, nw) != (h, w) {
                if c.resample != 2 {
                    return Err(invalid(
                        "resample",
                        c.resample.to_string(),
                        "the torchvision backend's resize is implemented for bilinear (2) only here",
                    ));
                }
                t = t.f_internal_upsample_bilinear2d_aa([nh, nw], false, None, None)?;
            }
        }
        let t = t.f_squeeze_dim(0)?.f_to_kind(tch::Kind::Float)?;
        let t = if c.do_normalize {
            if c.image_mean.len() as i64 != channels {
                return Err(Error::InvalidInput {
                    name: "images",
                    detail: format!(
                        "mean must have {channels} elements if it is an iterable, got {} (upstream's message)",
                        c.image_mean.len()
                    ),
                });
            }
            // `_fuse_mean_std_and_rescale_factor`: float32 tensors times `1 / factor`.
            let factor = if c.do_rescale {
                1.0 / c.rescale_factor
            } else {
                1.0
            };
            let stat = |v: &[f64]| -> Result<Tensor> {
                let v: Vec<f32> = v.iter().map(|&x| x as f32).collect();
                Ok((Tensor::f_from_slice(&v)? * factor).f_view([channels, 1, 1])?)
            };
            t.f_sub(&stat(&c.image_mean)?)?
                .f_div(&stat(&c.image_std)?)?
        } else if c.do_rescale {
            t * c.rescale_factor
        } else {
            t
        };
        let size = t.size();
        let values = Vec::<f32>::try_from(&t.f_flatten(0, -1)?)?;
        Ok((size, values))
    }

    /// The resized `(height, width)` of an `h × w` image under `size`.
    fn output_size(&self, h: usize, w: usize) -> Result<(usize, usize)> {
        let s = self.config.size;
        match (s.height, s.width, s.shortest_edge) {
            (Some(nh), Some(nw), _) => Ok((nh, nw)),
            (_, _, Some(short)) if s.longest_edge.is_none() => {
                // get_resize_output_image_size(default_to_square=False): the short side to
                // `short`, the long one `int(short * long / short_side)` (a float division,
                // as Python's).
                let (small, large) = if w <= h { (w, h) } else { (h, w) };
                let new_long = (short as f64 * large as f64 / small as f64) as usize;
                Ok(if w <= h {
                    (new_long, short)
                } else {
                    (short, new_long)
                })
            }
            _ => Err(invalid(
                "size",
                format!("{s:?}"),
                "give size as height and width, or shortest_edge alone (with longest_edge, and max_height / max_width, not implemented here)",
            )),
        }
    }
}

/// The images processed one by one and stacked: `[batch, ...]` and the values (every image
/// must come out the same size).
fn stack_images(
    images: &[DecodedImage],
    process: impl Fn(&DecodedImage) -> Result<(Vec<i64>, Vec<f32>)>,
) -> Result<(Vec<i64>, Vec<f32>)> {
    let mut shape = None;
    let mut flat = Vec::new();
    for (i, image) in images.iter().enumerate() {
        let (s, values) = process(image)?;
        match &shape {
            None => shape = Some(s),
            Some(first) if *first != s => {
                return Err(Error::InvalidInput {
                    name: "images",
                    detail: format!(
                        "image {i} comes out {s:?}, image 0 {first:?}: a batch needs one size (set size height / width)"
                    ),
                });
            }
            Some(_) => {}
        }
        flat.extend(values);
    }
    let mut dims = vec![images.len() as i64];
    dims.extend(shape.unwrap_or_default());
    Ok((dims, flat))
}

/// PIL's filter numbers.
fn filter(resample: i64) -> Result<Filter> {
    Ok(match resample {
        0 => Filter::Nearest,
        1 => Filter::Lanczos,
        2 => Filter::Bilinear,
        3 => Filter::Bicubic,
        other => {
            return Err(invalid(
                "resample",
                other.to_string(),
                "use PIL's NEAREST (0), LANCZOS (1), BILINEAR (2) or BICUBIC (3); BOX and HAMMING are not implemented here",
            ));
        }
    })
}
