//! Bit-exact port of Pillow's `Image.resize(size, resample)` for 8-bit images
//! (Pillow 13.0.0; mode "L" = 1 channel, mode "RGB" = 3 channels), with the
//! default `box=None` and `reducing_gap=None`.
//!
//! Sources this was ported from: the Pillow 13.0.0 sdist
//! (`pip download --no-binary pillow pillow==13.0.0`; the same files as the
//! installed 13.0.0 wheel's `PIL/Image.py`).  NOTE: the GitHub `main` snapshot
//! of 2026-08-22 (`_version.py` = "13.0.0.dev0") does NOT yet contain the
//! 13.0.0 pass-order rule in `ImagingResampleInner` (it came from PR #9549) and
//! instead has a Python-level "tall image" special case; do not port from it.
//! * `src/PIL/Image.py`, `Image.resize`: `box` defaults to `(0, 0, w, h)`; if
//!   `size == self.size` (and the box is the default one) it returns
//!   `self.copy()`; otherwise for "L"/"RGB" it calls `self.im.resize(size,
//!   resample, box)` directly (only "LA"/"RGBA" go through premultiplied
//!   "La"/"RGBa", which this module does NOT do; see below).
//! * `src/_imaging.c`, `_resize`: the box is kept as `float box[4]`; if the
//!   box is integral and its size equals the requested size -> `ImagingCrop`
//!   (a copy here); else NEAREST -> `ImagingTransform(..., AFFINE, a, filter=0,
//!   fill=1)` with `a[0] = (double)(box[2]-box[0]) / xsize`,
//!   `a[4] = (double)(box[3]-box[1]) / ysize`, `a[2] = box[0]`, `a[5] = box[1]`;
//!   all other filters -> `ImagingResample`.
//! * `src/libImaging/Geometry.c`: `ImagingTransformAffine` -> (pure scaling,
//!   filterid 0) `ImagingScaleAffine`, which is what [`ImagingScaleAffine`]
//!   reproduces (including the *accumulated* `xo += a[0]` coordinates).
//! * `src/libImaging/Resample.c`: `ImagingResampleInner`,
//!   `precompute_coeffs`, `normalize_coeffs_8bpc`,
//!   `ImagingResampleHorizontal_8bpc`, `ImagingResampleVertical_8bpc`, the
//!   filter kernels and `clip8`.
//!
//! Pillow stores "RGB" as 4 bytes per pixel, but every channel is computed
//! independently with the same integer coefficients, so operating on tightly
//! interleaved HWC data gives identical bytes.  `channels` may be 1..=4; for 2
//! and 4 channels the result equals Pillow on modes whose channels are resized
//! independently ("RGBX"/"RGBa"/"La"), NOT Pillow's "RGBA"/"LA" `resize`, which
//! premultiplies alpha first.
//!
//! Not reproduced: the `box` argument, `reducing_gap`, BOX/HAMMING/MKS
//! filters, 16-bit/32-bit modes.  Older Pillow `Resample.c` (e.g. the `main`
//! snapshot above) always ran the horizontal pass first; the pass order is
//! part of the result (see [`ImagingResampleInner`]), so outputs of other
//! Pillow versions can differ (by a few units) where 13.0.0 goes vertical-first.

#![allow(
    non_snake_case,
    non_upper_case_globals,
    non_camel_case_types,
    clippy::too_many_arguments,
    // The loops keep Resample.c's index arithmetic, line for line.
    clippy::needless_range_loop
)]

/// Resampling filter, same meaning as `PIL.Image.Resampling.*`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Filter {
    /// `Resampling.NEAREST` (0): affine nearest-neighbour (Geometry.c).
    Nearest,
    /// `Resampling.BILINEAR` (2): triangle filter, support 1.
    Bilinear,
    /// `Resampling.BICUBIC` (3): Keys cubic, a = -0.5, support 2.
    Bicubic,
    /// `Resampling.LANCZOS` (1): Lanczos-3, support 3.
    Lanczos,
}

// ---------------------------------------------------------------------------
// Filters (Resample.c: `struct filter`, `bilinear_filter`, `bicubic_filter`,
// `sinc_filter`, `lanczos_filter`, and the `BILINEAR`/`BICUBIC`/`LANCZOS`
// structs with their supports 1.0 / 2.0 / 3.0).
// ---------------------------------------------------------------------------

struct filter {
    filter: fn(f64) -> f64,
    support: f64,
}

