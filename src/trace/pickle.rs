//! A restricted unpickler for PyTorch memory snapshots, in safe Rust.
//!
//! It reads pickle protocols 0–5 as far as they encode plain data (none, booleans, integers,
//! floats, strings, bytes, lists, tuples, dicts) and nothing else: the only global it accepts is
//! `collections.OrderedDict`, and only called (`REDUCE` with an empty argument tuple, or `NEWOBJ`)
//! to build an empty dict that then receives its items by `SETITEM(S)`. Every other global,
//! persistent id, extension code or instance opcode is refused with an error naming the file, the
//! byte offset, the opcode and the global. Nothing a pickle says is ever executed: the reader only
//! builds plain values.
//!
//! **CPython's memo semantics.** Values live in one object arena ([`Pickle`]); the stack, the memo
//! and containers hold handles into it, so a memoized list is *the same* list wherever `GET`
//! brings it back, and `APPEND` to it changes it in place, as in CPython. Nothing is copied per
//! `DUP`, `GET` or `APPEND`. The memo stores whatever is on top of the stack, the
//! `OrderedDict` global included (CPython memoizes it and refers back to it with `BINGET`). The
//! memo is a map, so an index of 100 M costs one entry, not 100 M slots.
//!
//! **Budgets** (`ARCHITECTURE.md`, "Parser budgets"): every opcode creates at most one object and
//! pushes at most one handle, so objects, stack slots, container items and memo entries are each
//! at most the number of input bytes, and the work is linear in the input ([`MAX_OBJECTS_PER_BYTE`]).
//! Decoded text is at most twice its encoded bytes. Integers beyond 64 bits are kept as a
//! [`Value::is_big_int`] marker, which is an error only where a reader needs the number.
//! Inflated gzip data is bounded by [`inflate_budget`].

use std::collections::HashMap;
use std::io::Read;

use crate::error::{Error, Result};

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

/// A handle: a scalar inline, or an object in the arena.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Val {
    None,
    Bool(bool),
    Int(i64),
    /// An integer in `i64::MAX + 1 ..= u64::MAX` (a 64-bit stream handle or address).
    U64(u64),
    /// An integer beyond 64 bits; only its sign is kept.
    Big(bool),
    Float(f64),
    Obj(u32),
}

#[derive(Debug)]
enum Obj {
    Str(Box<str>),
    Bytes(Box<[u8]>),
    List(Vec<Val>),
    Tuple(Box<[Val]>),
    Dict(Vec<(Val, Val)>),
    /// The `collections.OrderedDict` global: a value only REDUCE / NEWOBJ may call.
    OrderedDictClass,
}

/// Dicts with more items than this get a hash index by string key after loading, so a lookup
/// never scans a long (possibly hostile) dict.
const INDEX_DICTS_ABOVE: usize = 16;

/// An unpickled file: an arena of objects and its root value.
pub struct Pickle {
    objs: Vec<Obj>,
    root: Val,
    /// Dict object → (string key → value of its last occurrence), for long dicts.
    index: HashMap<u32, HashMap<Box<str>, Val>>,
    input_len: usize,
}

impl std::fmt::Debug for Pickle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pickle({})", self.root().repr())
    }
}

impl Pickle {
    /// The value the pickle's `STOP` returned.
    pub fn root(&self) -> Value<'_> {
        Value {
            p: self,
            v: self.root,
        }
    }

    /// Bytes of the (decompressed) input it was read from: readers bound the work of walking
    /// shared data by it.
    pub fn input_len(&self) -> usize {
        self.input_len
    }

    /// Objects in the arena (strings, bytes, containers).
    pub fn objects(&self) -> usize {
        self.objs.len()
    }

    fn build_index(&mut self) {
        for (i, o) in self.objs.iter().enumerate() {
            if let Obj::Dict(items) = o
                && items.len() > INDEX_DICTS_ABOVE
            {
                let mut m = HashMap::new();
                for (k, v) in items {
                    if let Val::Obj(k) = k
                        && let Some(Obj::Str(s)) = self.objs.get(*k as usize)
                    {
                        m.insert(s.clone(), *v);
                    }
                }
                self.index.insert(i as u32, m);
            }
        }
    }
}

/// A plain Python value read from a pickle: a view into its [`Pickle`]. Copy it freely.
#[derive(Clone, Copy)]
pub struct Value<'a> {
    p: &'a Pickle,
    v: Val,
}

impl std::fmt::Debug for Value<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.repr())
    }
}

/// The items of a list or a tuple.
#[derive(Clone, Copy)]
pub struct Seq<'a> {
    p: &'a Pickle,
    items: &'a [Val],
}

impl<'a> Seq<'a> {
    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn get(&self, i: usize) -> Option<Value<'a>> {
        self.items.get(i).map(|&v| Value { p: self.p, v })
    }

    pub fn first(&self) -> Option<Value<'a>> {
        self.get(0)
    }

    pub fn iter(&self) -> impl ExactSizeIterator<Item = Value<'a>> + 'a {
        let p = self.p;
        self.items.iter().map(move |&v| Value { p, v })
    }
}

