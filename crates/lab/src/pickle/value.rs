//! The value model: the object arena ([`Pickle`]), handles into it, and the borrowed [`Value`]
//! and [`Seq`] readers use.

use std::collections::HashMap;

/// A handle: a scalar inline, or an object in the arena.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Val {
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

impl Val {
    /// A short name of the Python type of this handle into `objs`, for error messages.
    pub(super) fn type_name(self, objs: &[Obj]) -> &'static str {
        match self {
            Val::None => "None",
            Val::Bool(_) => "bool",
            Val::Int(_) | Val::U64(_) => "int",
            Val::Big(_) => "int beyond 64 bits",
            Val::Float(_) => "float",
            Val::Obj(i) => match objs.get(i as usize) {
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
}

#[derive(Debug)]
pub(super) enum Obj {
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
pub(super) const INDEX_DICTS_ABOVE: usize = 16;

/// An unpickled file: an arena of objects and its root value.
pub struct Pickle {
    pub(super) objs: Vec<Obj>,
    pub(super) root: Val,
    /// Dict object → (string key → value of its last occurrence), for long dicts.
    pub(super) index: HashMap<u32, HashMap<Box<str>, Val>>,
    pub(super) input_len: usize,
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

    pub(super) fn build_index(&mut self) {
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
    pub(super) p: &'a Pickle,
    pub(super) v: Val,
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

    pub(super) fn obj(&self) -> Option<&'a Obj> {
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
        self.v.type_name(&self.p.objs)
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