fn bilinear_filter(mut x: f64) -> f64 {
    if x < 0.0 {
        x = -x;
    }
    if x < 1.0 {
        return 1.0 - x;
    }
    0.0
}

fn bicubic_filter(mut x: f64) -> f64 {
    // `#define a -0.5`; (a + 2.0) and (a + 3.0) are exact (1.5, 2.5), the
    // expressions are written in the same order as in C.
    const a: f64 = -0.5;
    if x < 0.0 {
        x = -x;
    }
    if x < 1.0 {
        return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
    }
    if x < 2.0 {
        return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
    }
    0.0
}

fn sinc_filter(mut x: f64) -> f64 {
    if x == 0.0 {
        return 1.0;
    }
    x *= std::f64::consts::PI; // M_PI
    x.sin() / x // libm sin(), as in C
}

fn lanczos_filter(x: f64) -> f64 {
    // truncated sinc
    if (-3.0..3.0).contains(&x) {
        return sinc_filter(x) * sinc_filter(x / 3.0);
    }
    0.0
}

const BILINEAR: filter = filter {
    filter: bilinear_filter,
    support: 1.0,
};
const BICUBIC: filter = filter {
    filter: bicubic_filter,
    support: 2.0,
};
const LANCZOS: filter = filter {
    filter: lanczos_filter,
    support: 3.0,
};

/// `#define PRECISION_BITS (32 - 8 - 2)`: 22 fractional bits in the integer
/// coefficients (8 bits for the value, 2 spare bits for overshoot, sign).
const PRECISION_BITS: u32 = 32 - 8 - 2;

/// `clip8(int in) { return clip8_lookups[in >> PRECISION_BITS]; }` where the
/// lookup table maps [-640, 0) -> 0, [0, 255] -> identity, (255, 639] -> 255.
/// `>>` on a signed int is an arithmetic shift (floor division by 2^22).
#[inline]
fn clip8(in_: i32) -> u8 {
    let v = in_ >> PRECISION_BITS;
    v.clamp(0, 255) as u8
}

/// Resample.c `precompute_coeffs`.  Returns `(ksize, bounds, kk)`:
/// `bounds[2*xx] = xmin`, `bounds[2*xx+1] = xmax` (a *count*, not an end), and
/// `kk[xx*ksize .. xx*ksize+ksize]` the normalised f64 weights (zero-padded).
///
/// `in0`/`in1` are C `float`s (the box); `scale = (double)(in1 - in0) / outSize`
/// with the subtraction done in f32, as in C.
fn precompute_coeffs(
    inSize: usize,
    in0: f32,
    in1: f32,
    outSize: usize,
    filterp: &filter,
) -> (usize, Vec<i32>, Vec<f64>) {
    // prepare for horizontal stretch
    let scale: f64 = (in1 - in0) as f64 / outSize as f64;
    let mut filterscale = scale;
    if filterscale < 1.0 {
        filterscale = 1.0;
    }
    // determine support size (length of resampling filter)
    let support: f64 = filterp.support * filterscale;
    // maximum number of coeffs: (int)ceil(support) * 2 + 1
    let ksize: usize = (support.ceil() as i32 * 2 + 1) as usize;

    let mut kk = vec![0.0f64; outSize * ksize];
    let mut bounds = vec![0i32; outSize * 2];
    let inv_filterscale = 1.0 / filterscale; // `ss = 1.0 / filterscale` in older Pillow
    let inSize = inSize as i32;
    for xx in 0..outSize {
        let center: f64 = in0 as f64 + (xx as f64 + 0.5) * scale;
        let mut ww: f64 = 0.0;
        // Round the value: C `(int)` truncates toward zero, like Rust `as i32`.
        let mut xmin = (center - support + 0.5) as i32;
        if xmin < 0 {
            xmin = 0;
        }
        let mut xmax = (center + support + 0.5) as i32;
        if xmax > inSize {
            xmax = inSize;
        }
        xmax -= xmin;
        let k = &mut kk[xx * ksize..(xx + 1) * ksize];
        for x in 0..xmax {
            let w = (filterp.filter)(((x + xmin) as f64 - center + 0.5) * inv_filterscale);
            k[x as usize] = w;
            ww += w;
        }
        if ww != 0.0 {
            for x in 0..xmax as usize {
                k[x] /= ww;
            }
        }
        // remaining values (x >= xmax) stay 0.0
        bounds[xx * 2] = xmin;
        bounds[xx * 2 + 1] = xmax;
    }
    (ksize, bounds, kk)
}

