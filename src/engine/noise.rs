//! Counter-based Gaussian noise: Philox4x32-10 and Box–Muller, exactly as `docs/generation.md`
//! writes them.
//!
//! Noise is a pure function of `(seed, prompt, draw, element)`, never of how many numbers were
//! drawn before. That is what lets prompt 7 get the same noise alone, inside a probe or in any
//! shard layout, and what lets the exporter's PyTorch reference reproduce it bit for bit.

/// Philox multipliers (Salmon et al. 2011, table 2).
const PHILOX_M0: u32 = 0xD251_1F53;
const PHILOX_M1: u32 = 0xCD9E_8D57;
/// Weyl sequence constants that bump the key between rounds (golden ratio and sqrt(3) - 1).
const PHILOX_W0: u32 = 0x9E37_79B9;
const PHILOX_W1: u32 = 0xBB67_AE85;
/// The number of rounds; ten is the variant Random123 ships as its default and tests.
const PHILOX_ROUNDS: usize = 10;

/// The last counter word, ASCII "unst": it keeps this product's streams apart from any other use
/// of the same key.
pub const COUNTER_TAG: u32 = 0x756e_7374;

/// One Philox4x32-10 block: four 32-bit words from a 128-bit counter and a 64-bit key.
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let mut ctr = counter;
    let mut key = key;
    for round in 0..PHILOX_ROUNDS {
        if round > 0 {
            key[0] = key[0].wrapping_add(PHILOX_W0);
            key[1] = key[1].wrapping_add(PHILOX_W1);
        }
        let p0 = u64::from(PHILOX_M0) * u64::from(ctr[0]);
        let p1 = u64::from(PHILOX_M1) * u64::from(ctr[2]);
        let (hi0, lo0) = ((p0 >> 32) as u32, p0 as u32);
        let (hi1, lo1) = ((p1 >> 32) as u32, p1 as u32);
        ctr = [hi1 ^ ctr[1] ^ key[0], lo1, hi0 ^ ctr[3] ^ key[1], lo0];
    }
    ctr
}

/// The Philox key of a seed: low word first.
fn key_of(seed: u64) -> [u32; 2] {
    [seed as u32, (seed >> 32) as u32]
}

/// Four standard normals (as f64, before rounding) from one Philox block, by Box–Muller.
fn box_muller(r: [u32; 4]) -> [f64; 4] {
    const TWO_POW_MINUS_24: f64 = 1.0 / 16_777_216.0;
    // u1 and u3 are in (0, 1] so that ln never sees zero; u2 and u4 are in [0, 1).
    let u1 = (f64::from(r[0] >> 8) + 1.0) * TWO_POW_MINUS_24;
    let u2 = f64::from(r[1] >> 8) * TWO_POW_MINUS_24;
    let u3 = (f64::from(r[2] >> 8) + 1.0) * TWO_POW_MINUS_24;
    let u4 = f64::from(r[3] >> 8) * TWO_POW_MINUS_24;
    let radius_a = (-2.0 * u1.ln()).sqrt();
    let radius_b = (-2.0 * u3.ln()).sqrt();
    let angle_a = 2.0 * std::f64::consts::PI * u2;
    let angle_b = 2.0 * std::f64::consts::PI * u4;
    [
        radius_a * angle_a.cos(),
        radius_a * angle_a.sin(),
        radius_b * angle_b.cos(),
        radius_b * angle_b.sin(),
    ]
}

/// Fills `out` with the standard normal noise of draw `draw` of prompt `prompt`: element `e` of
/// `out` is element `e` of that draw, whatever the length of `out`.
pub fn fill_normal(seed: u64, prompt: u32, draw: u32, out: &mut [f32]) {
    fill_normal_at(seed, prompt, draw, 0, out);
}

/// Like [`fill_normal`], for the elements `start ..` of the draw; `start` must be a multiple of
/// four (one Philox block gives four elements), which lets callers split a draw into chunks.
pub fn fill_normal_at(seed: u64, prompt: u32, draw: u32, start: usize, out: &mut [f32]) {
    assert!(
        start.is_multiple_of(4),
        "noise chunks start at a multiple of 4, not {start}"
    );
    let key = key_of(seed);
    let first_block = start / 4;
    for (k, chunk) in out.chunks_mut(4).enumerate() {
        let counter = [(first_block + k) as u32, draw, prompt, COUNTER_TAG];
        let normals = box_muller(philox4x32_10(counter, key));
        for (slot, value) in chunk.iter_mut().zip(normals) {
            *slot = value as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Known-answer vectors of Philox4x32-10 from Random123's `kat_vectors` file.
    #[test]
    fn philox_matches_random123_known_answers() {
        let cases: [([u32; 4], [u32; 2], [u32; 4]); 3] = [
            (
                [0, 0, 0, 0],
                [0, 0],
                [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8],
            ),
            (
                [u32::MAX; 4],
                [u32::MAX; 2],
                [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd],
            ),
            (
                [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344],
                [0xa4093822, 0x299f31d0],
                [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1],
            ),
        ];
        for (counter, key, expected) in cases {
            assert_eq!(
                philox4x32_10(counter, key),
                expected,
                "counter {counter:x?} key {key:x?}"
            );
        }
    }

    #[test]
    fn key_takes_low_word_first() {
        assert_eq!(key_of(0x0000_0001_0000_0002), [2, 1]);
        assert_eq!(key_of(0), [0, 0]);
    }

    #[test]
    fn element_noise_does_not_depend_on_buffer_length() {
        let mut long = vec![0.0f32; 37];
        let mut short = vec![0.0f32; 10];
        fill_normal(5, 7, 3, &mut long);
        fill_normal(5, 7, 3, &mut short);
        assert_eq!(&long[..10], &short[..]);
    }

    #[test]
    fn streams_differ_by_seed_prompt_and_draw() {
        let draw = |seed, prompt, draw| {
            let mut out = vec![0.0f32; 8];
            fill_normal(seed, prompt, draw, &mut out);
            out
        };
        let base = draw(0, 0, 0);
        for other in [
            draw(1, 0, 0),
            draw(0, 1, 0),
            draw(0, 0, 1),
            draw(1 << 32, 0, 0),
        ] {
            assert_ne!(base, other);
        }
        assert_eq!(base, draw(0, 0, 0));
    }

    /// The first element of a draw by hand: the counter layout and Box–Muller of the docs.
    #[test]
    fn first_normal_follows_the_documented_formula() {
        let r = philox4x32_10([0, 4, 9, COUNTER_TAG], [42, 0]);
        let u1 = ((r[0] >> 8) as f64 + 1.0) / 16_777_216.0;
        let u2 = (r[1] >> 8) as f64 / 16_777_216.0;
        let expected = ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32;
        let mut out = [0.0f32; 1];
        fill_normal(42, 9, 4, &mut out);
        assert_eq!(out[0].to_bits(), expected.to_bits());
    }

    #[test]
    fn noise_is_roughly_standard_normal() {
        let mut out = vec![0.0f32; 1 << 16];
        fill_normal(0, 0, 0, &mut out);
        let n = out.len() as f64;
        let mean = out.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
        let var = out
            .iter()
            .map(|&x| (f64::from(x) - mean).powi(2))
            .sum::<f64>()
            / n;
        assert!(mean.abs() < 0.02, "mean {mean}");
        assert!((var - 1.0).abs() < 0.03, "variance {var}");
    }
}
