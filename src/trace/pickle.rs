//! A restricted unpickler for PyTorch memory snapshots, in safe Rust.
//!
//! It reads pickle protocols 0–5 as far as they encode plain data (none, booleans, integers that
//! fit `i64`, floats, strings, bytes, lists, tuples, dicts) and nothing else: the only global it
//! accepts is `collections.OrderedDict`, and only as the class of an empty dict built by `REDUCE`
//! with an empty argument tuple or by `NEWOBJ`, which then receives its items by `SETITEM(S)`.
//! Every other global, persistent id, extension code or instance opcode is refused with an error
//! naming the file, the byte offset, the opcode and the global. Nothing a pickle says is ever
//! executed: the reader only builds [`Value`]s.
//!
//! Containers are reference counted so that the memo (`PUT`/`GET`) shares rather than copies them;
//! a container is entered into the memo when it leaves the stack, complete.

use std::io::Read;
use std::rc::Rc;

use crate::error::{Error, Result};

/// A plain Python value read from a pickle.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    None,
    Bool(bool),
    /// An `int` (pickled ints beyond `i64` are refused).
    Int(i64),
    Float(f64),
    Str(Rc<str>),
    /// `bytes` or `bytearray`.
    Bytes(Rc<[u8]>),
    List(Rc<Vec<Value>>),
    Tuple(Rc<Vec<Value>>),
    /// A `dict` or `collections.OrderedDict`, items in pickle order.
    Dict(Rc<Vec<(Value, Value)>>),
}

impl Value {
    /// The value of `key` in a dict with string keys (`None` if `self` is not a dict or the key
    /// is absent; a repeated key gives its last value, as in Python).
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Dict(items) => items.iter().rev().find_map(|(k, v)| match k {
                Value::Str(s) if &**s == key => Some(v),
                _ => None,
            }),
            _ => None,
        }
    }

    /// The integer, if this is one (`bool` counts as 0/1, as in Python).
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            Value::Bool(b) => Some(*b as i64),
            _ => None,
        }
    }

    /// The number as `f64`, if this is an int or a float.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Int(i) => Some(*i as f64),
            Value::Float(f) => Some(*f),
            Value::Bool(b) => Some(*b as i64 as f64),
            _ => None,
        }
    }

    /// The text, if this is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The items, if this is a list or a tuple.
    pub fn as_seq(&self) -> Option<&[Value]> {
        match self {
            Value::List(v) | Value::Tuple(v) => Some(v),
            _ => None,
        }
    }

    /// The items, if this is a dict.
    pub fn as_dict(&self) -> Option<&[(Value, Value)]> {
        match self {
            Value::Dict(d) => Some(d),
            _ => None,
        }
    }

    /// A short name of the Python type, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::Bytes(_) => "bytes",
            Value::List(_) => "list",
            Value::Tuple(_) => "tuple",
            Value::Dict(_) => "dict",
        }
    }
}

const ALLOWED: &str = "snapshots contain only plain data (dicts, lists, tuples, strings, numbers, \
                       collections.OrderedDict)";

/// Largest decompressed size accepted from a gzip stream (guards against gzip bombs).
pub const MAX_DECOMPRESSED: u64 = 4 << 30;

