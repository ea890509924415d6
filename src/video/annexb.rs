//! Splitting an H.264 Annex-B byte stream (what OpenH264 emits) into NAL units.
//!
//! Annex-B separates NAL units with start codes `00 00 01` or `00 00 00 01`; MP4 instead
//! prefixes each unit with its length ("AVCC" layout). Emulation prevention guarantees that a
//! start code never occurs inside a NAL unit, so a plain scan for `00 00 01` is exact.

/// NAL unit types this module cares about (H.264 Table 7-1).
pub(crate) const NAL_IDR_SLICE: u8 = 5;
pub(crate) const NAL_SPS: u8 = 7;
pub(crate) const NAL_PPS: u8 = 8;
pub(crate) const NAL_AUD: u8 = 9;

/// The `nal_unit_type` field: the low five bits of the first byte.
pub(crate) fn nal_type(nal: &[u8]) -> u8 {
    nal.first().map_or(0, |b| b & 0x1f)
}

/// The NAL units of an Annex-B stream, without their start codes. Bytes before the first start
/// code (none, for a well-formed stream) are ignored, as are empty units.
pub(crate) fn split_nal_units(stream: &[u8]) -> Vec<&[u8]> {
    // OpenH264's splitter gives each unit with its `00 00 01` in front and everything up to the
    // next one behind it.
    openh264::nal_units(stream)
        .filter_map(|unit| {
            let unit = unit.strip_prefix(&[0, 0, 1][..])?;
            // A 4-byte start code's leading zero, and any trailing_zero_8bits, belong to neither
            // unit: a NAL unit never ends in a zero byte (it ends in the RBSP stop bit).
            let end = unit
                .iter()
                .rposition(|&b| b != 0)
                .map_or(0, |last| last + 1);
            (end > 0).then(|| &unit[..end])
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_three_and_four_byte_start_codes() {
        let stream = [
            0, 0, 0, 1, 0x67, 0xAA, 0xBB, // SPS, 4-byte start code
            0, 0, 1, 0x68, 0xCC, // PPS, 3-byte start code
            0, 0, 0, 1, 0x65, 0x00, 0x00, 0x03, 0x01, 0x80, // IDR slice with an escaped 00 00
        ];
        let units = split_nal_units(&stream);
        assert_eq!(
            units,
            vec![
                &[0x67, 0xAA, 0xBB][..],
                &[0x68, 0xCC][..],
                &[0x65, 0x00, 0x00, 0x03, 0x01, 0x80][..],
            ]
        );
        let types: Vec<u8> = units.iter().map(|u| nal_type(u)).collect();
        assert_eq!(types, vec![NAL_SPS, NAL_PPS, NAL_IDR_SLICE]);
    }

    #[test]
    fn empty_and_garbage_streams_give_no_units() {
        assert!(split_nal_units(&[]).is_empty());
        assert!(split_nal_units(&[1, 2, 3]).is_empty());
        assert!(split_nal_units(&[0, 0, 0, 1]).is_empty());
        assert!(split_nal_units(&[0, 0, 1, 0, 0, 0, 1]).is_empty());
    }

    #[test]
    fn skips_leading_bytes_and_drops_trailing_zeros() {
        let stream = [
            7, 7, 0, // before the first start code
            0, 0, 1, 0x09, 0xF0, 0,
            0, // AUD, then a 4-byte start code's zero and a trailing zero
            0, 0, 1, 0x67, 0x42, 0, // SPS with a trailing zero at the end of the stream
        ];
        assert_eq!(
            split_nal_units(&stream),
            vec![&[0x09, 0xF0][..], &[0x67, 0x42][..]]
        );
    }
}
