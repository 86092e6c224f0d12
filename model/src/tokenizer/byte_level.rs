//! The byte-level alphabet of GPT-2-style BPE: every byte maps to one printable character, so
//! token strings in `tokenizer.json` are plain text. Printable Latin-1 bytes map to themselves, the
//! other bytes, in increasing order, to U+0100, U+0101, ….

/// Whether `byte` is one of the bytes that stand for themselves.
const fn is_self_mapped(byte: u8) -> bool {
    matches!(byte, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)
}

const BYTE_TO_CHAR: [char; 256] = {
    let mut table = ['\0'; 256];
    let mut next_shifted = 0x100u32;
    let mut byte = 0usize;
    while byte < 256 {
        let code = if is_self_mapped(byte as u8) {
            byte as u32
        } else {
            next_shifted += 1;
            next_shifted - 1
        };
        table[byte] = match char::from_u32(code) {
            Some(c) => c,
            None => panic!("byte-level code points are valid"),
        };
        byte += 1;
    }
    table
};

/// The byte-level character standing for `byte`.
pub fn byte_to_char(byte: u8) -> char {
    BYTE_TO_CHAR[byte as usize]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_mappings() {
        assert_eq!(byte_to_char(b'A'), 'A');
        assert_eq!(byte_to_char(b' '), '\u{120}'); // "Ġ"
        assert_eq!(byte_to_char(b'\n'), '\u{10A}'); // "Ċ"
        assert_eq!(byte_to_char(0), '\u{100}');
        assert_eq!(byte_to_char(0xAD), '\u{143}');
        let distinct: std::collections::HashSet<char> = (0..=255u8).map(byte_to_char).collect();
        assert_eq!(distinct.len(), 256);
    }
}
