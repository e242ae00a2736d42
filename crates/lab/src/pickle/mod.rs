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

mod inflate;
mod opcodes;
mod unpickler;
mod value;

pub use self::inflate::{
    Inflate, MAX_DECOMPRESSED, MAX_INFLATE_RATIO, MAX_OBJECTS_PER_BYTE, MIN_INFLATE_ALLOWANCE,
    SNIFF_BYTES, gunzip_if_gzip, inflate_budget,
};
pub use self::value::{Pickle, Seq, Value};
use torch_arena::error::Result;

/// Unpickle `data` (already decompressed). `name` names the source in errors.
pub fn loads(name: &str, data: &[u8]) -> Result<Pickle> {
    unpickler::Unpickler::new(name, data).run()
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
