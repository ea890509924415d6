//! RGB → YUV 4:2:0 (I420) conversion.
//!
//! Colour matrix: BT.601, limited ("TV") range — luma in 16..=235, chroma in 16..=240. This is
//! what decoders assume for an H.264 stream without other signalling, and the encoder also
//! writes it into the SPS VUI (SMPTE 170M), so players and our test decoder agree on colours.
//!
//! Fixed-point coefficients are the BT.601 ones scaled by 2^16 and rounded; they are the
//! textbook values, so the round trip through any standard decoder lands within a code or two.

/// One I420 picture: full-resolution luma, then U and V at half resolution in both axes.
pub(crate) struct I420 {
    pub width: usize,
    pub height: usize,
    pub y: Vec<u8>,
    pub u: Vec<u8>,
    pub v: Vec<u8>,
}

impl I420 {
    /// An empty picture of an even `width` × `height`, reused across frames to avoid
    /// reallocating three planes per frame.
    pub fn new(width: usize, height: usize) -> Self {
        debug_assert!(width.is_multiple_of(2) && height.is_multiple_of(2));
        Self {
            width,
            height,
            y: vec![0; width * height],
            u: vec![0; width * height / 4],
            v: vec![0; width * height / 4],
        }
    }

    /// Fills this picture from one packed RGB frame of `src_width` × `src_height`.
    ///
    /// The picture may be one pixel larger than the source in either axis (H.264 4:2:0 needs
    /// even sizes); the extra row/column repeats the source's last one, which keeps the padding
    /// invisible in chroma averaging and costs almost nothing to encode.
    pub fn fill_from_rgb(&mut self, rgb: &[u8], src_width: usize, src_height: usize) {
        debug_assert_eq!(rgb.len(), src_width * src_height * 3);
        debug_assert!(self.width >= src_width && self.width - src_width <= 1);
        debug_assert!(self.height >= src_height && self.height - src_height <= 1);
        let pixel = |x: usize, y: usize| -> [i32; 3] {
            let (x, y) = (x.min(src_width - 1), y.min(src_height - 1));
            let i = (y * src_width + x) * 3;
            [rgb[i] as i32, rgb[i + 1] as i32, rgb[i + 2] as i32]
        };
        let cw = self.width / 2;
        // Work on 2×2 blocks: four luma samples and one chroma pair from the block's mean
        // colour (converting the mean is the usual box-filter chroma subsampling).
        for by in 0..self.height / 2 {
            for bx in 0..cw {
                let mut sum = [0i32; 3];
                for (dy, dx) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
                    let (x, y) = (2 * bx + dx, 2 * by + dy);
                    let p = pixel(x, y);
                    self.y[y * self.width + x] = luma(p);
                    for c in 0..3 {
                        sum[c] += p[c];
                    }
                }
                // Mean of four, rounded.
                let mean = sum.map(|s| (s + 2) >> 2);
                let (u, v) = chroma(mean);
                self.u[by * cw + bx] = u;
                self.v[by * cw + bx] = v;
            }
        }
    }
}

/// Y' = 16 + 0.256788 R + 0.504129 G + 0.097906 B (BT.601, limited range).
fn luma([r, g, b]: [i32; 3]) -> u8 {
    let y = (16_829 * r + 33_039 * g + 6_416 * b + (16 << 16) + (1 << 15)) >> 16;
    y.clamp(0, 255) as u8
}

/// Cb = 128 − 0.148223 R − 0.290993 G + 0.439216 B; Cr = 128 + 0.439216 R − 0.367788 G −
/// 0.071427 B (BT.601, limited range).
fn chroma([r, g, b]: [i32; 3]) -> (u8, u8) {
    let u = (-9_714 * r - 19_071 * g + 28_784 * b + (128 << 16) + (1 << 15)) >> 16;
    let v = (28_784 * r - 24_103 * g - 4_681 * b + (128 << 16) + (1 << 15)) >> 16;
    (u.clamp(0, 255) as u8, v.clamp(0, 255) as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_colours_map_to_limited_range_codes() {
        assert_eq!(luma([0, 0, 0]), 16);
        assert_eq!(luma([255, 255, 255]), 235);
        assert_eq!(chroma([0, 0, 0]), (128, 128));
        assert_eq!(chroma([255, 255, 255]), (128, 128));
        // Pure red: Y 81, Cb 90, Cr 240 in the BT.601 tables.
        assert_eq!(luma([255, 0, 0]), 81);
        assert_eq!(chroma([255, 0, 0]), (90, 240));
        // Pure blue: Cb reaches its maximum of 240.
        assert_eq!(chroma([0, 0, 255]).0, 240);
    }

    #[test]
    fn odd_sizes_are_padded_by_repeating_the_edge() {
        // 3×1 source: one red, one green, one blue pixel → 4×2 picture.
        let rgb = [255, 0, 0, 0, 255, 0, 0, 0, 255];
        let mut pic = I420::new(4, 2);
        pic.fill_from_rgb(&rgb, 3, 1);
        let blue = luma([0, 0, 255]);
        assert_eq!(pic.y[2], blue);
        assert_eq!(pic.y[3], blue, "padding column repeats the last column");
        assert_eq!(
            &pic.y[4..8],
            &pic.y[0..4],
            "padding row repeats the last row"
        );
        assert_eq!(pic.u[1], chroma([0, 0, 255]).0);
    }
}