impl<'a> Value<'a> {
    /// The file this value was read from.
    pub fn pickle(&self) -> &'a Pickle {
        self.p
    }

    fn obj(&self) -> Option<&'a Obj> {
        match self.v {
            Val::Obj(i) => self.p.objs.get(i as usize),
            _ => None,
        }
    }

    /// The value of `key` in a dict with string keys (`None` if `self` is not a dict or the key
    /// is absent; a repeated key gives its last value, as in Python).
    pub fn get(&self, key: &str) -> Option<Value<'a>> {
        let Val::Obj(id) = self.v else { return None };
        let Some(Obj::Dict(items)) = self.p.objs.get(id as usize) else {
            return None;
        };
        let p = self.p;
        if let Some(m) = p.index.get(&id) {
            return m.get(key).map(|&v| Value { p, v });
        }
        items.iter().rev().find_map(|&(k, v)| match k {
            Val::Obj(k) => match p.objs.get(k as usize) {
                Some(Obj::Str(s)) if &**s == key => Some(Value { p, v }),
                _ => None,
            },
            _ => None,
        })
    }

    /// The integer, if this is one that fits `i64` (`bool` counts as 0/1, as in Python).
    pub fn as_int(self) -> Option<i64> {
        match self.v {
            Val::Int(i) => Some(i),
            Val::Bool(b) => Some(b as i64),
            _ => None,
        }
    }

    /// The integer as 64 bits, if it has a 64-bit representation: non-negative values up to
    /// `u64::MAX`, negative ones as their two's complement (a stream `-1` is `u64::MAX`).
    pub fn as_u64_bits(self) -> Option<u64> {
        match self.v {
            Val::U64(u) => Some(u),
            _ => self.as_int().map(|i| i as u64),
        }
    }

    /// The integer if it is in `0..=u64::MAX`.
    pub fn as_u64(self) -> Option<u64> {
        match self.v {
            Val::U64(u) => Some(u),
            _ => self.as_int().and_then(|i| u64::try_from(i).ok()),
        }
    }

    /// The number as `f64`, if this is an int or a float.
    pub fn as_f64(self) -> Option<f64> {
        match self.v {
            Val::Int(i) => Some(i as f64),
            Val::U64(u) => Some(u as f64),
            Val::Float(f) => Some(f),
            Val::Bool(b) => Some(b as i64 as f64),
            _ => None,
        }
    }

    /// The text, if this is a string.
    pub fn as_str(self) -> Option<&'a str> {
        match self.obj() {
            Some(Obj::Str(s)) => Some(s),
            _ => None,
        }
    }

    /// The bytes, if this is `bytes` or `bytearray`.
    pub fn as_bytes(self) -> Option<&'a [u8]> {
        match self.obj() {
            Some(Obj::Bytes(b)) => Some(b),
            _ => None,
        }
    }

    /// The items, if this is a list or a tuple.
    pub fn as_seq(self) -> Option<Seq<'a>> {
        let items: &'a [Val] = match self.obj() {
            Some(Obj::List(v)) => v,
            Some(Obj::Tuple(v)) => v,
            _ => return None,
        };
        Some(Seq { p: self.p, items })
    }

    /// The items, if this is a dict, in pickle order (repeated keys included).
    pub fn as_dict(self) -> Option<impl ExactSizeIterator<Item = (Value<'a>, Value<'a>)> + 'a> {
        let p = self.p;
        match self.obj() {
            Some(Obj::Dict(d)) => Some(
                d.iter()
                    .map(move |&(k, v)| (Value { p, v: k }, Value { p, v })),
            ),
            _ => None,
        }
    }

    pub fn is_none(&self) -> bool {
        self.v == Val::None
    }

    pub fn is_dict(&self) -> bool {
        matches!(self.obj(), Some(Obj::Dict(_)))
    }

    pub fn is_list(&self) -> bool {
        matches!(self.obj(), Some(Obj::List(_)))
    }

    /// An integer beyond 64 bits (kept as a marker: no reader needs its value).
    pub fn is_big_int(&self) -> bool {
        matches!(self.v, Val::Big(_))
    }

    /// A short name of the Python type, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self.v {
            Val::None => "None",
            Val::Bool(_) => "bool",
            Val::Int(_) | Val::U64(_) => "int",
            Val::Big(_) => "int beyond 64 bits",
            Val::Float(_) => "float",
            Val::Obj(_) => match self.obj() {
                Some(Obj::Str(_)) => "str",
                Some(Obj::Bytes(_)) => "bytes",
                Some(Obj::List(_)) => "list",
                Some(Obj::Tuple(_)) => "tuple",
                Some(Obj::Dict(_)) => "dict",
                Some(Obj::OrderedDictClass) => "class collections.OrderedDict",
                None => "?",
            },
        }
    }

    /// Python-like text of the value, for tests and messages: nested at most 32 deep and about
    /// 4,000 characters long (shared and recursive data print as `...` past either limit).
    pub fn repr(&self) -> String {
        let mut s = String::new();
        self.repr_into(&mut s, 0);
        s
    }

    fn repr_into(&self, s: &mut String, depth: u32) {
        use std::fmt::Write;
        if depth > 32 || s.len() > 4000 {
            s.push_str("...");
            return;
        }
        let p = self.p;
        let sub = |v: Val, s: &mut String| Value { p, v }.repr_into(s, depth + 1);
        match self.v {
            Val::None => s.push_str("None"),
            Val::Bool(b) => s.push_str(if b { "True" } else { "False" }),
            Val::Int(i) => {
                let _ = write!(s, "{i}");
            }
            Val::U64(u) => {
                let _ = write!(s, "{u}");
            }
            Val::Big(neg) => s.push_str(if neg { "-<big int>" } else { "<big int>" }),
            Val::Float(f) => {
                let _ = write!(s, "{f:?}");
            }
            Val::Obj(_) => match self.obj() {
                Some(Obj::Str(x)) => {
                    let _ = write!(s, "{x:?}");
                }
                Some(Obj::Bytes(b)) => {
                    let _ = write!(s, "b{:?}", String::from_utf8_lossy(b));
                }
                Some(o @ (Obj::List(_) | Obj::Tuple(_))) => {
                    let (tuple, items): (bool, &[Val]) = match o {
                        Obj::Tuple(t) => (true, t),
                        Obj::List(l) => (false, l),
                        _ => (false, &[]),
                    };
                    s.push(if tuple { '(' } else { '[' });
                    for (i, &v) in items.iter().enumerate() {
                        if i > 0 {
                            s.push_str(", ");
                        }
                        sub(v, s);
                    }
                    if tuple && items.len() == 1 {
                        s.push(',');
                    }
                    s.push(if tuple { ')' } else { ']' });
                }
                Some(Obj::Dict(items)) => {
                    s.push('{');
                    for (i, &(k, v)) in items.iter().enumerate() {
                        if i > 0 {
                            s.push_str(", ");
                        }
                        sub(k, s);
                        s.push_str(": ");
                        sub(v, s);
                    }
                    s.push('}');
                }
                Some(Obj::OrderedDictClass) => s.push_str("<class 'collections.OrderedDict'>"),
                None => s.push('?'),
            },
        }
    }
}