/// Resample.c `normalize_coeffs_8bpc`: f64 weight -> fixed point with
/// PRECISION_BITS fractional bits, rounding half away from zero via
/// `(int)(±0.5 + k * (1 << PRECISION_BITS))` (truncation toward zero).
fn normalize_coeffs_8bpc(prekk: &[f64]) -> Vec<i32> {
    let one = (1i32 << PRECISION_BITS) as f64;
    prekk
        .iter()
        .map(|&k| {
            if k < 0.0 {
                (-0.5 + k * one) as i32
            } else {
                (0.5 + k * one) as i32
            }
        })
        .collect()
}

/// Resample.c `ImagingResampleHorizontal_8bpc`.  `imIn` has `in_w` pixels per
/// row; rows `offset .. offset + out_h` are resampled into `imOut`
/// (`out_w * out_h * ch`).  Per output sample:
/// `ss = 1 << (PRECISION_BITS-1); ss += in[x+xmin] * k[x] (i32); out = clip8(ss)`.
fn ImagingResampleHorizontal_8bpc(
    imOut: &mut [u8],
    out_w: usize,
    out_h: usize,
    imIn: &[u8],
    in_w: usize,
    ch: usize,
    offset: usize,
    ksize: usize,
    bounds: &[i32],
    prekk: &[f64],
) {
    let kk = normalize_coeffs_8bpc(prekk);
    let in_stride = in_w * ch;
    let out_stride = out_w * ch;
    for yy in 0..out_h {
        let lineIn = &imIn[(yy + offset) * in_stride..(yy + offset + 1) * in_stride];
        let lineOut = &mut imOut[yy * out_stride..(yy + 1) * out_stride];
        for xx in 0..out_w {
            let xmin = bounds[xx * 2] as usize;
            let xmax = bounds[xx * 2 + 1] as usize;
            let k = &kk[xx * ksize..xx * ksize + ksize];
            for c in 0..ch {
                let mut ss0: i32 = 1 << (PRECISION_BITS - 1);
                for x in 0..xmax {
                    ss0 += lineIn[(x + xmin) * ch + c] as i32 * k[x];
                }
                lineOut[xx * ch + c] = clip8(ss0);
            }
        }
    }
}

/// Resample.c `ImagingResampleVertical_8bpc` (always called with offset 0):
/// per output sample `ss = 1 << (PRECISION_BITS-1);
/// ss += in[y+ymin][xx] * k[y] (i32); out = clip8(ss)`.
fn ImagingResampleVertical_8bpc(
    imOut: &mut [u8],
    out_h: usize,
    imIn: &[u8],
    w: usize,
    ch: usize,
    ksize: usize,
    bounds: &[i32],
    prekk: &[f64],
) {
    let kk = normalize_coeffs_8bpc(prekk);
    let stride = w * ch;
    for yy in 0..out_h {
        let k = &kk[yy * ksize..yy * ksize + ksize];
        let ymin = bounds[yy * 2] as usize;
        let ymax = bounds[yy * 2 + 1] as usize;
        let lineOut = &mut imOut[yy * stride..(yy + 1) * stride];
        for i in 0..stride {
            // i = xx * ch + c
            let mut ss0: i32 = 1 << (PRECISION_BITS - 1);
            for y in 0..ymax {
                ss0 += imIn[(y + ymin) * stride + i] as i32 * k[y];
            }
            lineOut[i] = clip8(ss0);
        }
    }
}

