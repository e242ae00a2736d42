//! The interpreter: a pickle machine over the named opcodes of [`super::opcodes`].

use std::collections::HashMap;

use super::inflate::MAX_OBJECTS_PER_BYTE;
use super::opcodes::*;
use super::value::{Obj, Pickle, Val};
use torch_arena::error::{Error, Result};

const ALLOWED: &str = "snapshots contain only plain data (dicts, lists, tuples, strings, numbers, \
                       collections.OrderedDict)";

pub(super) struct Unpickler<'a> {
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
    pub(super) fn new(name: &'a str, data: &'a [u8]) -> Self {
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
        v.type_name(&self.objs)
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

    /// Run the machine to STOP: one opcode per iteration, one `match` arm per opcode.
    pub(super) fn run(mut self) -> Result<Pickle> {
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
                PROTO => self.proto()?,
                FRAME => {
                    let n = self.u64()?;
                    self.len_arg(n)?;
                }
                STOP => return self.stop(),
                MARK => self.marks.push(self.stack.len()),
                POP => self.pop_op()?,
                POP_MARK => {
                    self.pop_mark()?;
                }
                DUP => {
                    let top = self.top()?;
                    self.stack.push(top);
                }
                FLOAT => self.float_line()?,
                INT => {
                    let v = self.int_line(false)?;
                    self.stack.push(v);
                }
                LONG => {
                    let v = self.int_line(true)?;
                    self.stack.push(v);
                }
                BININT => {
                    let v = self.u32()? as i32;
                    self.stack.push(Val::Int(v as i64));
                }
                BININT1 => {
                    let v = self.u8()?;
                    self.stack.push(Val::Int(v as i64));
                }
                BININT2 => {
                    let v = self.u16()?;
                    self.stack.push(Val::Int(v as i64));
                }
                LONG1 => {
                    let n = self.u8()? as u64;
                    self.long_arg(n)?;
                }
                LONG4 => self.long4()?,
                BINFLOAT => {
                    let b = self.take(8)?;
                    let f = f64::from_be_bytes(b.try_into().unwrap_or([0; 8]));
                    self.stack.push(Val::Float(f));
                }
                NONE => self.stack.push(Val::None),
                NEWTRUE => self.stack.push(Val::Bool(true)),
                NEWFALSE => self.stack.push(Val::Bool(false)),
                SHORT_BINUNICODE | BINUNICODE | BINUNICODE8 => self.binunicode()?,
                UNICODE => self.unicode_line()?,
                STRING => self.string_line()?,
                BINSTRING => self.binstring()?,
                SHORT_BINSTRING => {
                    let n = self.u8()? as u64;
                    let n = self.len_arg(n)?;
                    let b = self.take(n)?;
                    self.legacy_str(b)?;
                }
                BINBYTES | SHORT_BINBYTES | BINBYTES8 | BYTEARRAY8 => self.binbytes()?,
                EMPTY_LIST => self.push_obj(Obj::List(Vec::new()))?,
                LIST => {
                    let items = self.pop_mark()?;
                    self.push_obj(Obj::List(items))?;
                }
                APPEND => {
                    let v = self.pop()?;
                    self.append_items(vec![v])?;
                }
                APPENDS => {
                    let items = self.pop_mark()?;
                    self.append_items(items)?;
                }
                EMPTY_DICT => self.push_obj(Obj::Dict(Vec::new()))?,
                DICT => {
                    let items = self.pop_mark()?;
                    self.push_obj(Obj::Dict(Vec::new()))?;
                    self.set_items(items)?;
                }
                SETITEM => {
                    let v = self.pop()?;
                    let k = self.pop()?;
                    self.set_items(vec![k, v])?;
                }
                SETITEMS => {
                    let items = self.pop_mark()?;
                    self.set_items(items)?;
                }
                EMPTY_TUPLE => self.push_obj(Obj::Tuple(Box::new([])))?,
                TUPLE => {
                    let items = self.pop_mark()?;
                    self.push_obj(Obj::Tuple(items.into_boxed_slice()))?;
                }
                TUPLE1..=TUPLE3 => self.small_tuple()?,
                PUT => {
                    let l = self.line_str()?;
                    let idx = self.memo_index(l)?;
                    self.memo_put(idx)?;
                }
                BINPUT => {
                    let idx = self.u8()? as u64;
                    self.memo_put(idx)?;
                }
                LONG_BINPUT => {
                    let idx = self.u32()? as u64;
                    self.memo_put(idx)?;
                }
                MEMOIZE => {
                    let idx = self.memo.len() as u64;
                    self.memo_put(idx)?;
                }
                GET => {
                    let l = self.line_str()?;
                    let idx = self.memo_index(l)?;
                    self.memo_get(idx)?;
                }
                BINGET => {
                    let idx = self.u8()? as u64;
                    self.memo_get(idx)?;
                }
                LONG_BINGET => {
                    let idx = self.u32()? as u64;
                    self.memo_get(idx)?;
                }
                GLOBAL => {
                    let module = self.line_str()?;
                    let gname = self.line_str()?;
                    self.global(module, gname)?;
                }
                STACK_GLOBAL => self.stack_global()?,
                REDUCE | NEWOBJ => self.call_class()?,
                BUILD => self.build()?,
                PERSID | BINPERSID => return Err(self.refuse("persistent ids")),
                EXT1..=EXT4 => return Err(self.refuse("extension registry globals")),
                INST => {
                    let module = self.line_str()?;
                    let gname = self.line_str()?;
                    return Err(self.refuse_global(module, gname));
                }
                OBJ => return Err(self.refuse("object instantiation")),
                NEWOBJ_EX => return Err(self.refuse("object instantiation")),
                EMPTY_SET..=FROZENSET => return Err(self.refuse("sets are not part of a snapshot")),
                NEXT_BUFFER | READONLY_BUFFER => return Err(self.refuse("out-of-band buffers")),
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

    /// PROTO: the protocol, 0 to 5.
    fn proto(&mut self) -> Result<()> {
        let p = self.u8()?;
        if p > 5 {
            return Err(self.err(format!("pickle protocol {p} is not supported (0 to 5 are)")));
        }
        Ok(())
    }

    /// STOP: the one value left on the stack is the pickle's root.
    fn stop(mut self) -> Result<Pickle> {
        let v = self.pop()?;
        if !self.stack.is_empty() || !self.marks.is_empty() {
            return Err(self.err("values left on the stack at STOP"));
        }
        if matches!(v, Val::Obj(i) if matches!(self.objs.get(i as usize), Some(Obj::OrderedDictClass)))
        {
            return Err(
                self.err("the pickle is the class collections.OrderedDict itself, not data")
            );
        }
        let mut p = Pickle {
            objs: self.objs,
            root: v,
            index: HashMap::new(),
            input_len: self.data.len(),
        };
        p.build_index();
        Ok(p)
    }

    /// POP: the top of the stack, or an empty mark frame's mark, as CPython does.
    fn pop_op(&mut self) -> Result<()> {
        if self.marks.last() == Some(&self.stack.len()) {
            // POP of an empty mark frame discards the mark, as CPython does.
            self.marks.pop();
        } else {
            self.pop()?;
        }
        Ok(())
    }

    /// FLOAT: a decimal float on a line.
    fn float_line(&mut self) -> Result<()> {
        let l = self.line_str()?;
        let f = l
            .trim()
            .parse::<f64>()
            .map_err(|_| self.err(format!("'{l}' is not a float")))?;
        self.stack.push(Val::Float(f));
        Ok(())
    }

    /// LONG1 and LONG4's argument: `n` little-endian two's-complement bytes.
    fn long_arg(&mut self, n: u64) -> Result<()> {
        let n = self.len_arg(n)?;
        let b = self.take(n)?;
        self.stack.push(Self::long_bytes(b));
        Ok(())
    }

    /// LONG4: a 4-byte signed length, then the bytes.
    fn long4(&mut self) -> Result<()> {
        let n = self.u32()? as i32;
        if n < 0 {
            return Err(self.err("negative LONG4 length"));
        }
        self.long_arg(n as u64)
    }

    /// SHORT_BINUNICODE, BINUNICODE, BINUNICODE8: a counted UTF-8 string.
    fn binunicode(&mut self) -> Result<()> {
        let n = match self.op {
            SHORT_BINUNICODE => self.u8()? as u64,
            BINUNICODE => self.u32()? as u64,
            _ => self.u64()?,
        };
        let n = self.len_arg(n)?;
        let b = self.take(n)?;
        self.str_value(b)
    }

    /// UNICODE: a raw-unicode-escaped string on a line.
    fn unicode_line(&mut self) -> Result<()> {
        let l = self.line()?;
        let s = decode_raw_unicode_escape(l)
            .ok_or_else(|| self.err("bad raw-unicode-escape sequence in UNICODE argument"))?;
        self.push_obj(Obj::Str(s.into()))
    }

    /// STRING: a quoted Python string literal on a line.
    fn string_line(&mut self) -> Result<()> {
        let l = self.line()?;
        let s = decode_string_repr(l)
            .ok_or_else(|| self.err("STRING argument is not a quoted Python string literal"))?;
        self.legacy_str(&s)
    }

    /// BINSTRING: a 4-byte signed length, then the bytes.
    fn binstring(&mut self) -> Result<()> {
        let n = self.u32()? as i32;
        if n < 0 {
            return Err(self.err("negative BINSTRING length"));
        }
        let n = self.len_arg(n as u64)?;
        let b = self.take(n)?;
        self.legacy_str(b)
    }

    /// BINBYTES, SHORT_BINBYTES, BINBYTES8, BYTEARRAY8: counted bytes.
    fn binbytes(&mut self) -> Result<()> {
        let n = match self.op {
            BINBYTES => self.u32()? as u64,
            SHORT_BINBYTES => self.u8()? as u64,
            _ => self.u64()?,
        };
        let n = self.len_arg(n)?;
        let b = self.take(n)?;
        self.push_obj(Obj::Bytes(Box::from(b)))
    }

    /// TUPLE1, TUPLE2, TUPLE3: a tuple of the top 1 to 3 items.
    fn small_tuple(&mut self) -> Result<()> {
        let n = (self.op - EXT4) as usize;
        if self.stack.len() < self.floor() + n {
            return Err(self.err("stack underflow"));
        }
        let items = self.stack.split_off(self.stack.len() - n);
        self.push_obj(Obj::Tuple(items.into_boxed_slice()))
    }

    /// STACK_GLOBAL: GLOBAL with the module and name popped from the stack.
    fn stack_global(&mut self) -> Result<()> {
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
            (Some(m), Some(n)) => self.global(&m, &n),
            _ => Err(self.err(format!(
                "STACK_GLOBAL needs two strings, found {} and {}",
                self.type_of(module),
                self.type_of(gname)
            ))),
        }
    }

    /// BUILD: accepted only as a no-op on a dict (no state, or an empty dict of state).
    fn build(&mut self) -> Result<()> {
        let state = self.pop()?;
        let top = self.top()?;
        let is_dict = |v: Val, empty: bool| matches!(v, Val::Obj(i) if matches!(self.objs.get(i as usize), Some(Obj::Dict(d)) if !empty || d.is_empty()));
        let ok = is_dict(top, false) && (state == Val::None || is_dict(state, true));
        if !ok {
            return Err(
                self.refuse("BUILD sets object state; only a dict with no state is accepted")
            );
        }
        Ok(())
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