const ALLOWED: &str = "snapshots contain only plain data (dicts, lists, tuples, strings, numbers, \
                       collections.OrderedDict)";

/// Unpickle `data` (already decompressed). `name` names the source in errors.
pub fn loads(name: &str, data: &[u8]) -> Result<Pickle> {
    Unpickler::new(name, data).run()
}

fn op_name(op: u8) -> &'static str {
    match op {
        b'(' => "MARK",
        b'.' => "STOP",
        b'0' => "POP",
        b'1' => "POP_MARK",
        b'2' => "DUP",
        b'F' => "FLOAT",
        b'I' => "INT",
        b'J' => "BININT",
        b'K' => "BININT1",
        b'L' => "LONG",
        b'M' => "BININT2",
        b'N' => "NONE",
        b'P' => "PERSID",
        b'Q' => "BINPERSID",
        b'R' => "REDUCE",
        b'S' => "STRING",
        b'T' => "BINSTRING",
        b'U' => "SHORT_BINSTRING",
        b'V' => "UNICODE",
        b'X' => "BINUNICODE",
        b'a' => "APPEND",
        b'b' => "BUILD",
        b'c' => "GLOBAL",
        b'd' => "DICT",
        b'}' => "EMPTY_DICT",
        b'e' => "APPENDS",
        b'g' => "GET",
        b'h' => "BINGET",
        b'i' => "INST",
        b'j' => "LONG_BINGET",
        b'l' => "LIST",
        b']' => "EMPTY_LIST",
        b'o' => "OBJ",
        b'p' => "PUT",
        b'q' => "BINPUT",
        b'r' => "LONG_BINPUT",
        b's' => "SETITEM",
        b't' => "TUPLE",
        b')' => "EMPTY_TUPLE",
        b'u' => "SETITEMS",
        b'G' => "BINFLOAT",
        0x80 => "PROTO",
        0x81 => "NEWOBJ",
        0x82 => "EXT1",
        0x83 => "EXT2",
        0x84 => "EXT4",
        0x85 => "TUPLE1",
        0x86 => "TUPLE2",
        0x87 => "TUPLE3",
        0x88 => "NEWTRUE",
        0x89 => "NEWFALSE",
        0x8a => "LONG1",
        0x8b => "LONG4",
        b'B' => "BINBYTES",
        b'C' => "SHORT_BINBYTES",
        0x8c => "SHORT_BINUNICODE",
        0x8d => "BINUNICODE8",
        0x8e => "BINBYTES8",
        0x8f => "EMPTY_SET",
        0x90 => "ADDITEMS",
        0x91 => "FROZENSET",
        0x92 => "NEWOBJ_EX",
        0x93 => "STACK_GLOBAL",
        0x94 => "MEMOIZE",
        0x95 => "FRAME",
        0x96 => "BYTEARRAY8",
        0x97 => "NEXT_BUFFER",
        0x98 => "READONLY_BUFFER",
        _ => "unknown",
    }
}

struct Unpickler<'a> {
    name: &'a str,
    data: &'a [u8],
    pos: usize,
    /// Offset of the opcode being executed, for errors.
    op_at: usize,
    op: u8,
    objs: Vec<Obj>,
    stack: Vec<Val>,
    marks: Vec<usize>,
    /// CPython's memo: index → what was on top of the stack (shared, never copied).
    memo: HashMap<u64, Val>,
}

impl<'a> Unpickler<'a> {
    fn new(name: &'a str, data: &'a [u8]) -> Self {
        Unpickler {
            name,
            data,
            pos: 0,
            op_at: 0,
            op: 0,
            objs: Vec::new(),
            stack: Vec::with_capacity(64),
            marks: Vec::with_capacity(16),
            memo: HashMap::new(),
        }
    }

    fn err(&self, what: impl std::fmt::Display) -> Error {
        Error::Trace(format!(
            "{}: bad pickle at byte {} (opcode {} 0x{:02x}): {what}",
            self.name,
            self.op_at,
            op_name(self.op),
            self.op
        ))
    }

    fn truncated(&self, need: usize) -> Error {
        Error::Trace(format!(
            "{}: pickle truncated at byte {}: opcode {} at byte {} needs {need} more bytes, the \
             input ends after {} bytes",
            self.name,
            self.data.len(),
            op_name(self.op),
            self.op_at,
            self.data.len()
        ))
    }

    fn refuse_global(&self, module: &str, gname: &str) -> Error {
        Error::Trace(format!(
            "refusing to load global '{module}.{gname}' (opcode {}) at byte {} of {}: {ALLOWED}",
            op_name(self.op),
            self.op_at,
            self.name
        ))
    }

    fn refuse(&self, what: &str) -> Error {
        Error::Trace(format!(
            "refusing opcode {} ({what}) at byte {} of {}: {ALLOWED}",
            op_name(self.op),
            self.op_at,
            self.name
        ))
    }