/// `data` itself, or its decompressed content if it starts with the gzip magic bytes
/// (`1f 8b`). `name` is the file name used in errors; a corrupt stream gives an error naming the
/// file, the compressed byte offset reached and what failed.
pub fn gunzip_if_gzip(name: &str, data: Vec<u8>) -> Result<Vec<u8>> {
    if !data.starts_with(&[0x1f, 0x8b]) {
        return Ok(data);
    }
    let mut dec = flate2::bufread::MultiGzDecoder::new(&data[..]);
    let mut out = Vec::with_capacity(data.len().saturating_mul(8).min(1 << 30));
    let res = (&mut dec).take(MAX_DECOMPRESSED + 1).read_to_end(&mut out);
    let at = data.len() - dec.get_ref().len();
    match res {
        Err(e) => Err(Error::Trace(format!(
            "{name}: corrupt gzip stream near compressed byte {at} of {}: {e} (decompressed \
             {} bytes before the failure); expected a complete gzip file",
            data.len(),
            out.len()
        ))),
        Ok(_) if out.len() as u64 > MAX_DECOMPRESSED => Err(Error::Trace(format!(
            "{name}: gzip stream decompresses to more than {MAX_DECOMPRESSED} bytes \
             (stopped at compressed byte {at}); refusing it"
        ))),
        Ok(_) => Ok(out),
    }
}

/// Unpickle `data` (already decompressed). `name` names the source in errors.
pub fn loads(name: &str, data: &[u8]) -> Result<Value> {
    Unpickler::new(name, data).run()
}

/// A stack slot: a value, or the one class we accept (only usable by REDUCE / NEWOBJ).
#[derive(Clone, Debug)]
enum Slot {
    V(Value),
    OrderedDictClass,
}

/// A memo entry.
#[derive(Clone, Debug)]
enum Memo {
    Empty,
    /// The container at this stack position, still being filled; entered when it leaves.
    Pending,
    /// The value and its nesting depth.
    V(Value, u32),
}

/// Deepest nesting of containers accepted (snapshots nest about 6 deep). Deeper data would be
/// dropped recursively and could overflow the thread's stack.
pub const MAX_DEPTH: u32 = 256;

struct Unpickler<'a> {
    name: &'a str,
    data: &'a [u8],
    pos: usize,
    /// Offset of the opcode being executed, for errors.
    op_at: usize,
    op: u8,
    stack: Vec<Slot>,
    /// Nesting depth of each stack slot (0 = a scalar or an empty container).
    depths: Vec<u32>,
    /// Deepest value popped by the current opcode.
    popped: u32,
    /// Set when a container nests deeper than [`MAX_DEPTH`].
    too_deep: bool,
    marks: Vec<usize>,
    memo: Vec<Memo>,
    /// (stack position, memo index) of containers memoized while still on the stack.
    pending: Vec<(usize, usize)>,
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

impl<'a> Unpickler<'a> {
    fn new(name: &'a str, data: &'a [u8]) -> Self {
        Unpickler {
            name,
            data,
            pos: 0,
            op_at: 0,
            op: 0,
            stack: Vec::with_capacity(64),
            depths: Vec::with_capacity(64),
            popped: 0,
            too_deep: false,
            marks: Vec::with_capacity(16),
            memo: Vec::new(),
            pending: Vec::new(),
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

    /// Push a value; a non-empty container is one deeper than what the opcode popped.
    #[inline]
    fn push(&mut self, v: Value) {
        let d = match &v {
            Value::List(x) | Value::Tuple(x) if !x.is_empty() => self.popped + 1,
            Value::Dict(x) if !x.is_empty() => self.popped + 1,
            _ => 0,
        };
        self.push_d(v, d);
    }

    #[inline]
    fn push_d(&mut self, v: Value, d: u32) {
        self.too_deep |= d > MAX_DEPTH;
        self.stack.push(Slot::V(v));
        self.depths.push(d);
    }

    /// The top container received what the opcode popped.
    fn deepen_top(&mut self) {
        let want = self.popped + 1;
        if let Some(d) = self.depths.last_mut() {
            *d = (*d).max(want);
            self.too_deep |= *d > MAX_DEPTH;
        }
    }

    /// Enter completed containers at stack positions >= `len` into the memo.
    #[inline]
    fn settle(&mut self, len: usize) {
        while let Some(&(p, idx)) = self.pending.last() {
            if p < len {
                break;
            }
            self.pending.pop();
            if let Some(Slot::V(v)) = self.stack.get(p) {
                self.memo[idx] = Memo::V(v.clone(), self.depths[p]);
            } else {
                self.memo[idx] = Memo::Empty;
            }
        }
    }

    fn pop_slot(&mut self) -> Result<Slot> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return Err(self.err("stack underflow"));
        }
        self.settle(self.stack.len() - 1);
        self.popped = self.popped.max(self.depths.pop().unwrap_or(0));
        Ok(self.stack.pop().unwrap_or(Slot::V(Value::None)))
    }

