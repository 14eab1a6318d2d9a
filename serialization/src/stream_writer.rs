//! `PyTorchStreamWriter` (caffe2 `inline_container.cc` over miniz): the zip container of a
//! torch checkpoint, byte for byte as torch writes it. Every record is STORED under
//! `<archive>/`, its data aligned to 64 bytes by an `FB` extra field of `Z`s, followed by a data
//! descriptor (when it has data); the archive ends with `version`, `.data/serialization_id`, the central
//! directory and (always, as miniz's `WRITE_ZIP64` flag makes it) the zip64 end records.

use std::io::Write;

use crate::error::{Error, Result};
use crate::serialization_id::{hash_combine, serialization_id};

/// caffe2's `kFieldAlignment`.
const ALIGNMENT: u64 = 64;
/// `kMinProducedFileFormatVersion`: what `torch.save` writes in `version`.
const FILE_FORMAT_VERSION: u64 = 3;
const LOCAL_HEADER_SIZE: u64 = 30;
const U32_MAX: u64 = u32::MAX as u64;
/// General purpose flag bit 11: UTF-8 names.
const FLAG_UTF8: u16 = 0x0800;
/// General purpose flag bit 3: sizes and CRC follow the data in a data descriptor (miniz sets
/// it, and writes the descriptor, only for a record with data).
const FLAG_DESCRIPTOR: u16 = 0x0008;
const DATA_DESCRIPTOR_SIG: [u8; 4] = *b"PK\x07\x08";

/// One central directory entry.
struct Entry {
    name: String,
    flags: u16,
    crc: u32,
    size: u64,
    offset: u64,
}

/// Writes a torch zip checkpoint to `out`, tracking positions as miniz does.
pub(crate) struct StreamWriter<W: Write> {
    out: W,
    pos: u64,
    archive_name: String,
    entries: Vec<Entry>,
    /// Record names (without the archive folder), in the order written.
    written: Vec<String>,
    combined_crc: u64,
    /// Sizes / offsets at or above this get zip64 fields (miniz: `MZ_UINT32_MAX`); lowered
    /// only by tests, to exercise the zip64 layout on small data.
    zip64_threshold: u64,
}

impl<W: Write> StreamWriter<W> {
    pub fn new(out: W, archive_name: &str) -> Result<Self> {
        if archive_name.is_empty() {
            return Err(Error::Unwritable {
                problem: "invalid file name: the archive name (the file's stem) is empty".into(),
            });
        }
        Ok(Self {
            out,
            pos: 0,
            archive_name: archive_name.to_string(),
            entries: Vec::new(),
            written: Vec::new(),
            combined_crc: 0,
            zip64_threshold: U32_MAX,
        })
    }

    #[cfg(test)]
    pub fn with_zip64_threshold(mut self, threshold: u64) -> Self {
        self.zip64_threshold = threshold;
        self
    }