    #[inline]
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let rest = self.data.len() - self.pos;
        if n > rest {
            return Err(self.truncated(n - rest));
        }
        let s = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    #[inline]
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes(b.try_into().unwrap_or([0; 4])))
    }

    fn u64(&mut self) -> Result<u64> {
        let b = self.take(8)?;
        Ok(u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
    }

    /// A length read from the input, refused if more than what is left.
    fn len_arg(&mut self, n: u64) -> Result<usize> {
        let rest = (self.data.len() - self.pos) as u64;
        if n > rest {
            return Err(if n > rest + (1 << 20) {
                self.err(format!(
                    "length {n} is more than the {rest} bytes left in the input (absurd length: \
                     corrupt file?)"
                ))
            } else {
                self.truncated((n - rest) as usize)
            });
        }
        Ok(n as usize)
    }

    /// A text line (protocol 0 arguments), without its `\n`.
    fn line(&mut self) -> Result<&'a [u8]> {
        let rest = &self.data[self.pos..];
        match rest.iter().position(|&b| b == b'\n') {
            Some(i) => {
                self.pos += i + 1;
                Ok(&rest[..i])
            }
            None => Err(self.truncated(1)),
        }
    }

    fn line_str(&mut self) -> Result<&'a str> {
        let l = self.line()?;
        std::str::from_utf8(l).map_err(|_| self.err("argument line is not UTF-8"))
    }

    /// A new object in the arena (at most one per opcode: see [`MAX_OBJECTS_PER_BYTE`]).
    fn new_obj(&mut self, o: Obj) -> Result<Val> {
        if self.objs.len() >= self.data.len() * MAX_OBJECTS_PER_BYTE
            || self.objs.len() >= u32::MAX as usize
        {
            return Err(self.err(format!(
                "more objects than the {} input bytes can hold (budget: {MAX_OBJECTS_PER_BYTE} \
                 per byte)",
                self.data.len()
            )));
        }
        self.objs.push(o);
        Ok(Val::Obj((self.objs.len() - 1) as u32))
    }

    fn push_obj(&mut self, o: Obj) -> Result<()> {
        let v = self.new_obj(o)?;
        self.stack.push(v);
        Ok(())
    }

    fn floor(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    fn pop(&mut self) -> Result<Val> {
        if self.stack.len() <= self.floor() {
            return Err(self.err("stack underflow"));
        }
        Ok(self.stack.pop().unwrap_or(Val::None))
    }

    /// Pop everything down to the last mark, and the mark.
    fn pop_mark(&mut self) -> Result<Vec<Val>> {
        let m = self
            .marks
            .pop()
            .ok_or_else(|| self.err("no MARK on the stack"))?;
        let items = self.stack.split_off(m.min(self.stack.len()));
        if self.stack.capacity() > 1 << 16 && self.stack.len() < self.stack.capacity() / 4 {
            // A long MARK frame is now a container of its own: give its stack room back.
            self.stack.shrink_to(self.stack.len() * 2);
        }
        Ok(items)
    }

    /// The top of the stack, which must be at or above the current mark.
    fn top(&self) -> Result<Val> {
        if self.stack.len() <= self.floor() {
            return Err(self.err("stack underflow"));
        }
        Ok(self.stack[self.stack.len() - 1])
    }

    fn type_of(&self, v: Val) -> &'static str {
        let p = Pickle {
            objs: Vec::new(),
            root: Val::None,
            index: HashMap::new(),
            input_len: 0,
        };
        match v {
            Val::Obj(i) => match self.objs.get(i as usize) {
                Some(Obj::Str(_)) => "str",
                Some(Obj::Bytes(_)) => "bytes",
                Some(Obj::List(_)) => "list",
                Some(Obj::Tuple(_)) => "tuple",
                Some(Obj::Dict(_)) => "dict",
                Some(Obj::OrderedDictClass) => "class collections.OrderedDict",
                None => "?",
            },
            v => Value { p: &p, v }.type_name(),
        }
    }

    /// The list object under the top of the stack (after popping what goes into it).
    fn append_items(&mut self, items: Vec<Val>) -> Result<()> {
        let top = self.top()?;
        if let Val::Obj(i) = top
            && let Some(Obj::List(l)) = self.objs.get_mut(i as usize)
        {
            if l.is_empty() {
                // The usual `EMPTY_LIST MARK ... APPENDS`: take the items' buffer, no copy.
                *l = items;
            } else {
                l.extend(items);
            }
            return Ok(());
        }
        let t = self.type_of(top);
        Err(self.err(format!("append to a {t}, not a list")))
    }

    fn set_items(&mut self, items: Vec<Val>) -> Result<()> {
        if !items.len().is_multiple_of(2) {
            return Err(self.err("odd number of items for a dict"));
        }
        let top = self.top()?;
        if let Val::Obj(i) = top
            && let Some(Obj::Dict(d)) = self.objs.get_mut(i as usize)
        {
            // Repeated keys are kept (checking would cost O(n²) on hostile input); `get`
            // returns the last one, as Python's dict would hold it.
            d.reserve(items.len() / 2);
            let mut it = items.into_iter();
            while let (Some(k), Some(v)) = (it.next(), it.next()) {
                d.push((k, v));
            }
            return Ok(());
        }
        let t = self.type_of(top);
        Err(self.err(format!("set item on a {t}, not a dict")))
    }

    fn memo_index(&mut self, l: &str) -> Result<u64> {
        l.trim()
            .parse::<u64>()
            .map_err(|_| self.err(format!("'{l}' is not a memo index")))
    }

    /// PUT: the memo keeps what is on top of the stack, as CPython's does (any object, the
    /// `OrderedDict` global included); the map holds one entry per PUT, whatever the index.
    fn memo_put(&mut self, idx: u64) -> Result<()> {
        let v = self
            .top()
            .map_err(|_| self.err("memoize with an empty stack"))?;
        self.memo.insert(idx, v);
        Ok(())
    }

    fn memo_get(&mut self, idx: u64) -> Result<()> {
        match self.memo.get(&idx) {
            Some(&v) => {
                self.stack.push(v);
                Ok(())
            }
            None => Err(self.err(format!("memo entry {idx} was never stored"))),
        }
    }

    fn global(&mut self, module: &str, gname: &str) -> Result<()> {
        if module == "collections" && gname == "OrderedDict" {
            self.push_obj(Obj::OrderedDictClass)
        } else {
            Err(self.refuse_global(module, gname))
        }
    }

    /// REDUCE / NEWOBJ: only `OrderedDict()` with no arguments.
    fn call_class(&mut self) -> Result<()> {
        let args = self.pop()?;
        let cls = self.pop()?;
        let is_class = matches!(cls, Val::Obj(i) if matches!(self.objs.get(i as usize), Some(Obj::OrderedDictClass)));
        let empty_args = matches!(args, Val::Obj(i) if matches!(self.objs.get(i as usize), Some(Obj::Tuple(t)) if t.is_empty()));
        match (is_class, empty_args) {
            (true, true) => self.push_obj(Obj::Dict(Vec::new())),
            (true, false) => {
                Err(self
                    .err("collections.OrderedDict may only be called with an empty argument tuple"))
            }
            (false, _) => {
                let t = self.type_of(cls);
                Err(self.refuse(&format!("calling a {t}")))
            }
        }
    }

    /// Text integers (INT, LONG): beyond 64 bits they become a big-int marker.
    fn int_line(&mut self, long: bool) -> Result<Val> {
        let l = self.line_str()?;
        let mut t = l.trim();
        if long {
            t = t.strip_suffix('L').unwrap_or(t);
        }
        if !long {
            if t == "00" {
                return Ok(Val::Bool(false));
            }
            if t == "01" {
                return Ok(Val::Bool(true));
            }
        }
        if let Ok(i) = t.parse::<i64>() {
            return Ok(Val::Int(i));
        }
        if let Ok(u) = t.parse::<u64>() {
            return Ok(Val::U64(u));
        }
        let digits = t.strip_prefix(['-', '+']).unwrap_or(t);
        if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
            return Ok(Val::Big(t.starts_with('-')));
        }
        Err(self.err(format!("'{t}' is not an integer")))
    }

    /// LONG1 / LONG4: little-endian two's complement, any length.
    fn long_bytes(b: &[u8]) -> Val {
        if b.is_empty() {
            return Val::Int(0);
        }
        let neg = b[b.len() - 1] & 0x80 != 0;
        let fill = if neg { 0xff } else { 0 };
        // Significant bytes: drop the sign-extension tail.
        let mut n = b.len();
        while n > 1 && b[n - 1] == fill && (b[n - 2] & 0x80 != 0) == neg {
            n -= 1;
        }
        if n <= 8 {
            let mut buf = [fill; 8];
            buf[..n].copy_from_slice(&b[..n]);
            return Val::Int(i64::from_le_bytes(buf));
        }
        if n == 9 && !neg && b[8] == 0 {
            let mut buf = [0; 8];
            buf.copy_from_slice(&b[..8]);
            return Val::U64(u64::from_le_bytes(buf));
        }
        Val::Big(neg)
    }

    fn str_value(&mut self, b: &[u8]) -> Result<()> {
        match std::str::from_utf8(b) {
            Ok(s) => self.push_obj(Obj::Str(Box::from(s))),
            Err(e) => Err(self.err(format!("string is not valid UTF-8 ({e})"))),
        }
    }

    /// Python 2 `str` (BINSTRING, STRING): decoded as Latin-1 when not UTF-8.
    fn legacy_str(&mut self, b: &[u8]) -> Result<()> {
        let s: Box<str> = match std::str::from_utf8(b) {
            Ok(s) => Box::from(s),
            Err(_) => b.iter().map(|&c| c as char).collect::<String>().into(),
        };
        self.push_obj(Obj::Str(s))
    }

    fn run(mut self) -> Result<Pickle> {
        loop {
            if self.pos >= self.data.len() {
                self.op_at = self.pos;
                return Err(Error::Trace(format!(
                    "{}: pickle truncated at byte {}: the input ends before the STOP opcode",
                    self.name, self.pos
                )));
            }
            self.op_at = self.pos;
            self.op = self.data[self.pos];
            self.pos += 1;
            match self.op {
                0x80 => {
                    let p = self.u8()?;
                    if p > 5 {
                        return Err(
                            self.err(format!("pickle protocol {p} is not supported (0 to 5 are)"))
                        );
                    }
                }
                0x95 => {
                    let n = self.u64()?;
                    self.len_arg(n)?;
                }
                b'.' => {
                    let v = self.pop()?;
                    if !self.stack.is_empty() || !self.marks.is_empty() {
                        return Err(self.err("values left on the stack at STOP"));
                    }
                    if matches!(v, Val::Obj(i) if matches!(self.objs.get(i as usize), Some(Obj::OrderedDictClass)))
                    {
                        return Err(self.err(
                            "the pickle is the class collections.OrderedDict itself, not data",
                        ));
                    }
                    let mut p = Pickle {
                        objs: self.objs,
                        root: v,
                        index: HashMap::new(),
                        input_len: self.data.len(),
                    };
                    p.build_index();
                    return Ok(p);
                }
                b'(' => self.marks.push(self.stack.len()),
                b'0' => {
                    if self.marks.last() == Some(&self.stack.len()) {
                        // POP of an empty mark frame discards the mark, as CPython does.
                        self.marks.pop();
                    } else {
                        self.pop()?;
                    }
                }
                b'1' => {
                    self.pop_mark()?;
                }
                b'2' => {
                    let top = self.top()?;
                    self.stack.push(top);
                }
                b'F' => {
                    let l = self.line_str()?;
                    let f = l
                        .trim()
                        .parse::<f64>()
                        .map_err(|_| self.err(format!("'{l}' is not a float")))?;
                    self.stack.push(Val::Float(f));
                }
                b'I' => {
                    let v = self.int_line(false)?;
                    self.stack.push(v);
                }
                b'L' => {
                    let v = self.int_line(true)?;
                    self.stack.push(v);
                }
                b'J' => {
                    let v = self.u32()? as i32;
                    self.stack.push(Val::Int(v as i64));
                }
                b'K' => {
                    let v = self.u8()?;
                    self.stack.push(Val::Int(v as i64));
                }
                b'M' => {
                    let v = self.u16()?;
                    self.stack.push(Val::Int(v as i64));
                }
                0x8a => {
                    let n = self.u8()? as u64;
                    let n = self.len_arg(n)?;
                    let b = self.take(n)?;
                    self.stack.push(Self::long_bytes(b));
                }
                0x8b => {
                    let n = self.u32()? as i32;
                    if n < 0 {
                        return Err(self.err("negative LONG4 length"));
                    }
                    let n = self.len_arg(n as u64)?;
                    let b = self.take(n)?;
                    self.stack.push(Self::long_bytes(b));
                }
                b'G' => {
                    let b = self.take(8)?;
                    let f = f64::from_be_bytes(b.try_into().unwrap_or([0; 8]));
                    self.stack.push(Val::Float(f));
                }
                b'N' => self.stack.push(Val::None),
                0x88 => self.stack.push(Val::Bool(true)),
                0x89 => self.stack.push(Val::Bool(false)),
                0x8c | b'X' | 0x8d => {
                    let n = match self.op {
                        0x8c => self.u8()? as u64,
                        b'X' => self.u32()? as u64,
                        _ => self.u64()?,
                    };
                    let n = self.len_arg(n)?;
                    let b = self.take(n)?;
                    self.str_value(b)?;
                }
                b'V' => {
                    let l = self.line()?;
                    let s = decode_raw_unicode_escape(l).ok_or_else(|| {
                        self.err("bad raw-unicode-escape sequence in UNICODE argument")
                    })?;
                    self.push_obj(Obj::Str(s.into()))?;
                }
                b'S' => {
                    let l = self.line()?;
                    let s = decode_string_repr(l).ok_or_else(|| {
                        self.err("STRING argument is not a quoted Python string literal")
                    })?;
                    self.legacy_str(&s)?;
                }
                b'T' => {
                    let n = self.u32()? as i32;
                    if n < 0 {
                        return Err(self.err("negative BINSTRING length"));
                    }
                    let n = self.len_arg(n as u64)?;
                    let b = self.take(n)?;
                    self.legacy_str(b)?;
                }
                b'U' => {
                    let n = self.u8()? as u64;
                    let n = self.len_arg(n)?;
                    let b = self.take(n)?;
                    self.legacy_str(b)?;
                }
                b'B' | b'C' | 0x8e | 0x96 => {
                    let n = match self.op {
                        b'B' => self.u32()? as u64,
                        b'C' => self.u8()? as u64,
                        _ => self.u64()?,
                    };
                    let n = self.len_arg(n)?;
                    let b = self.take(n)?;
                    self.push_obj(Obj::Bytes(Box::from(b)))?;
                }
                b']' => self.push_obj(Obj::List(Vec::new()))?,
                b'l' => {
                    let items = self.pop_mark()?;
                    self.push_obj(Obj::List(items))?;
                }
                b'a' => {
                    let v = self.pop()?;
                    self.append_items(vec![v])?;
                }
                b'e' => {
                    let items = self.pop_mark()?;
                    self.append_items(items)?;
                }
                b'}' => self.push_obj(Obj::Dict(Vec::new()))?,
                b'd' => {
                    let items = self.pop_mark()?;
                    self.push_obj(Obj::Dict(Vec::new()))?;
                    self.set_items(items)?;
                }
                b's' => {
                    let v = self.pop()?;
                    let k = self.pop()?;
                    self.set_items(vec![k, v])?;
                }
                b'u' => {
                    let items = self.pop_mark()?;
                    self.set_items(items)?;
                }
                b')' => self.push_obj(Obj::Tuple(Box::new([])))?,
                b't' => {
                    let items = self.pop_mark()?;
                    self.push_obj(Obj::Tuple(items.into_boxed_slice()))?;
                }
                0x85..=0x87 => {
                    let n = (self.op - 0x84) as usize;
                    if self.stack.len() < self.floor() + n {
                        return Err(self.err("stack underflow"));
                    }
                    let items = self.stack.split_off(self.stack.len() - n);
                    self.push_obj(Obj::Tuple(items.into_boxed_slice()))?;
                }
                b'p' => {
                    let l = self.line_str()?;
                    let idx = self.memo_index(l)?;
                    self.memo_put(idx)?;
                }
                b'q' => {
                    let idx = self.u8()? as u64;
                    self.memo_put(idx)?;
                }
                b'r' => {
                    let idx = self.u32()? as u64;
                    self.memo_put(idx)?;
                }
                0x94 => {
                    let idx = self.memo.len() as u64;
                    self.memo_put(idx)?;
                }
                b'g' => {
                    let l = self.line_str()?;
                    let idx = self.memo_index(l)?;
                    self.memo_get(idx)?;
                }
                b'h' => {
                    let idx = self.u8()? as u64;
                    self.memo_get(idx)?;
                }
                b'j' => {
                    let idx = self.u32()? as u64;
                    self.memo_get(idx)?;
                }
                b'c' => {
                    let module = self.line_str()?;
                    let gname = self.line_str()?;
                    self.global(module, gname)?;
                }
                0x93 => {
                    let gname = self.pop()?;
                    let module = self.pop()?;
                    let s = |v: Val| match v {
                        Val::Obj(i) => match self.objs.get(i as usize) {
                            Some(Obj::Str(s)) => Some(s.to_string()),
                            _ => None,
                        },
                        _ => None,
                    };
                    match (s(module), s(gname)) {
                        (Some(m), Some(n)) => self.global(&m, &n)?,
                        _ => {
                            return Err(self.err(format!(
                                "STACK_GLOBAL needs two strings, found {} and {}",
                                self.type_of(module),
                                self.type_of(gname)
                            )));
                        }
                    }
                }
                b'R' | 0x81 => self.call_class()?,
                b'b' => {
                    let state = self.pop()?;
                    let top = self.top()?;
                    let is_dict = |v: Val, empty: bool| matches!(v, Val::Obj(i) if matches!(self.objs.get(i as usize), Some(Obj::Dict(d)) if !empty || d.is_empty()));
                    let ok = is_dict(top, false) && (state == Val::None || is_dict(state, true));
                    if !ok {
                        return Err(self.refuse(
                            "BUILD sets object state; only a dict with no state is accepted",
                        ));
                    }
                }
                b'P' | b'Q' => return Err(self.refuse("persistent ids")),
                0x82..=0x84 => return Err(self.refuse("extension registry globals")),
                b'i' => {
                    let module = self.line_str()?;
                    let gname = self.line_str()?;
                    return Err(self.refuse_global(module, gname));
                }
                b'o' => return Err(self.refuse("object instantiation")),
                0x92 => return Err(self.refuse("object instantiation")),
                0x8f..=0x91 => return Err(self.refuse("sets are not part of a snapshot")),
                0x97 | 0x98 => return Err(self.refuse("out-of-band buffers")),
                op => {
                    return Err(Error::Trace(format!(
                        "{}: bad pickle at byte {}: unknown opcode 0x{op:02x} (not a pickle, or \
                         a corrupt one)",
                        self.name, self.op_at
                    )));
                }
            }
        }
    }
}

