//! The bytes under the unpickler: bounded reads of a pickle stream (every length checked
//! against what is left, every line terminated), the text and numbers protocol 0 spells out,
//! and the offset of the opcode being run, for errors.

use std::rc::Rc;

use crate::error::{Error, Result};
use crate::object_graph::Item;
use crate::opcodes::{decode_long_i64, minimal_twos_complement};

/// A pickle stream being read.
pub(crate) struct PickleInput<'a> {
    data: &'a [u8],
    pos: usize,
    /// Offset of the opcode being run.
    pub op: usize,
    /// The pickle's name in errors.
    pub file: &'a str,
}

impl<'a> PickleInput<'a> {
    pub fn new(data: &'a [u8], file: &'a str) -> Self {
        Self {
            data,
            pos: 0,
            op: 0,
            file,
        }
    }

    /// The input's length.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// The next opcode (its offset becomes [`Self::op`]).
    pub fn opcode(&mut self) -> Result<u8> {
        self.op = self.pos;
        Ok(self.take(1, "an opcode")?[0])
    }

    /// A [`Error::BadOperand`] at the current opcode.
    pub fn bad(&self, opcode: &'static str, problem: String) -> Error {
        Error::BadOperand {
            file: self.file.to_string(),
            offset: self.op,
            opcode,
            problem,
        }
    }

    pub fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.data.len());
        let Some(end) = end else {
            return Err(Error::Truncated {
                file: self.file.to_string(),
                offset: self.op,
                what,
            });
        };
        let data: &'a [u8] = self.data;
        let out = &data[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    pub fn check_len(&self, n: u64, opcode: &'static str) -> Result<usize> {
        let remaining = self.data.len() - self.pos;
        if n > remaining as u64 {
            return Err(Error::OversizedLength {
                file: self.file.to_string(),
                offset: self.op,
                opcode,
                length: n,
                remaining,
            });
        }
        Ok(n as usize)
    }

    pub fn take_len(&mut self, n: u64, opcode: &'static str) -> Result<&'a [u8]> {
        let n = self.check_len(n, opcode)?;
        self.take(n, opcode)
    }

    pub fn u32_le(&mut self, what: &'static str) -> Result<u32> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub fn i32_le(&mut self, what: &'static str) -> Result<i32> {
        Ok(self.u32_le(what)? as i32)
    }

    pub fn u64_le(&mut self, what: &'static str) -> Result<u64> {
        let b = self.take(8, what)?;
        let mut le = [0u8; 8];
        le.copy_from_slice(b);
        Ok(u64::from_le_bytes(le))
    }

    pub fn line(&mut self, what: &'static str) -> Result<&'a [u8]> {
        let data: &'a [u8] = self.data;
        let rest = &data[self.pos..];
        let Some(n) = rest.iter().position(|&b| b == b'\n') else {
            return Err(Error::Truncated {
                file: self.file.to_string(),
                offset: self.op,
                what,
            });
        };
        self.pos += n + 1;
        Ok(&rest[..n])
    }

    pub fn line_str(&mut self, what: &'static str) -> Result<String> {
        let line = self.line(what)?.to_vec();
        String::from_utf8(line).map_err(|_| self.bad(what, "the line is not UTF-8".into()))
    }

    /// `n` bytes of UTF-8 text.
    pub fn text(&mut self, n: u64, opcode: &'static str) -> Result<Rc<str>> {
        let bytes = self.take_len(n, opcode)?;
        let text = std::str::from_utf8(bytes).map(Rc::<str>::from);
        text.map_err(|e| self.bad(opcode, format!("the text is not UTF-8 ({e})")))
    }

    /// A protocol-0 decimal integer (Python limits these to 4300 digits).
    pub fn decimal(&self, text: &str, opcode: &'static str) -> Result<Item> {
        if let Ok(i) = text.parse::<i64>() {
            return Ok(Item::Int(i));
        }
        let bad = || self.bad(opcode, format!("not an integer: {text:?}"));
        let (negative, digits) = match text.strip_prefix('-') {
            Some(d) => (true, d),
            None => (false, text.strip_prefix('+').unwrap_or(text)),
        };
        if digits.is_empty() || digits.len() > 4300 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        // Magnitude in base 256, little-endian.
        let mut mag: Vec<u8> = vec![0];
        for d in digits.bytes() {
            let mut carry = (d - b'0') as u32;
            for limb in mag.iter_mut() {
                let v = *limb as u32 * 10 + carry;
                *limb = v as u8;
                carry = v >> 8;
            }
            if carry > 0 {
                mag.push(carry as u8);
            }
        }
        mag.push(0); // room for the sign bit
        if negative {
            let mut carry = 1u16;
            for limb in mag.iter_mut() {
                let v = (!*limb) as u16 + carry;
                *limb = v as u8;
                carry = v >> 8;
            }
        }
        Ok(long_item(&mag))
    }
}

/// An int from two's-complement little-endian bytes: `Int` when it fits, else `BigInt`.
pub(crate) fn long_item(bytes: &[u8]) -> Item {
    let mut minimal = bytes.to_vec();
    minimal_twos_complement(&mut minimal);
    match decode_long_i64(&minimal) {
        Some(i) => Item::Int(i),
        None => Item::BigInt(minimal.into()),
    }
}

/// Python's `raw-unicode-escape` decoding: `\uXXXX` and `\UXXXXXXXX` escapes, every other
/// byte a Latin-1 character.
pub(crate) fn raw_unicode_escape(bytes: &[u8]) -> Option<String> {
    let mut out = String::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        let width = match (b, bytes.get(i + 1)) {
            (b'\\', Some(b'u')) => 4,
            (b'\\', Some(b'U')) => 8,
            _ => 0,
        };
        // An odd run of backslashes escapes; `\\u` is two characters.
        let preceding = bytes[..i].iter().rev().take_while(|&&c| c == b'\\').count();
        if width > 0 && preceding % 2 == 0 {
            let hex = bytes.get(i + 2..i + 2 + width)?;
            let code = u32::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?;
            out.push(char::from_u32(code)?);
            i += 2 + width;
        } else {
            out.push(b as char);
            i += 1;
        }
    }
    Some(out)
}
