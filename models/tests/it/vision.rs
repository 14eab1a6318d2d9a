//! The vision classifiers against transformers 5.23 (`scripts/reference/vision.py`): a tiny
//! `ViTForImageClassification` and `SiglipForImageClassification` loaded from upstream's
//! checkpoints (through the Auto class) give upstream's logits, loss and every parameter's
//! gradient **to the bit** on the image processor's pixel values (evaluation mode, float32;
//! SigLIP's unused attention-pooling head gets no gradient, as upstream's), and
//! `save_pretrained` writes upstream's file (ViT's legacy names, the same tensors); the image
//! processors (PIL backend) give upstream's `pixel_values` to the bit, and PIL's resize is
//! reproduced byte for byte.

use std::collections::HashMap;

use anyhow::{Context, Result, ensure};
use tch::{Device, Tensor};
use tchtrain_models::{AutoTask, LoadOptions, ModelInputs, from_pretrained_dir};
use tchtrain_testing::{assets, lock, temp_dir};

fn dir() -> std::path::PathBuf {
    assets().join("reference/vision")
}

pub(crate) fn tensors(path: &std::path::Path) -> Result<HashMap<String, Tensor>> {
    Ok(Tensor::read_safetensors(path)
        .with_context(|| format!("{} (run `cargo xtask setup`)", path.display()))?
        .into_iter()
        .collect())
}

/// One classifier (`vit` or `siglip`): loaded, forward and backward, saved.
fn check_classifier(name: &str, architecture: &str, parameters: usize) -> Result<()> {
    let _g = lock();
    let model_dir = dir().join(name).join("model");
    let loaded = from_pretrained_dir(
        &model_dir,
        AutoTask::ImageClassification { num_labels: None },
        Device::Cpu,
        &LoadOptions::default(),
    )?;
    ensure!(
        loaded.info.missing_keys.is_empty() && loaded.info.unexpected_keys.is_empty(),
        "{name}: {:?}",
        loaded.info
    );
    let mut model = loaded.model;
    ensure!(
        model.architecture() == architecture,
        "{}",
        model.architecture()
    );
    let pixels = tensors(&dir().join(name).join("processor/pixel_values.safetensors"))?;
    let pixel_values = pixels["pixel_values"].narrow(0, 0, 4);
    let labels = Tensor::from_slice(&[0i64, 1, 2, 0]);
    let r = tensors(&dir().join(name).join("forward.safetensors"))?;
    model.eval();
    let out = model.forward(&ModelInputs {
        pixel_values: Some(&pixel_values),
        labels: Some(&labels),
        ..ModelInputs::default()
    })?;
    let logits = out.logits.context("logits")?;
    ensure!(
        logits.equal(&r["logits"]),
        "{name}: logits differ by {}",
        (&logits - &r["logits"]).abs().max()
    );
    let loss = out.loss.context("loss")?;
    ensure!(
        loss.reshape([1]).equal(&r["loss"]),
        "{name}: loss {loss} vs {}",
        r["loss"]
    );
    loss.backward();
    let vars = model.var_store().variables();
    ensure!(
        vars.len() == parameters,
        "{name}: {} parameters",
        vars.len()
    );
    gradients_equal(name, &vars, &r)?;
    let out_dir = temp_dir(&format!("{name}-save"));
    model.save_pretrained(&out_dir)?;
    saved_equal(name, &out_dir, &model_dir)?;
    let _ = std::fs::remove_dir_all(&out_dir);
    Ok(())
}

/// Every variable's gradient equals the reference's `grad.<name>` to the bit, and those
/// without one there have none; every reference gradient is compared.
pub(crate) fn gradients_equal(
    name: &str,
    vars: &HashMap<String, Tensor>,
    r: &HashMap<String, Tensor>,
) -> Result<()> {
    let mut compared = 0;
    for (var_name, var) in vars {
        let grad = var.grad();
        match r.get(&format!("grad.{var_name}")) {
            Some(expected) => {
                ensure!(
                    grad.equal(expected),
                    "{name}: grad of {var_name} differs by {}",
                    (&grad - expected).abs().max()
                );
                compared += 1;
            }
            None => ensure!(
                !grad.defined(),
                "{name}: {var_name} has a gradient, upstream's none"
            ),
        }
    }
    let expected = r.keys().filter(|k| k.starts_with("grad.")).count();
    ensure!(
        compared == expected,
        "{name}: {compared} gradients of {expected}"
    );
    Ok(())
}