/// Decode a protocol-0 `repr` string literal (`'abc\n'` or `"..."`) into bytes.
fn decode_string_repr(l: &[u8]) -> Option<Vec<u8>> {
    let l = l.strip_suffix(b"\r").unwrap_or(l);
    if l.len() < 2 {
        return None;
    }
    let q = l[0];
    if (q != b'\'' && q != b'"') || l[l.len() - 1] != q {
        return None;
    }
    let body = &l[1..l.len() - 1];
    let mut out = Vec::with_capacity(body.len());
    let mut i = 0;
    while i < body.len() {
        let c = body[i];
        i += 1;
        if c != b'\\' {
            out.push(c);
            continue;
        }
        let e = *body.get(i)?;
        i += 1;
        match e {
            b'\\' => out.push(b'\\'),
            b'\'' => out.push(b'\''),
            b'"' => out.push(b'"'),
            b'n' => out.push(b'\n'),
            b't' => out.push(b'\t'),
            b'r' => out.push(b'\r'),
            b'a' => out.push(7),
            b'b' => out.push(8),
            b'f' => out.push(12),
            b'v' => out.push(11),
            b'x' => {
                let h = body.get(i..i + 2)?;
                out.push(u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok()?);
                i += 2;
            }
            b'0'..=b'7' => {
                let mut v = (e - b'0') as u32;
                let mut k = 0;
                while k < 2 && i < body.len() && (b'0'..=b'7').contains(&body[i]) {
                    v = v * 8 + (body[i] - b'0') as u32;
                    i += 1;
                    k += 1;
                }
                out.push(v as u8);
            }
            other => {
                out.push(b'\\');
                out.push(other);
            }
        }
    }
    Some(out)
}