    fn pop(&mut self) -> Result<Value> {
        match self.pop_slot()? {
            Slot::V(v) => Ok(v),
            Slot::OrderedDictClass => Err(self.err(
                "collections.OrderedDict may only be called (REDUCE with an empty tuple, or \
                 NEWOBJ), not used as a value",
            )),
        }
    }

    /// Pop everything down to the last mark, and the mark.
    fn pop_mark(&mut self) -> Result<Vec<Value>> {
        let m = self
            .marks
            .pop()
            .ok_or_else(|| self.err("no MARK on the stack"))?;
        self.settle(m);
        let deepest = self.depths.drain(m..).max().unwrap_or(0);
        self.popped = self.popped.max(deepest);
        let mut out = Vec::with_capacity(self.stack.len() - m);
        for s in self.stack.drain(m..) {
            match s {
                Slot::V(v) => out.push(v),
                Slot::OrderedDictClass => {
                    return Err(Error::Trace(format!(
                        "{}: bad pickle at byte {}: collections.OrderedDict used as a value",
                        self.name, self.op_at
                    )));
                }
            }
        }
        Ok(out)
    }

    /// The top of the stack, which must be a value at or above the current mark.
    fn top_mut(&mut self) -> Result<&mut Value> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return Err(self.err("stack underflow"));
        }
        if !matches!(self.stack.last(), Some(Slot::V(_))) {
            return Err(self.err("collections.OrderedDict used as a value"));
        }
        match self.stack.last_mut() {
            Some(Slot::V(v)) => Ok(v),
            _ => unreachable!("checked above"),
        }
    }

    fn append_items(&mut self, items: Vec<Value>) -> Result<()> {
        let top = self.top_mut()?;
        match top {
            Value::List(l) => {
                Rc::make_mut(l).extend(items);
                self.deepen_top();
                Ok(())
            }
            other => {
                let t = other.type_name();
                Err(self.err(format!("append to a {t}, not a list")))
            }
        }
    }

    fn set_items(&mut self, items: Vec<Value>) -> Result<()> {
        if !items.len().is_multiple_of(2) {
            return Err(self.err("odd number of items for a dict"));
        }
        let top = self.top_mut()?;
        match top {
            Value::Dict(d) => {
                let d = Rc::make_mut(d);
                let mut it = items.into_iter();
                // Repeated keys are kept (checking would cost O(n²) on hostile input); `get`
                // returns the last one, as Python's dict would hold it.
                while let (Some(k), Some(v)) = (it.next(), it.next()) {
                    d.push((k, v));
                }
                self.deepen_top();
                Ok(())
            }
            other => {
                let t = other.type_name();
                Err(self.err(format!("set item on a {t}, not a dict")))
            }
        }
    }

    fn memo_put(&mut self, idx: usize) -> Result<()> {
        if idx > self.data.len() {
            return Err(self.err(format!(
                "memo index {idx} is beyond anything this {}-byte input can hold",
                self.data.len()
            )));
        }
        let top = self.stack.len();
        let floor = self.marks.last().copied().unwrap_or(0);
        if top <= floor {
            return Err(self.err("memoize with an empty stack"));
        }
        if idx >= self.memo.len() {
            self.memo.resize(idx + 1, Memo::Empty);
        }
        match &self.stack[top - 1] {
            Slot::V(Value::List(_) | Value::Dict(_)) => {
                // Still being filled: enter it when it leaves the stack.
                self.memo[idx] = Memo::Pending;
                self.pending.push((top - 1, idx));
            }
            Slot::V(v) => self.memo[idx] = Memo::V(v.clone(), self.depths[top - 1]),
            Slot::OrderedDictClass => self.memo[idx] = Memo::Empty,
        }
        Ok(())
    }

    fn memo_get(&mut self, idx: usize) -> Result<()> {
        match self.memo.get(idx) {
            Some(Memo::V(v, d)) => {
                let (v, d) = (v.clone(), *d);
                self.push_d(v, d);
                Ok(())
            }
            Some(Memo::Pending) => {
                // The container is still on the stack (e.g. a shared empty list inside an open
                // MARK frame). Python's pickler only refers back to complete objects, barring
                // recursive data, which plain snapshots never hold: share its current value.
                let p = self
                    .pending
                    .iter()
                    .rev()
                    .find(|&&(_, i)| i == idx)
                    .map(|&(p, _)| p);
                match p.and_then(|p| self.stack.get(p)) {
                    Some(Slot::V(v)) => {
                        let (v, d) = (v.clone(), p.map_or(0, |p| self.depths[p]));
                        self.push_d(v, d);
                        Ok(())
                    }
                    _ => Err(self.err(format!("memo entry {idx} is not a value"))),
                }
            }
            _ => Err(self.err(format!("memo entry {idx} was never stored"))),
        }
    }

    fn global(&mut self, module: &str, gname: &str) -> Result<()> {
        if module == "collections" && gname == "OrderedDict" {
            self.stack.push(Slot::OrderedDictClass);
            self.depths.push(0);
            Ok(())
        } else {
            Err(self.refuse_global(module, gname))
        }
    }

    /// REDUCE / NEWOBJ: only `OrderedDict()` with no arguments.
    fn call_class(&mut self) -> Result<()> {
        let args = self.pop()?;
        let cls = self.pop_slot()?;
        match (cls, &args) {
            (Slot::OrderedDictClass, Value::Tuple(t)) if t.is_empty() => {
                self.push(Value::Dict(Rc::new(Vec::new())));
                Ok(())
            }
            (Slot::OrderedDictClass, _) => {
                Err(self
                    .err("collections.OrderedDict may only be called with an empty argument tuple"))
            }
            (Slot::V(v), _) => Err(self.refuse(&format!("calling a {}", v.type_name()))),
        }
    }

    fn int_line(&mut self, long: bool) -> Result<Value> {
        let l = self.line_str()?;
        let mut t = l.trim();
        if long {
            t = t.strip_suffix('L').unwrap_or(t);
        }
        if !long {
            if t == "00" {
                return Ok(Value::Bool(false));
            }
            if t == "01" {
                return Ok(Value::Bool(true));
            }
        }
        t.parse::<i64>()
            .map(Value::Int)
            .map_err(|_| self.err(format!("'{t}' is not an integer that fits in 64 bits")))
    }

    fn long_bytes(&self, b: &[u8]) -> Result<Value> {
        // Little-endian two's complement, any length.
        if b.is_empty() {
            return Ok(Value::Int(0));
        }
        let neg = b[b.len() - 1] & 0x80 != 0;
        let fill = if neg { 0xff } else { 0 };
        if b.len() > 8 && b[8..].iter().any(|&x| x != fill) {
            return Err(self.err(format!(
                "a {}-byte integer does not fit in 64 bits",
                b.len()
            )));
        }
        let mut buf = [fill; 8];
        let n = b.len().min(8);
        buf[..n].copy_from_slice(&b[..n]);
        let v = i64::from_le_bytes(buf);
        if (v < 0) != neg {
            return Err(self.err("integer does not fit in 64 bits"));
        }
        Ok(Value::Int(v))
    }

    fn str_value(&self, b: &[u8]) -> Result<Value> {
        match std::str::from_utf8(b) {
            Ok(s) => Ok(Value::Str(Rc::from(s))),
            Err(e) => Err(self.err(format!("string is not valid UTF-8 ({e})"))),
        }
    }

    /// Python 2 `str` (BINSTRING, STRING): decoded as Latin-1 when not UTF-8.
    fn legacy_str(b: &[u8]) -> Value {
        match std::str::from_utf8(b) {
            Ok(s) => Value::Str(Rc::from(s)),
            Err(_) => Value::Str(Rc::from(b.iter().map(|&c| c as char).collect::<String>())),
        }
    }

    fn run(mut self) -> Result<Value> {
        loop {
            if self.too_deep {
                return Err(self.err(format!(
                    "containers nested more than {MAX_DEPTH} deep (a snapshot nests about 6)"
                )));
            }
            self.popped = 0;
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
                    return Ok(v);
                }
                b'(' => self.marks.push(self.stack.len()),
                b'0' => {
                    if self.marks.last() == Some(&self.stack.len()) {
                        // POP of an empty mark frame discards the mark, as CPython does.
                        self.marks.pop();
                    } else {
                        self.pop_slot()?;
                    }
                }
                b'1' => {
                    self.pop_mark()?;
                }
                b'2' => {
                    let top = self.top_mut()?.clone();
                    let d = self.depths.last().copied().unwrap_or(0);
                    self.push_d(top, d);
                }
                b'F' => {
                    let l = self.line_str()?;
                    let f = l
                        .trim()
                        .parse::<f64>()
                        .map_err(|_| self.err(format!("'{l}' is not a float")))?;
                    self.push(Value::Float(f));
                }
                b'I' => {
                    let v = self.int_line(false)?;
                    self.push(v);
                }
                b'L' => {
                    let v = self.int_line(true)?;
                    self.push(v);
                }
                b'J' => {
                    let v = self.u32()? as i32;
                    self.push(Value::Int(v as i64));
                }
                b'K' => {
                    let v = self.u8()?;
                    self.push(Value::Int(v as i64));
                }
                b'M' => {
                    let v = self.u16()?;
                    self.push(Value::Int(v as i64));
                }
                0x8a => {
                    let n = self.u8()? as u64;
                    let n = self.len_arg(n)?;
                    let b = self.take(n)?;
                    let v = self.long_bytes(b)?;
                    self.push(v);
                }
                0x8b => {
                    let n = self.u32()? as i32;
                    if n < 0 {
                        return Err(self.err("negative LONG4 length"));
                    }
                    let n = self.len_arg(n as u64)?;
                    let b = self.take(n)?;
                    let v = self.long_bytes(b)?;
                    self.push(v);
                }
                b'G' => {
                    let b = self.take(8)?;
                    let f = f64::from_be_bytes(b.try_into().unwrap_or([0; 8]));
                    self.push(Value::Float(f));
                }
                b'N' => self.push(Value::None),
                0x88 => self.push(Value::Bool(true)),
                0x89 => self.push(Value::Bool(false)),
                0x8c => {
                    let n = self.u8()? as u64;
                    let n = self.len_arg(n)?;
                    let b = self.take(n)?;
                    let v = self.str_value(b)?;
                    self.push(v);
                }
                b'X' => {
                    let n = self.u32()? as u64;
                    let n = self.len_arg(n)?;
                    let b = self.take(n)?;
                    let v = self.str_value(b)?;
                    self.push(v);
                }
                0x8d => {
                    let n = self.u64()?;
                    let n = self.len_arg(n)?;
                    let b = self.take(n)?;
                    let v = self.str_value(b)?;
                    self.push(v);
                }
                b'V' => {
                    let l = self.line()?;
                    let s = decode_raw_unicode_escape(l).ok_or_else(|| {
                        self.err("bad raw-unicode-escape sequence in UNICODE argument")
                    })?;
                    self.push(Value::Str(Rc::from(s)));
                }
                b'S' => {
                    let l = self.line()?;
                    let s = decode_string_repr(l).ok_or_else(|| {
                        self.err("STRING argument is not a quoted Python string literal")
                    })?;
                    self.push(Self::legacy_str(&s));
                }
                b'T' => {
                    let n = self.u32()? as i32;
                    if n < 0 {
                        return Err(self.err("negative BINSTRING length"));
                    }
                    let n = self.len_arg(n as u64)?;
                    let b = self.take(n)?;
                    self.push(Self::legacy_str(b));
                }
                b'U' => {
                    let n = self.u8()? as u64;
                    let n = self.len_arg(n)?;
                    let b = self.take(n)?;
                    self.push(Self::legacy_str(b));
                }
                b'B' | b'C' | 0x8e | 0x96 => {
                    let n = match self.op {
                        b'B' => self.u32()? as u64,
                        b'C' => self.u8()? as u64,
                        _ => self.u64()?,
                    };
                    let n = self.len_arg(n)?;
                    let b = self.take(n)?;
                    self.push(Value::Bytes(Rc::from(b)));
                }
                b']' => self.push(Value::List(Rc::new(Vec::new()))),
                b'l' => {
                    let items = self.pop_mark()?;
                    self.push(Value::List(Rc::new(items)));
                }
                b'a' => {
                    let v = self.pop()?;
                    self.append_items(vec![v])?;
                }
                b'e' => {
                    let items = self.pop_mark()?;
                    self.append_items(items)?;
                }
                b'}' => self.push(Value::Dict(Rc::new(Vec::new()))),
                b'd' => {
                    let items = self.pop_mark()?;
                    self.push(Value::Dict(Rc::new(Vec::new())));
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
                b')' => self.push(Value::Tuple(Rc::new(Vec::new()))),
                b't' => {
                    let items = self.pop_mark()?;
                    self.push(Value::Tuple(Rc::new(items)));
                }
                0x85..=0x87 => {
                    let n = (self.op - 0x84) as usize;
                    let floor = self.marks.last().copied().unwrap_or(0);
                    if self.stack.len() < floor + n {
                        return Err(self.err("stack underflow"));
                    }
                    let mut items = Vec::with_capacity(n);
                    for _ in 0..n {
                        items.push(self.pop()?);
                    }
                    items.reverse();
                    self.push(Value::Tuple(Rc::new(items)));
                }
                b'p' => {
                    let l = self.line_str()?;
                    let idx = l
                        .trim()
                        .parse::<usize>()
                        .map_err(|_| self.err(format!("'{l}' is not a memo index")))?;
                    self.memo_put(idx)?;
                }
                b'q' => {
                    let idx = self.u8()? as usize;
                    self.memo_put(idx)?;
                }
                b'r' => {
                    let idx = self.u32()? as usize;
                    self.memo_put(idx)?;
                }
                0x94 => {
                    let idx = self.memo.len();
                    self.memo_put(idx)?;
                }
                b'g' => {
                    let l = self.line_str()?;
                    let idx = l
                        .trim()
                        .parse::<usize>()
                        .map_err(|_| self.err(format!("'{l}' is not a memo index")))?;
                    self.memo_get(idx)?;
                }
                b'h' => {
                    let idx = self.u8()? as usize;
                    self.memo_get(idx)?;
                }
                b'j' => {
                    let idx = self.u32()? as usize;
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
                    match (&module, &gname) {
                        (Value::Str(m), Value::Str(n)) => {
                            let (m, n) = (m.clone(), n.clone());
                            self.global(&m, &n)?;
                        }
                        _ => {
                            return Err(self.err(format!(
                                "STACK_GLOBAL needs two strings, found {} and {}",
                                module.type_name(),
                                gname.type_name()
                            )));
                        }
                    }
                }
                b'R' | 0x81 => self.call_class()?,
                b'b' => {
                    let state = self.pop()?;
                    let top = self.top_mut()?;
                    let ok = matches!(top, Value::Dict(_))
                        && match &state {
                            Value::None => true,
                            Value::Dict(d) => d.is_empty(),
                            _ => false,
                        };
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

    fn ok(b: &[u8]) -> Value {
        loads("t.pickle", b).unwrap_or_else(|e| panic!("{e}"))
    }

    fn s(x: &str) -> Value {
        Value::Str(Rc::from(x))
    }

    #[test]
    fn ints_of_every_width() {
        assert_eq!(ok(b"K\x05."), Value::Int(5));
        assert_eq!(ok(b"M\x01\x02."), Value::Int(0x0201));
        assert_eq!(ok(b"J\xff\xff\xff\xff."), Value::Int(-1));
        assert_eq!(ok(b"I42\n."), Value::Int(42));
        assert_eq!(ok(b"I01\n."), Value::Bool(true));
        assert_eq!(ok(b"L-7L\n."), Value::Int(-7));
        // LONG1: -1 in one byte, -256 in two, 2^40, i64::MIN in 9 bytes (sign extended).
        assert_eq!(ok(b"\x8a\x01\xff."), Value::Int(-1));
        assert_eq!(ok(b"\x8a\x02\x00\xff."), Value::Int(-256));
        assert_eq!(
            ok(b"\x8a\x06\x00\x00\x00\x00\x00\x01."),
            Value::Int(1 << 40)
        );
        assert_eq!(
            ok(b"\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\xff."),
            Value::Int(i64::MIN)
        );
        assert_eq!(ok(b"\x8a\x00."), Value::Int(0));
        // 2^63 does not fit.
        let e = loads("t", b"\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00.").unwrap_err();
        assert!(e.to_string().contains("64 bits"), "{e}");
        assert_eq!(ok(b"\x8b\x02\x00\x00\x00\xfe\xff."), Value::Int(-2));
    }

    #[test]
    fn floats() {
        assert_eq!(ok(b"G\x3f\xf8\x00\x00\x00\x00\x00\x00."), Value::Float(1.5));
        assert_eq!(ok(b"F-2.25\n."), Value::Float(-2.25));
    }

    #[test]
    fn strings_and_bytes() {
        assert_eq!(ok(b"\x8c\x03abc."), s("abc"));
        assert_eq!(ok(b"X\x02\x00\x00\x00\xc3\xa9."), s("\u{e9}"));
        assert_eq!(ok(b"\x8d\x01\x00\x00\x00\x00\x00\x00\x00z."), s("z"));
        assert_eq!(ok(b"Vcaf\\u00e9\n."), s("caf\u{e9}"));
        assert_eq!(ok(b"S'a\\nb'\n."), s("a\nb"));
        assert_eq!(ok(b"U\x02hi."), s("hi"));
        assert_eq!(
            ok(b"C\x02\x00\x01."),
            Value::Bytes(Rc::from(&b"\x00\x01"[..]))
        );
        assert_eq!(ok(b"N."), Value::None);
        assert_eq!(ok(b"\x88."), Value::Bool(true));
    }

    #[test]
    fn nested_tuples_lists_dicts() {
        // ((1, (2, 3)), [4], {'a': None})
        let v = ok(b"\x80\x04K\x01K\x02K\x03\x86\x86]K\x04a}\x8c\x01aNs\x87.");
        let t = v.as_seq().unwrap();
        assert_eq!(t.len(), 3);
        assert_eq!(
            t[0],
            Value::Tuple(Rc::new(vec![
                Value::Int(1),
                Value::Tuple(Rc::new(vec![Value::Int(2), Value::Int(3)]))
            ]))
        );
        assert_eq!(t[1], Value::List(Rc::new(vec![Value::Int(4)])));
        assert_eq!(t[2].get("a"), Some(&Value::None));
        // MARK ... TUPLE, LIST, DICT (protocol 0/1 style).
        let v = ok(b"(K\x01(K\x02tl.");
        assert_eq!(
            v,
            Value::List(Rc::new(vec![
                Value::Int(1),
                Value::Tuple(Rc::new(vec![Value::Int(2)]))
            ]))
        );
        let v = ok(b"(U\x01kK\x07d.");
        assert_eq!(v.get("k"), Some(&Value::Int(7)));
        assert_eq!(ok(b").").as_seq().unwrap().len(), 0);
    }

    #[test]
    fn memo_shares_completed_containers() {
        // l = [1]; [l, l] with l memoized while empty and filled afterwards.
        let v = ok(b"\x80\x04](]\x94K\x01ah\x00e.");
        let items = v.as_seq().unwrap();
        assert_eq!(items.len(), 2);
        assert_eq!(items[0], Value::List(Rc::new(vec![Value::Int(1)])));
        assert_eq!(items[0], items[1]);
        // PUT/GET text forms and LONG_BINPUT/LONG_BINGET.
        let v = ok(b"(U\x01xp7\ng7\nr\x09\x00\x00\x00j\x09\x00\x00\x00l.");
        assert_eq!(v.as_seq().unwrap().len(), 3);
        // GET of a never stored entry.
        assert!(loads("t", b"h\x03.").is_err());
        // Absurd memo index.
        assert!(loads("t", b"N\x72\xff\xff\xff\xff.").is_err());
    }

    #[test]
    fn deep_nesting_is_refused_not_overflowed() {
        // ((((...)))) a million deep: one byte per level.
        let mut b = vec![b'N'];
        b.extend(std::iter::repeat_n(0x85u8, 1_000_000));
        b.push(b'.');
        let e = loads("t", &b).unwrap_err().to_string();
        assert!(e.contains("nested more than"), "{e}");
        // Same through lists and APPEND, and through the memo.
        let mut b = vec![b']'];
        for _ in 0..100_000 {
            b.extend_from_slice(b"]\x94");
        }
        b.extend(std::iter::repeat_n(b'a', 100_000));
        b.push(b'.');
        assert!(loads("t", &b).is_err());
        // Through the memo: each level is memoized, popped and fetched back before nesting.
        let mut b = vec![b'N'];
        for i in 0..2000u32 {
            b.extend_from_slice(b"\x85\x940j");
            b.extend_from_slice(&i.to_le_bytes());
        }
        b.push(b'.');
        let e = loads("t", &b).unwrap_err().to_string();
        assert!(e.contains("nested more than"), "{e}");
        // 256 deep is fine.
        let mut b = vec![b'N'];
        b.extend(std::iter::repeat_n(0x85u8, 256));
        b.push(b'.');
        assert!(loads("t", &b).is_ok());
    }

    #[test]
    fn dup_pop_pop_mark() {
        assert_eq!(ok(b"K\x01K\x020."), Value::Int(1));
        assert_eq!(ok(b"K\x01(K\x02K\x031."), Value::Int(1));
        let v = ok(b"K\x012\x86.");
        assert_eq!(v.as_seq().unwrap(), &[Value::Int(1), Value::Int(1)]);
    }

    #[test]
    fn ordered_dict_only_through_reduce() {
        let v = ok(b"\x80\x02ccollections\nOrderedDict\n)R(U\x01aK\x01u.");
        assert_eq!(v.get("a"), Some(&Value::Int(1)));
        let v = ok(b"\x80\x04\x8c\x0bcollections\x8c\x0bOrderedDict\x93)\x81.");
        assert_eq!(v, Value::Dict(Rc::new(vec![])));
        // As a value, or called with arguments: refused.
        assert!(loads("t", b"ccollections\nOrderedDict\n.").is_err());
        assert!(loads("t", b"ccollections\nOrderedDict\nK\x01\x85R.").is_err());
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
}