/// The `model.safetensors` saved in `ours` holds the same tensors as `theirs`'s.
pub(crate) fn saved_equal(
    name: &str,
    ours: &std::path::Path,
    theirs: &std::path::Path,
) -> Result<()> {
    let ours = tensors(&ours.join("model.safetensors"))?;
    let theirs = tensors(&theirs.join("model.safetensors"))?;
    let mut names: Vec<_> = theirs.keys().collect();
    names.sort();
    let mut our_names: Vec<_> = ours.keys().collect();
    our_names.sort();
    ensure!(
        names == our_names,
        "{name}: saved {our_names:?} vs {names:?}"
    );
    for n in names {
        ensure!(ours[n].equal(&theirs[n]), "{name}: saved {n} differs");
    }
    Ok(())
}

#[test]
fn vit_image_classification_equals_transformers() -> Result<()> {
    check_classifier("vit", "ViTForImageClassification", 2 * 16 + 8)
}

#[test]
fn siglip_image_classification_equals_transformers() -> Result<()> {
    check_classifier(
        "siglip",
        "SiglipForImageClassification",
        3 + 2 * 16 + 2 + 11 + 2,
    )
}

/// `ViTImageProcessorPil` (bilinear) and `SiglipImageProcessorPil` (bicubic, RGB
/// conversion) on the PNGs: `pixel_values` equal upstream's **to the bit** (PIL's resize
/// ported, numpy's rescale and normalize orders); and PIL's own `Image.resize` reproduced
/// byte for byte by every filter on RGB and gray images, up and down, including the sizes
/// where Pillow 13 resizes vertically first.
#[test]
fn image_processors_equal_pil() -> Result<()> {
    use tchtrain_models::pil_resize::{Filter, resize_u8};
    let images = (0..24)
        .map(|i| tchtrain_datasets::open_image(&dir().join(format!("images/{i}.png"))))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    for name in ["vit", "siglip"] {
        let processor =
            tchtrain_models::ImageProcessor::from_pretrained(&dir().join(name).join("processor"))?;
        let ours = processor.preprocess(&images)?;
        let theirs = tensors(&dir().join(name).join("processor/pixel_values.safetensors"))?;
        ensure!(
            ours.equal(&theirs["pixel_values"]),
            "{name}: pixel values differ (max abs {})",
            (&ours - &theirs["pixel_values"]).abs().max()
        );
    }
    // A key the PIL backend does not implement is refused, naming it.
    let mut config = tchtrain_models::ImageProcessorConfig::default();
    config
        .extra
        .insert("crop_pct".into(), serde_json::json!(0.875));
    let err = tchtrain_models::ImageProcessor::new(config)
        .err()
        .context("crop_pct")?;
    ensure!(err.to_string().contains("crop_pct"), "{err}");
    let resized = tensors(&dir().join("pil_resize.safetensors"))?;
    let mut checked = 0;
    for (key, expected) in &resized {
        let parts: Vec<&str> = key.split('.').collect();
        let (i, mode, f, size) = (parts[0], parts[1], parts[2], parts[3]);
        let image = &images[i.parse::<usize>()?];
        let (src, channels) = match mode {
            "RGB" => (image.data.clone(), 3),
            _ => (
                image
                    .data
                    .chunks_exact(3)
                    // PIL's convert("L"): ITU-R 601-2 luma in fixed point.
                    .map(|p| {
                        ((u32::from(p[0]) * 19595
                            + u32::from(p[1]) * 38470
                            + u32::from(p[2]) * 7471
                            + 0x8000)
                            >> 16) as u8
                    })
                    .collect(),
                1,
            ),
        };
        let filter = match f {
            "0" => Filter::Nearest,
            "1" => Filter::Lanczos,
            "2" => Filter::Bilinear,
            _ => Filter::Bicubic,
        };
        let (w, h) = size.split_once('x').context("size")?;
        let (w, h): (usize, usize) = (w.parse()?, h.parse()?);
        let out = resize_u8(&src, image.width, image.height, channels, w, h, filter);
        let want = Vec::<u8>::try_from(expected.reshape([-1]))?;
        ensure!(
            out == want,
            "{key}: {} bytes differ",
            out.iter().zip(&want).filter(|(a, b)| a != b).count()
        );
        checked += 1;
    }
    ensure!(checked == 6 * 2 * 4 * 3, "{checked} resizes checked");
    Ok(())
}