/// Decode Python's `raw-unicode-escape` (the UNICODE opcode's argument).
fn decode_raw_unicode_escape(l: &[u8]) -> Option<String> {
    let mut out = String::with_capacity(l.len());
    let mut i = 0;
    while i < l.len() {
        let c = l[i];
        if c == b'\\' && i + 1 < l.len() && (l[i + 1] == b'u' || l[i + 1] == b'U') {
            let n = if l[i + 1] == b'u' { 4 } else { 8 };
            let h = l.get(i + 2..i + 2 + n)?;
            let v = u32::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok()?;
            out.push(char::from_u32(v)?);
            i += 2 + n;
        } else {
            out.push(c as char);
            i += 1;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(b: &[u8]) -> String {
        loads("t.pickle", b)
            .unwrap_or_else(|e| panic!("{e}"))
            .root()
            .repr()
    }

    #[test]
    fn ints_of_every_width() {
        assert_eq!(ok(b"K\x05."), "5");
        assert_eq!(ok(b"M\x01\x02."), "513");
        assert_eq!(ok(b"J\xff\xff\xff\xff."), "-1");
        assert_eq!(ok(b"I42\n."), "42");
        assert_eq!(ok(b"I01\n."), "True");
        assert_eq!(ok(b"L-7L\n."), "-7");
        // LONG1: -1 in one byte, -256 in two, 2^40, i64::MIN in 9 bytes (sign extended).
        assert_eq!(ok(b"\x8a\x01\xff."), "-1");
        assert_eq!(ok(b"\x8a\x02\x00\xff."), "-256");
        assert_eq!(ok(b"\x8a\x06\x00\x00\x00\x00\x00\x01."), "1099511627776");
        assert_eq!(
            ok(b"\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\xff."),
            i64::MIN.to_string()
        );
        assert_eq!(ok(b"\x8a\x00."), "0");
        // 2^63 and 2^64 - 1 are kept as 64-bit values; 2^64 and beyond as a big-int marker.
        assert_eq!(
            ok(b"\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00."),
            "9223372036854775808"
        );
        assert_eq!(
            ok(b"\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00."),
            u64::MAX.to_string()
        );
        let p = loads("t", b"\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x01.").unwrap();
        assert!(p.root().is_big_int() && p.root().as_int().is_none());
        assert!(
            loads("t", b"L123456789012345678901234567890L\n.")
                .unwrap()
                .root()
                .is_big_int()
        );
        assert!(loads("t", b"L12x\n.").is_err());
        assert_eq!(ok(b"\x8b\x02\x00\x00\x00\xfe\xff."), "-2");
        // -1 as a stream handle is u64::MAX.
        let p = loads("t", b"\x8a\x01\xff.").unwrap();
        assert_eq!(p.root().as_u64_bits(), Some(u64::MAX));
    }

    #[test]
    fn floats() {
        assert_eq!(ok(b"G\x3f\xf8\x00\x00\x00\x00\x00\x00."), "1.5");
        assert_eq!(ok(b"F-2.25\n."), "-2.25");
    }

    #[test]
    fn strings_and_bytes() {
        assert_eq!(ok(b"\x8c\x03abc."), "\"abc\"");
        assert_eq!(ok(b"X\x02\x00\x00\x00\xc3\xa9."), "\"\u{e9}\"");
        assert_eq!(ok(b"\x8d\x01\x00\x00\x00\x00\x00\x00\x00z."), "\"z\"");
        assert_eq!(ok(b"Vcaf\\u00e9\n."), "\"caf\u{e9}\"");
        assert_eq!(ok(b"S'a\\nb'\n."), "\"a\\nb\"");
        assert_eq!(ok(b"U\x02hi."), "\"hi\"");
        let p = loads("t", b"C\x02\x00\x01.").unwrap();
        assert_eq!(p.root().as_bytes(), Some(&b"\x00\x01"[..]));
        assert_eq!(ok(b"N."), "None");
        assert_eq!(ok(b"\x88."), "True");
    }

    #[test]
    fn nested_tuples_lists_dicts() {
        assert_eq!(
            ok(b"\x80\x04K\x01K\x02K\x03\x86\x86]K\x04a}\x8c\x01aNs\x87."),
            "((1, (2, 3)), [4], {\"a\": None})"
        );
        // MARK ... TUPLE, LIST, DICT (protocol 0/1 style).
        assert_eq!(ok(b"(K\x01(K\x02tl."), "[1, (2,)]");
        let p = loads("t", b"(U\x01kK\x07d.").unwrap();
        assert_eq!(p.root().get("k").and_then(Value::as_int), Some(7));
        assert_eq!(ok(b")."), "()");
    }

    #[test]
    fn memo_shares_containers_as_cpython_does() {
        // l = []; memoized empty, filled afterwards: [l, l] shows the filled list twice.
        assert_eq!(ok(b"\x80\x04](]\x94K\x01ah\x00e."), "[[1], [1]]");
        // Appending after the GET changes the one list both places see (CPython: identity).
        assert_eq!(ok(b"\x80\x04]\x94h\x00K\x07a\x86."), "([7], [7])");
        // PUT/GET text forms and LONG_BINPUT/LONG_BINGET.
        assert_eq!(
            ok(b"(U\x01xp7\ng7\nr\x09\x00\x00\x00j\x09\x00\x00\x00l."),
            "[\"x\", \"x\", \"x\"]"
        );
        // GET of a never stored entry.
        assert!(loads("t", b"h\x03.").is_err());
        // A huge memo index is one map entry.
        assert_eq!(ok(b"Np100000000\ng100000000\n\x86."), "(None, None)");
        assert_eq!(
            ok(b"N\x72\xff\xff\xff\xff\x6a\xff\xff\xff\xff\x86."),
            "(None, None)"
        );
    }

    #[test]
    fn ordered_dict_global_is_memoized_like_any_object() {
        // CPython: GLOBAL, BINPUT 0, ..., BINGET 0 for the nested OrderedDict.
        let b = b"\x80\x02ccollections\nOrderedDict\nq\x00)Rq\x01U\x01ah\x00)Rq\x02U\x01bK\x01ss.";
        assert_eq!(ok(b), "{\"a\": {\"b\": 1}}");
        let v = loads(
            "t",
            b"\x80\x04\x8c\x0bcollections\x8c\x0bOrderedDict\x93)\x81.",
        )
        .unwrap();
        assert!(v.root().is_dict());
        // The class itself, or called with arguments: refused.
        assert!(loads("t", b"ccollections\nOrderedDict\n.").is_err());
        assert!(loads("t", b"ccollections\nOrderedDict\nK\x01\x85R.").is_err());
    }

    #[test]
    fn deep_and_recursive_data_load_without_recursion() {
        // ((((...)))) a million deep: nothing walks it recursively.
        let mut b = vec![b'N'];
        b.extend(std::iter::repeat_n(0x85u8, 1_000_000));
        b.push(b'.');
        let p = loads("t", &b).unwrap();
        assert!(p.root().repr().contains("..."));
        // A list that contains itself.
        let p = loads("t", b"]\x94h\x00a.").unwrap();
        let r = p.root();
        assert!(r.as_seq().unwrap().first().unwrap().is_list());
        assert!(r.repr().len() < 10_000);
    }

    #[test]
    fn long_dicts_are_indexed() {
        let mut b = b"}(".to_vec();
        for i in 0..1000 {
            let k = format!("k{i}");
            b.push(0x8c);
            b.push(k.len() as u8);
            b.extend_from_slice(k.as_bytes());
            b.extend_from_slice(b"M");
            b.extend_from_slice(&(i as u16).to_le_bytes());
        }
        b.extend_from_slice(b"\x8c\x02k5K\x63u.");
        let p = loads("t", &b).unwrap();
        assert_eq!(p.root().get("k999").and_then(Value::as_int), Some(999));
        assert_eq!(p.root().get("k5").and_then(Value::as_int), Some(99));
        assert!(p.root().get("nope").is_none());
    }

    #[test]
    fn dup_pop_pop_mark() {
        assert_eq!(ok(b"K\x01K\x020."), "1");
        assert_eq!(ok(b"K\x01(K\x02K\x031."), "1");
        assert_eq!(ok(b"K\x012\x86."), "(1, 1)");
    }

    #[test]
    fn refuses_globals_and_objects() {
        let e = loads("evil.pkl", b"cos\nsystem\nU\x04echo\x85R.").unwrap_err();
        let m = e.to_string();
        assert!(
            m.contains("'os.system'") && m.contains("byte 0") && m.contains("evil.pkl"),
            "{m}"
        );
        assert!(m.contains("GLOBAL"), "{m}");
        for bad in [
            &b"P0\n."[..],
            b"\x82\x01.",
            b"(cos\nsystem\no.",
            b"(ios\nsystem\n.",
            b"]N\x86b.",
            b"\x8f.",
        ] {
            assert!(loads("t", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn truncation_and_garbage_are_errors() {
        let e = loads("t", b"\x80\x04\x8c\x05ab").unwrap_err().to_string();
        assert!(e.contains("truncated"), "{e}");
        let e = loads("t", b"K\x01").unwrap_err().to_string();
        assert!(e.contains("byte 2"), "{e}");
        let e = loads("t", b"\xff").unwrap_err().to_string();
        assert!(
            e.contains("unknown opcode 0xff") && e.contains("byte 0"),
            "{e}"
        );
        // Length far beyond the input.
        let e = loads("t", b"X\xff\xff\xff\x7f").unwrap_err().to_string();
        assert!(e.contains("absurd"), "{e}");
        assert!(loads("t", b"").is_err());
        assert!(loads("t", b"0").is_err());
        assert!(loads("t", b"a").is_err());
        assert!(loads("t", b"e").is_err());
    }

    #[test]
    fn inflate_budget_refuses_a_bomb_early() {
        use std::io::Write;
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..64 {
            enc.write_all(&zeros).unwrap();
        }
        let gz = enc.finish().unwrap();
        let budget = inflate_budget(gz.len() as u64);
        assert!(budget < 64 << 20);
        let e = gunzip_if_gzip("bomb.gz", gz).unwrap_err().to_string();
        assert!(
            e.contains("bomb.gz") && e.contains("decompression bomb"),
            "{e}"
        );
    }
}
