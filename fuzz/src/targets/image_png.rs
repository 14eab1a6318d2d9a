//! `datasets`' `Image` cells: `decode_image` on any bytes (an error, never a panic), and for a
//! small image that decodes, the ViT image processor (RGB conversion, bilinear resize to 7 × 5,
//! rescale, normalize): `[3, 5, 7]` finite values in [-1, 1].

use tchtrain_models::{ImageProcessor, ImageProcessorConfig, SizeDict};

/// One input.
pub fn run(data: &[u8]) {
    let Ok(image) = tchtrain_datasets::decode_image(data, "fuzz input") else {
        return;
    };
    assert_eq!(
        image.data.len(),
        image.width * image.height * image.channels(),
        "decoded samples"
    );
    if image.width * image.height > 1 << 16 || image.width == 0 || image.height == 0 {
        return;
    }
    let processor = ImageProcessor::new(ImageProcessorConfig {
        size: SizeDict {
            height: Some(5),
            width: Some(7),
            ..SizeDict::default()
        },
        do_convert_rgb: Some(true),
        ..ImageProcessorConfig::default()
    })
    .expect("the processor");
    let (shape, values) = processor.process(&image).expect("an RGB image processes");
    assert_eq!(shape, [3, 5, 7]);
    assert!(
        values.iter().all(|v| (-1.0..=1.0).contains(v)),
        "pixel values in [-1, 1]"
    );
}