/// A `datasets` `Image` column read from Parquet (`{bytes, path}`, the PNG bytes embedded):
/// each cell decodes to the file's pixels, and the processor gives upstream's pixel values.
#[test]
fn image_column_from_parquet() -> Result<()> {
    let table = tchtrain_datasets::Table::read(dir().join("images.parquet"))?;
    ensure!(table.len() == 24, "{} rows", table.len());
    let mut images = Vec::new();
    for i in 0..table.len() {
        let cell = table.cell(i, "image")?;
        let image = tchtrain_datasets::image_from_cell(cell, None, &format!("row {i}"))?;
        let file = tchtrain_datasets::open_image(&dir().join(format!("images/{i}.png")))?;
        ensure!(
            image == file,
            "row {i}: the Parquet cell decodes to other pixels"
        );
        ensure!(table.cell(i, "label")?.as_i64() == Some(i as i64 % 3));
        images.push(image);
    }
    let processor =
        tchtrain_models::ImageProcessor::from_pretrained(&dir().join("vit").join("processor"))?;
    let theirs = tensors(&dir().join("vit/processor/pixel_values.safetensors"))?;
    ensure!(
        processor
            .preprocess(&images)?
            .equal(&theirs["pixel_values"])
    );
    // A cell without bytes reads its path (relative to the folder given).
    let by_path = serde_json::json!({"bytes": null, "path": "images/3.png"});
    let image = tchtrain_datasets::image_from_cell(&by_path, Some(&dir()), "path cell")?;
    ensure!(image == images[3]);
    // JPEG is refused, naming the cell and the fix.
    let jpeg = serde_json::json!({"bytes": [255, 216, 255, 224], "path": "x.jpg"});
    let err = tchtrain_datasets::image_from_cell(&jpeg, None, "row 0")
        .err()
        .context("a JPEG cell")?;
    ensure!(
        err.to_string().contains("JPEG") && err.to_string().contains("row 0"),
        "{err}"
    );
    Ok(())
}

/// torchvision 0.28's transforms of upstream's run_image_classification against
/// `scripts/reference/torchvision_transforms.py`: seeded `RandomResizedCrop` +
/// `RandomHorizontalFlip` + `ToTensor` + `Normalize` over five images for six seeds, the
/// generator left in the same state (the next `torch.rand(4)` equal), the fallback crop,
/// `Resize` to a size and to a shortest edge with `CenterCrop`, a padded `CenterCrop`: every
/// tensor **equal to the bit**.
#[test]
fn torchvision_transforms_equal_upstream() -> Result<()> {
    use tchtrain_models::pil_resize::Filter;
    use tchtrain_models::transforms::{
        RandomResizedCrop, Size, center_crop, normalize, random_horizontal_flip, resize, to_tensor,
    };
    let _g = lock();
    let dir = assets().join("reference/torchvision_transforms");
    let r = tensors(&dir.join("transforms.safetensors"))?;
    let images: Vec<_> = (0..5)
        .map(|i| {
            tchtrain_datasets::open_image(&dir.join(format!("images/{i}.png")))
                .map(|im| im.to_rgb())
        })
        .collect::<std::result::Result<_, _>>()?;
    let (mean, std) = ([0.485f32, 0.456, 0.406], [0.229f32, 0.224, 0.225]);
    let same = |key: &str, t: &Tensor| -> Result<()> {
        let want = r.get(key).with_context(|| key.to_string())?;
        ensure!(
            t.size() == want.size() && t.equal(want),
            "{key}: {:?} vs {:?}",
            t.size(),
            want.size()
        );
        Ok(())
    };
    let crop = RandomResizedCrop::new(30, 30);
    for seed in 0..6 {
        tch::manual_seed(seed);
        for (i, im) in images.iter().enumerate() {
            let t = to_tensor(&random_horizontal_flip(&crop.apply(im)?, 0.5));
            same(&format!("train.{seed}.{i}"), &normalize(&t, &mean, &std)?)?;
        }
        same(
            &format!("after.{seed}"),
            &Tensor::rand([4], (tch::Kind::Float, tch::Device::Cpu)),
        )?;
    }
    tch::manual_seed(7);
    let fallback = RandomResizedCrop {
        scale: (5.0, 6.0),
        ..crop
    };
    for (i, im) in images.iter().enumerate() {
        same(&format!("fallback.{i}"), &to_tensor(&fallback.apply(im)?))?;
        let exact = center_crop(&resize(im, Size::Exact(30, 30), Filter::Bilinear)?, 30, 30);
        same(
            &format!("eval.{i}"),
            &normalize(&to_tensor(&exact), &mean, &std)?,
        )?;
        let short = center_crop(
            &resize(im, Size::ShortestEdge(30), Filter::Bilinear)?,
            30,
            30,
        );
        same(
            &format!("short.{i}"),
            &normalize(&to_tensor(&short), &mean, &std)?,
        )?;
        same(&format!("pad.{i}"), &to_tensor(&center_crop(im, 44, 44)))?;
    }
    Ok(())
}