/// Resample.c `ImagingResampleInner` (Pillow 13.0.0) with box = (0, 0, in_w, in_h):
/// * `need_horizontal = xsize != in_w`, `need_vertical = ysize != in_h`;
/// * pass order (new in 13.0.0): `horizontal_first = !((in_h - ysize) > 0 &&
///   (in_h - ysize) > (in_w - xsize) * 2)` (C `int` arithmetic), i.e. the
///   vertical pass runs first only when the height shrinks by more than twice
///   the number of pixels the width shrinks by;
/// * horizontal first: vertical coefficients are computed first to know the
///   used source rows `ybox_first .. ybox_last`; the horizontal pass runs on
///   those rows only (offset `ybox_first`) into a temp image of height
///   `ybox_last - ybox_first`, and the vertical bounds are shifted down by
///   `ybox_first`; then the vertical pass;
/// * vertical first: vertical pass over the whole source (width `in_w`), then
///   the horizontal pass on its `ysize` rows (offset 0);
/// * each pass is skipped when its dimension is unchanged; if neither ran: copy.
///
/// The order matters: every pass rounds to u8 (`clip8`), so H-then-V and
/// V-then-H differ by up to several units.
fn ImagingResampleInner(
    src: &[u8],
    in_w: usize,
    in_h: usize,
    ch: usize,
    xsize: usize,
    ysize: usize,
    filterp: &filter,
) -> Vec<u8> {
    let box_: [f32; 4] = [0.0, 0.0, in_w as f32, in_h as f32];
    // need_horizontal = xsize != imIn->xsize || box[0] || box[2] != xsize;
    let need_horizontal = xsize != in_w || box_[0] != 0.0 || box_[2] != xsize as f32;
    let need_vertical = ysize != in_h || box_[1] != 0.0 || box_[3] != ysize as f32;

    // If height is being scaled down more than twice the amount the width is,
    // run the vertical pass first, to make the horizontal pass faster
    let (iw, ih, ox, oy) = (in_w as i64, in_h as i64, xsize as i64, ysize as i64);
    let horizontal_first = !((ih - oy) > 0 && (ih - oy) > (iw - ox) * 2);

    let mut vert: Option<(usize, Vec<i32>, Vec<f64>)> = None;
    if (need_horizontal && horizontal_first) || need_vertical {
        vert = Some(precompute_coeffs(in_h, box_[1], box_[3], ysize, filterp));
    }
    let mut ybox_first = 0i32;
    let mut ybox_last = 0i32;
    let mut horiz: Option<(usize, Vec<i32>, Vec<f64>)> = None;
    if need_horizontal {
        if horizontal_first {
            let bounds_vert = &mut vert.as_mut().unwrap().1;
            // First used row in the source image
            ybox_first = bounds_vert[0];
            // Last used row in the source image
            ybox_last = bounds_vert[ysize * 2 - 2] + bounds_vert[ysize * 2 - 1];
            // Shift bounds for vertical pass
            if ybox_first != 0 {
                for i in 0..ysize {
                    bounds_vert[i * 2] -= ybox_first;
                }
            }
        }
        horiz = Some(precompute_coeffs(in_w, box_[0], box_[2], xsize, filterp));
    }

    // `PASS(...)` in C: each pass allocates a new image from the current one.
    // cur = (data, width, height); None means "still the source image".
    let mut cur: Option<(Vec<u8>, usize, usize)> = None;
    let horizontal_pass = |cur: &Option<(Vec<u8>, usize, usize)>, h: usize, offset: usize| {
        let (ksize_horiz, bounds_horiz, kk_horiz) = horiz.as_ref().unwrap();
        let (imIn, w): (&[u8], usize) = match cur {
            Some((d, w, _)) => (d.as_slice(), *w),
            None => (src, in_w),
        };
        let mut imTemp = vec![0u8; xsize * h * ch];
        ImagingResampleHorizontal_8bpc(
            &mut imTemp,
            xsize,
            h,
            imIn,
            w,
            ch,
            offset,
            *ksize_horiz,
            bounds_horiz,
            kk_horiz,
        );
        Some((imTemp, xsize, h))
    };
    let vertical_pass = |cur: &Option<(Vec<u8>, usize, usize)>| {
        let (ksize_vert, bounds_vert, kk_vert) = vert.as_ref().unwrap();
        let (imIn, w): (&[u8], usize) = match cur {
            Some((d, w, _)) => (d.as_slice(), *w),
            None => (src, in_w),
        };
        let mut imTemp = vec![0u8; w * ysize * ch];
        ImagingResampleVertical_8bpc(
            &mut imTemp,
            ysize,
            imIn,
            w,
            ch,
            *ksize_vert,
            bounds_vert,
            kk_vert,
        );
        Some((imTemp, w, ysize))
    };

    if horizontal_first {
        if need_horizontal {
            cur = horizontal_pass(&cur, (ybox_last - ybox_first) as usize, ybox_first as usize);
        }
        if need_vertical {
            cur = vertical_pass(&cur);
        }
    } else {
        if need_vertical {
            cur = vertical_pass(&cur);
        }
        if need_horizontal {
            cur = horizontal_pass(&cur, ysize, 0);
        }
    }

    match cur {
        Some((d, _, _)) => d,
        // none of the previous steps are performed, copying
        None => src.to_vec(),
    }
}

