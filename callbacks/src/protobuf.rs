//! A minimal protobuf encoder: the wire types the hand-encoded messages of the loggers need
//! (TensorBoard's `Event`, W&B's `Record`).

/// A message being encoded; `.0` is its bytes.
#[derive(Default)]
pub(crate) struct Proto(pub(crate) Vec<u8>);

impl Proto {
    pub(crate) fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }
    pub(crate) fn key(&mut self, field: u32, wire: u8) {
        self.varint(((field as u64) << 3) | wire as u64);
    }
    pub(crate) fn int(&mut self, field: u32, v: i64) {
        self.key(field, 0);
        self.varint(v as u64);
    }
    pub(crate) fn bool(&mut self, field: u32, v: bool) {
        self.int(field, i64::from(v));
    }
    pub(crate) fn double(&mut self, field: u32, v: f64) {
        self.key(field, 1);
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn float(&mut self, field: u32, v: f32) {
        self.key(field, 5);
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn bytes(&mut self, field: u32, v: &[u8]) {
        self.key(field, 2);
        self.varint(v.len() as u64);
        self.0.extend_from_slice(v);
    }
    pub(crate) fn string(&mut self, field: u32, v: &str) {
        self.bytes(field, v.as_bytes());
    }
    /// An embedded message (`Proto`'s bytes), written even when empty (a set sub-message).
    pub(crate) fn message(&mut self, field: u32, m: &Proto) {
        self.bytes(field, &m.0);
    }
}