    /// One `m_pWrite` call: writes `bytes`; a write that starts with a data descriptor's
    /// signature feeds its CRC into the serialization id (as caffe2's `ostream_write_func`
    /// does, data that happens to start with those bytes included).
    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        if bytes.len() >= 8 && bytes[..4] == DATA_DESCRIPTOR_SIG {
            let crc = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
            self.combined_crc = hash_combine(self.combined_crc, crc as u64);
        }
        self.out.write_all(bytes).map_err(|e| Error::Io {
            path: self.archive_name.clone().into(),
            source: e,
        })?;
        self.pos += bytes.len() as u64;
        Ok(())
    }

    /// The zip64 extra field miniz adds when a size or offset reaches the threshold.
    fn zip64_extra(&self, size: u64, offset: u64) -> Vec<u8> {
        let mut fields = Vec::new();
        if size >= self.zip64_threshold {
            fields.extend(size.to_le_bytes()); // uncompressed
            fields.extend(size.to_le_bytes()); // compressed (stored)
        }
        if offset >= self.zip64_threshold {
            fields.extend(offset.to_le_bytes());
        }
        if fields.is_empty() {
            return fields;
        }
        let mut extra = vec![0x01, 0x00];
        extra.extend((fields.len() as u16).to_le_bytes());
        extra.extend(fields);
        extra
    }

    /// `writeRecord(name, data, size)`.
    pub fn write_record(&mut self, name: &str, data: &[u8]) -> Result<()> {
        if self.written.iter().any(|n| n == name) {
            return Err(Error::Unwritable {
                problem: format!("Tried to serialize file twice: {name}"),
            });
        }
        let full_name = format!("{}/{name}", self.archive_name);
        let name_len = u16::try_from(full_name.len()).map_err(|_| Error::Unwritable {
            problem: format!("record name too long: {full_name}"),
        })?;
        let size = data.len() as u64;
        let offset = self.pos;
        // detail::getPadding
        let mut start = offset + LOCAL_HEADER_SIZE + full_name.len() as u64 + 4;
        if size >= self.zip64_threshold || offset >= self.zip64_threshold {
            start += 4;
            if size >= self.zip64_threshold {
                start += 16;
            }
            if offset >= self.zip64_threshold {
                start += 8;
            }
        }
        let padding = (ALIGNMENT - start % ALIGNMENT) % ALIGNMENT;
        let mut fb = vec![b'F', b'B'];
        fb.extend((padding as u16).to_le_bytes());
        fb.resize(4 + padding as usize, b'Z');
        let zip64 = self.zip64_extra(size, offset);
        let flags = if data.is_empty() {
            FLAG_UTF8
        } else {
            FLAG_UTF8 | FLAG_DESCRIPTOR
        };

        let mut header = Vec::with_capacity(LOCAL_HEADER_SIZE as usize);
        header.extend(b"PK\x03\x04");
        header.extend(0u16.to_le_bytes()); // version needed (stored)
        header.extend(flags.to_le_bytes());
        header.extend(0u16.to_le_bytes()); // method: stored
        header.extend(0u16.to_le_bytes()); // time
        header.extend(0u16.to_le_bytes()); // date
        header.extend([0u8; 12]); // crc and sizes: in the data descriptor
        header.extend(name_len.to_le_bytes());
        header.extend(((zip64.len() + fb.len()) as u16).to_le_bytes());
        self.write(&header)?;
        self.write(full_name.as_bytes())?;
        if !zip64.is_empty() {
            self.write(&zip64)?;
        }
        self.write(&fb)?;
        let crc = crc32fast::hash(data);
        if !data.is_empty() {
            self.write(data)?;
            let mut descriptor = DATA_DESCRIPTOR_SIG.to_vec();
            descriptor.extend(crc.to_le_bytes());
            if zip64.is_empty() {
                descriptor.extend((size as u32).to_le_bytes());
                descriptor.extend((size as u32).to_le_bytes());
            } else {
                descriptor.extend(size.to_le_bytes());
                descriptor.extend(size.to_le_bytes());
            }
            self.write(&descriptor)?;
        }
        self.entries.push(Entry {
            name: full_name,
            flags,
            crc,
            size,
            offset,
        });
        self.written.push(name.to_string());
        Ok(())
    }

    /// `writeEndOfFile`: `version`, `.data/serialization_id`, the central directory and the
    /// end records. Returns the writer.
    pub fn finish(mut self) -> Result<W> {
        if !self
            .written
            .iter()
            .any(|n| n == "version" || n == ".data/version")
        {
            self.write_record("version", format!("{FILE_FORMAT_VERSION}\n").as_bytes())?;
        }
        if !self.written.iter().any(|n| n == "byteorder") {
            self.write_record("byteorder", b"little")?;
        }
        let names: Vec<&str> = self.written.iter().map(String::as_str).collect();
        let id = serialization_id(&names, self.combined_crc);
        self.write_record(".data/serialization_id", id.as_bytes())?;

        let mut central = Vec::new();
        for e in &self.entries {
            let zip64 = self.zip64_extra(e.size, e.offset);
            central.extend(b"PK\x01\x02");
            central.extend(0u16.to_le_bytes()); // version made by
            central.extend(0u16.to_le_bytes()); // version needed
            central.extend(e.flags.to_le_bytes());
            central.extend(0u16.to_le_bytes()); // method
            central.extend(0u16.to_le_bytes()); // time
            central.extend(0u16.to_le_bytes()); // date
            central.extend(e.crc.to_le_bytes());
            central.extend((e.size.min(U32_MAX) as u32).to_le_bytes());
            central.extend((e.size.min(U32_MAX) as u32).to_le_bytes());
            central.extend((e.name.len() as u16).to_le_bytes());
            central.extend((zip64.len() as u16).to_le_bytes());
            central.extend(0u16.to_le_bytes()); // comment length
            central.extend(0u16.to_le_bytes()); // disk
            central.extend(0u16.to_le_bytes()); // internal attributes
            central.extend(0u32.to_le_bytes()); // external attributes
            central.extend((e.offset.min(U32_MAX) as u32).to_le_bytes());
            central.extend(e.name.as_bytes());
            central.extend(zip64);
        }
        let count = self.entries.len() as u64;
        let central_offset = self.pos;
        let central_size = central.len() as u64;
        self.write(&central)?;

        let zip64_end_offset = self.pos;
        let mut end = Vec::new();
        end.extend(b"PK\x06\x06");
        end.extend(44u64.to_le_bytes());
        end.extend(0x031eu16.to_le_bytes()); // version made by
        end.extend(0x002du16.to_le_bytes()); // version needed
        end.extend(0u32.to_le_bytes());
        end.extend(0u32.to_le_bytes());
        end.extend(count.to_le_bytes());
        end.extend(count.to_le_bytes());
        end.extend(central_size.to_le_bytes());
        end.extend(central_offset.to_le_bytes());
        self.write(&end)?;

        let mut locator = Vec::new();
        locator.extend(b"PK\x06\x07");
        locator.extend(0u32.to_le_bytes());
        locator.extend(zip64_end_offset.to_le_bytes());
        locator.extend(1u32.to_le_bytes());
        self.write(&locator)?;

        let mut eocd = Vec::new();
        eocd.extend(b"PK\x05\x06");
        eocd.extend(0u16.to_le_bytes());
        eocd.extend(0u16.to_le_bytes());
        eocd.extend((count.min(u16::MAX as u64) as u16).to_le_bytes());
        eocd.extend((count.min(u16::MAX as u64) as u16).to_le_bytes());
        eocd.extend((central_size.min(U32_MAX) as u32).to_le_bytes());
        eocd.extend((central_offset.min(U32_MAX) as u32).to_le_bytes());
        eocd.extend(0u16.to_le_bytes());
        self.write(&eocd)?;
        self.out.flush().map_err(|e| Error::Io {
            path: self.archive_name.clone().into(),
            source: e,
        })?;
        Ok(self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::torch_file::TorchFile;

    /// The zip64 layout (extra fields in the local and central headers, 64-bit data
    /// descriptors) that torch writes past 4 GiB, exercised on small data by lowering the
    /// threshold: a zip reader still finds every record.
    #[test]
    fn zip64_records_read_back() {
        let big = vec![7u8; 300];
        let mut w = StreamWriter::new(Vec::new(), "archive")
            .unwrap()
            .with_zip64_threshold(100);
        w.write_record("data.pkl", b"\x80\x02N.").unwrap();
        w.write_record("data/0", &big).unwrap();
        w.write_record("small", b"x").unwrap();
        let bytes = w.finish().unwrap();
        let mut file = TorchFile::from_bytes(bytes.clone(), "zip64.pt").unwrap();
        assert_eq!(file.record("data/0").unwrap(), Some(big));
        assert_eq!(file.record("small").unwrap().as_deref(), Some(&b"x"[..]));
        assert_eq!(
            file.record("version").unwrap().as_deref(),
            Some(&b"3\n"[..])
        );
        // Every record's data starts on a 64-byte boundary.
        for name in file.record_names() {
            let data = file.record(&name).unwrap().unwrap();
            if data.len() >= 8 {
                let at = bytes.windows(data.len()).position(|w| w == data).unwrap();
                assert_eq!(at % 64, 0, "{name}");
            }
        }
    }
}
