//! Budgets of the unpickler and of gzip inflation, and the streamed, budgeted gunzip.

use std::io::Read;

use torch_arena::error::{Error, Result};

/// Objects created per input byte, at most: every opcode is at least one byte and creates at
/// most one object (a string, bytes, a container). The unpickler checks it; it bounds the heap to
/// about 32 bytes of objects and 16 bytes of handles per input byte.
pub const MAX_OBJECTS_PER_BYTE: usize = 1;

/// Largest inflated size accepted from any gzip stream, whatever its compressed size.
pub const MAX_DECOMPRESSED: u64 = 4 << 30;

/// Inflated bytes allowed per compressed byte. Real snapshots inflate 17–27× (the 142 shared
/// traces: at most 26.5×), our text traces about 5–10×; deflate's own limit is about 1032×, so a
/// stream beyond 64× is refused as a bomb.
pub const MAX_INFLATE_RATIO: u64 = 64;

/// Inflated bytes every gzip stream may use regardless of its size (small files, headers).
pub const MIN_INFLATE_ALLOWANCE: u64 = 8 << 20;

/// Bytes of inflated data read before the format must be recognisable.
pub const SNIFF_BYTES: usize = 4096;

/// The most bytes a gzip stream of `compressed` bytes may inflate to.
pub fn inflate_budget(compressed: u64) -> u64 {
    compressed
        .saturating_mul(MAX_INFLATE_RATIO)
        .saturating_add(MIN_INFLATE_ALLOWANCE)
        .min(MAX_DECOMPRESSED)
}

/// Counts the compressed bytes a decoder has consumed (for error positions).
struct Counting<R> {
    inner: R,
    read: std::rc::Rc<std::cell::Cell<u64>>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read.set(self.read.get() + n as u64);
        Ok(n)
    }
}

/// A gzip stream inflated under [`inflate_budget`]: reading past the budget is an error naming
/// the file and the compressed byte reached, so a bomb is refused after at most the budget of
/// inflated bytes has been produced (and nothing has to hold them).
pub struct Inflate<R: Read> {
    dec: flate2::read::MultiGzDecoder<Counting<R>>,
    at: std::rc::Rc<std::cell::Cell<u64>>,
    name: String,
    compressed: u64,
    budget: u64,
    out: u64,
}

impl<R: Read> Inflate<R> {
    /// Inflate `inner` (a gzip stream of `compressed` bytes); `name` is used in errors.
    pub fn new(name: &str, inner: R, compressed: u64) -> Self {
        let at = std::rc::Rc::new(std::cell::Cell::new(0));
        Inflate {
            dec: flate2::read::MultiGzDecoder::new(Counting {
                inner,
                read: at.clone(),
            }),
            at,
            name: name.to_string(),
            compressed,
            budget: inflate_budget(compressed),
            out: 0,
        }
    }

    /// Inflated bytes produced so far.
    pub fn inflated(&self) -> u64 {
        self.out
    }

    fn bomb(&self) -> String {
        format!(
            "{}: gzip stream inflates to more than {} bytes (reached at compressed byte {} of \
             {}): the budget is {MAX_INFLATE_RATIO}× the compressed size + {} MiB, at most {} \
             GiB; refusing it as a decompression bomb",
            self.name,
            self.budget,
            self.at.get(),
            self.compressed,
            MIN_INFLATE_ALLOWANCE >> 20,
            MAX_DECOMPRESSED >> 30
        )
    }
}

impl<R: Read> Read for Inflate<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.budget.saturating_sub(self.out);
        // Ask for one byte more than the budget allows, to tell "exactly at" from "beyond".
        let want = (buf.len() as u64).min(left + 1) as usize;
        let n = self.dec.read(&mut buf[..want]).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!(
                    "{}: corrupt gzip stream near compressed byte {} of {}: {e} (inflated {} \
                     bytes before the failure); expected a complete gzip file",
                    self.name,
                    self.at.get(),
                    self.compressed,
                    self.out
                ),
            )
        })?;
        if self.out + n as u64 > self.budget {
            return Err(std::io::Error::other(self.bomb()));
        }
        self.out += n as u64;
        Ok(n)
    }
}

/// `data` itself, or its inflated content if it starts with the gzip magic bytes (`1f 8b`),
/// inflated under [`inflate_budget`]. Errors name the file and the compressed byte reached.
pub fn gunzip_if_gzip(name: &str, data: Vec<u8>) -> Result<Vec<u8>> {
    if !data.starts_with(&[0x1f, 0x8b]) {
        return Ok(data);
    }
    let mut dec = Inflate::new(name, &data[..], data.len() as u64);
    let mut out = Vec::with_capacity(data.len().saturating_mul(8).min(64 << 20));
    match dec.read_to_end(&mut out) {
        Ok(_) => Ok(out),
        Err(e) => Err(Error::Trace(e.to_string())),
    }
}