/// Geometry.c `ImagingScaleAffine` (reached from `_resize` ->
/// `ImagingTransform(AFFINE, filter NEAREST)` -> `ImagingTransformAffine`,
/// since `a[1] == a[3] == 0`), with `fill = 1`, `x0 = y0 = 0`,
/// `x1 = xsize`, `y1 = ysize`, and
/// `a[0] = (double)(float)(in_w - 0) / xsize`, `a[2] = 0`,
/// `a[4] = (double)(float)(in_h - 0) / ysize`, `a[5] = 0`.
///
/// Source coordinates are *accumulated*: `xo = a[2] + a[0]*0.5`, then
/// `xo += a[0]` per column (likewise `yo` per row); the source index is
/// `COORD(v) = v < 0 ? -1 : (int)v`.  Pixels whose source falls outside the
/// image are 0 (the `fill` memset).
fn ImagingScaleAffine(
    src: &[u8],
    in_w: usize,
    in_h: usize,
    ch: usize,
    xsize: usize,
    ysize: usize,
) -> Vec<u8> {
    #[inline]
    fn COORD(v: f64) -> i32 {
        if v < 0.0 { -1 } else { v as i32 }
    }
    let box_: [f32; 4] = [0.0, 0.0, in_w as f32, in_h as f32];
    let a0: f64 = (box_[2] - box_[0]) as f64 / xsize as f64;
    let a4: f64 = (box_[3] - box_[1]) as f64 / ysize as f64;
    let a2: f64 = box_[0] as f64;
    let a5: f64 = box_[1] as f64;

    let mut imOut = vec![0u8; xsize * ysize * ch]; // fill = 1
    let mut xintab = vec![0usize; xsize];
    let mut xo = a2 + a0 * 0.5;
    let mut yo = a5 + a4 * 0.5;
    let mut xmin = xsize;
    let mut xmax = 0usize;
    // Pretabulate horizontal pixel positions
    for x in 0..xsize {
        let xin = COORD(xo);
        if xin >= 0 && xin < in_w as i32 {
            xmax = x + 1;
            if x < xmin {
                xmin = x;
            }
            xintab[x] = xin as usize;
        }
        xo += a0;
    }
    for y in 0..ysize {
        let yi = COORD(yo);
        if yi >= 0 && yi < in_h as i32 {
            let row_in = &src[yi as usize * in_w * ch..(yi as usize + 1) * in_w * ch];
            let row_out = &mut imOut[y * xsize * ch..(y + 1) * xsize * ch];
            for x in xmin..xmax {
                let s = xintab[x] * ch;
                row_out[x * ch..(x + 1) * ch].copy_from_slice(&row_in[s..s + ch]);
            }
        }
        yo += a4;
    }
    imOut
}

/// Bit-exact equivalent of
/// `Image.fromarray(src).resize((new_width, new_height), resample=filter)`
/// for a uint8 HWC image with 1 ("L") or 3 ("RGB") channels (Pillow 13.0.0,
/// `box=None`, `reducing_gap=None`).  Input and output are interleaved
/// row-major HWC bytes.
///
/// Panics if a dimension is 0 (Pillow raises "height and width must be > 0"),
/// if `channels` is not 1..=4, or if `src.len() != width*height*channels`.
pub fn resize_u8(
    src: &[u8],
    width: usize,
    height: usize,
    channels: usize,
    new_width: usize,
    new_height: usize,
    filter: Filter,
) -> Vec<u8> {
    assert!((1..=4).contains(&channels), "channels must be 1..=4");
    assert_eq!(src.len(), width * height * channels, "src length mismatch");
    assert!(width >= 1 && height >= 1, "source must be non-empty");
    assert!(
        new_width >= 1 && new_height >= 1,
        "height and width must be > 0"
    );

    // Image.py: `if self.size == size and box == (0, 0) + self.size: return self.copy()`
    // (_imaging.c would also take the ImagingCrop path here.)
    if width == new_width && height == new_height {
        return src.to_vec();
    }
    match filter {
        Filter::Nearest => ImagingScaleAffine(src, width, height, channels, new_width, new_height),
        Filter::Bilinear => ImagingResampleInner(
            src, width, height, channels, new_width, new_height, &BILINEAR,
        ),
        Filter::Bicubic => ImagingResampleInner(
            src, width, height, channels, new_width, new_height, &BICUBIC,
        ),
        Filter::Lanczos => ImagingResampleInner(
            src, width, height, channels, new_width, new_height, &LANCZOS,
        ),
    }
}
