//! Pickle opcodes (CPython's `pickle.py` names), shared by the unpickler and the pickler.

pub(crate) const MARK: u8 = b'(';
pub(crate) const STOP: u8 = b'.';
pub(crate) const POP: u8 = b'0';
pub(crate) const POP_MARK: u8 = b'1';
pub(crate) const DUP: u8 = b'2';
pub(crate) const FLOAT: u8 = b'F';
pub(crate) const INT: u8 = b'I';
pub(crate) const BININT: u8 = b'J';
pub(crate) const BININT1: u8 = b'K';
pub(crate) const LONG: u8 = b'L';
pub(crate) const BININT2: u8 = b'M';
pub(crate) const NONE: u8 = b'N';
pub(crate) const PERSID: u8 = b'P';
pub(crate) const BINPERSID: u8 = b'Q';
pub(crate) const REDUCE: u8 = b'R';
pub(crate) const STRING: u8 = b'S';
pub(crate) const BINSTRING: u8 = b'T';
pub(crate) const SHORT_BINSTRING: u8 = b'U';
pub(crate) const UNICODE: u8 = b'V';
pub(crate) const BINUNICODE: u8 = b'X';
pub(crate) const APPEND: u8 = b'a';
pub(crate) const BUILD: u8 = b'b';
pub(crate) const GLOBAL: u8 = b'c';
pub(crate) const DICT: u8 = b'd';
pub(crate) const EMPTY_DICT: u8 = b'}';
pub(crate) const APPENDS: u8 = b'e';
pub(crate) const GET: u8 = b'g';
pub(crate) const BINGET: u8 = b'h';
pub(crate) const INST: u8 = b'i';
pub(crate) const LONG_BINGET: u8 = b'j';
pub(crate) const LIST: u8 = b'l';
pub(crate) const EMPTY_LIST: u8 = b']';
pub(crate) const OBJ: u8 = b'o';
pub(crate) const PUT: u8 = b'p';
pub(crate) const BINPUT: u8 = b'q';
pub(crate) const LONG_BINPUT: u8 = b'r';
pub(crate) const SETITEM: u8 = b's';
pub(crate) const TUPLE: u8 = b't';
pub(crate) const EMPTY_TUPLE: u8 = b')';
pub(crate) const SETITEMS: u8 = b'u';
pub(crate) const BINFLOAT: u8 = b'G';
// Protocol 2.
pub(crate) const PROTO: u8 = 0x80;
pub(crate) const NEWOBJ: u8 = 0x81;
pub(crate) const EXT1: u8 = 0x82;
pub(crate) const EXT2: u8 = 0x83;
pub(crate) const EXT4: u8 = 0x84;
pub(crate) const TUPLE1: u8 = 0x85;
pub(crate) const TUPLE2: u8 = 0x86;
pub(crate) const TUPLE3: u8 = 0x87;
pub(crate) const NEWTRUE: u8 = 0x88;
pub(crate) const NEWFALSE: u8 = 0x89;
pub(crate) const LONG1: u8 = 0x8a;
pub(crate) const LONG4: u8 = 0x8b;
// Protocol 3.
pub(crate) const BINBYTES: u8 = b'B';
pub(crate) const SHORT_BINBYTES: u8 = b'C';
// Protocol 4.
pub(crate) const SHORT_BINUNICODE: u8 = 0x8c;
pub(crate) const BINUNICODE8: u8 = 0x8d;
pub(crate) const BINBYTES8: u8 = 0x8e;
pub(crate) const EMPTY_SET: u8 = 0x8f;
pub(crate) const ADDITEMS: u8 = 0x90;
pub(crate) const FROZENSET: u8 = 0x91;
pub(crate) const NEWOBJ_EX: u8 = 0x92;
pub(crate) const STACK_GLOBAL: u8 = 0x93;
pub(crate) const MEMOIZE: u8 = 0x94;
pub(crate) const FRAME: u8 = 0x95;
// Protocol 5.
pub(crate) const BYTEARRAY8: u8 = 0x96;
pub(crate) const NEXT_BUFFER: u8 = 0x97;
pub(crate) const READONLY_BUFFER: u8 = 0x98;

/// The highest protocol a pickle may declare (`pickle.HIGHEST_PROTOCOL`).
pub(crate) const HIGHEST_PROTOCOL: u8 = 5;

/// Python's `encode_long`: the minimal two's-complement little-endian bytes of `x` (empty
/// for 0), as `LONG1` carries them.
pub(crate) fn encode_long(x: i64) -> Vec<u8> {
    if x == 0 {
        return Vec::new();
    }
    let mut bytes = x.to_le_bytes().to_vec();
    minimal_twos_complement(&mut bytes);
    bytes
}

/// Drops redundant sign-extension bytes from little-endian two's-complement `bytes`.
pub(crate) fn minimal_twos_complement(bytes: &mut Vec<u8>) {
    while bytes.len() > 1 {
        let last = bytes[bytes.len() - 1];
        let next_sign = bytes[bytes.len() - 2] & 0x80;
        if (last == 0 && next_sign == 0) || (last == 0xff && next_sign != 0) {
            bytes.pop();
        } else {
            break;
        }
    }
    if bytes.len() == 1 && bytes[0] == 0 {
        bytes.clear();
    }
}

/// The `i64` that minimal little-endian two's-complement `bytes` encode, if it fits.
pub(crate) fn decode_long_i64(bytes: &[u8]) -> Option<i64> {
    if bytes.len() > 8 {
        return None;
    }
    let fill = if bytes.last().is_some_and(|b| b & 0x80 != 0) {
        0xff
    } else {
        0
    };
    let mut full = [fill; 8];
    full[..bytes.len()].copy_from_slice(bytes);
    Some(i64::from_le_bytes(full))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longs_encode_as_python_does() {
        // pickle.encode_long
        assert_eq!(encode_long(0), b"");
        assert_eq!(encode_long(255), [0xff, 0x00]);
        assert_eq!(encode_long(-256), [0x00, 0xff]);
        assert_eq!(encode_long(-128), [0x80]);
        assert_eq!(encode_long(2147483648), [0, 0, 0, 0x80, 0]);
        assert_eq!(encode_long(i64::MIN), i64::MIN.to_le_bytes());
        for x in [0, 1, -1, 127, 128, -129, 1 << 40, i64::MAX, i64::MIN] {
            assert_eq!(decode_long_i64(&encode_long(x)), Some(x));
        }
    }
}
