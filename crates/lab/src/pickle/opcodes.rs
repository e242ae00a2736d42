//! The pickle opcodes, named as CPython's `pickletools` names them (its one-line description
//! beside each), and their names for error messages.

/// MARK: push special markobject on stack.
pub(super) const MARK: u8 = b'(';
/// STOP: every pickle ends with STOP.
pub(super) const STOP: u8 = b'.';
/// POP: discard topmost stack item.
pub(super) const POP: u8 = b'0';
/// POP_MARK: discard stack top through topmost markobject.
pub(super) const POP_MARK: u8 = b'1';
/// DUP: duplicate top stack item.
pub(super) const DUP: u8 = b'2';
/// FLOAT: push float object; decimal string argument.
pub(super) const FLOAT: u8 = b'F';
/// INT: push integer or bool; decimal string argument.
pub(super) const INT: u8 = b'I';
/// BININT: push four-byte signed int.
pub(super) const BININT: u8 = b'J';
/// BININT1: push 1-byte unsigned int.
pub(super) const BININT1: u8 = b'K';
/// LONG: push long; decimal string argument.
pub(super) const LONG: u8 = b'L';
/// BININT2: push 2-byte unsigned int.
pub(super) const BININT2: u8 = b'M';
/// NONE: push None.
pub(super) const NONE: u8 = b'N';
/// PERSID: push persistent object; id is taken from string arg.
pub(super) const PERSID: u8 = b'P';
/// BINPERSID: push persistent object; id is taken from stack.
pub(super) const BINPERSID: u8 = b'Q';
/// REDUCE: apply callable to argtuple, both on stack.
pub(super) const REDUCE: u8 = b'R';
/// STRING: push string; NL-terminated string argument.
pub(super) const STRING: u8 = b'S';
/// BINSTRING: push string; counted binary string argument.
pub(super) const BINSTRING: u8 = b'T';
/// SHORT_BINSTRING: push string; counted binary string argument < 256 bytes.
pub(super) const SHORT_BINSTRING: u8 = b'U';
/// UNICODE: push Unicode string; raw-unicode-escaped'd argument.
pub(super) const UNICODE: u8 = b'V';
/// BINUNICODE: push Unicode string; counted UTF-8 string argument.
pub(super) const BINUNICODE: u8 = b'X';
/// APPEND: append stack top to list below it.
pub(super) const APPEND: u8 = b'a';
/// BUILD: call __setstate__ or __dict__.update().
pub(super) const BUILD: u8 = b'b';
/// GLOBAL: push self.find_class(modname, name); 2 string args.
pub(super) const GLOBAL: u8 = b'c';
/// DICT: build a dict from stack items.
pub(super) const DICT: u8 = b'd';
/// EMPTY_DICT: push empty dict.
pub(super) const EMPTY_DICT: u8 = b'}';
/// APPENDS: extend list on stack by topmost stack slice.
pub(super) const APPENDS: u8 = b'e';
/// GET: push item from memo on stack; index is string arg.
pub(super) const GET: u8 = b'g';
/// BINGET: push item from memo on stack; index is 1-byte arg.
pub(super) const BINGET: u8 = b'h';
/// INST: build & push class instance.
pub(super) const INST: u8 = b'i';
/// LONG_BINGET: push item from memo on stack; index is 4-byte arg.
pub(super) const LONG_BINGET: u8 = b'j';
/// LIST: build list from topmost stack items.
pub(super) const LIST: u8 = b'l';
/// EMPTY_LIST: push empty list.
pub(super) const EMPTY_LIST: u8 = b']';
/// OBJ: build & push class instance.
pub(super) const OBJ: u8 = b'o';
/// PUT: store stack top in memo; index is string arg.
pub(super) const PUT: u8 = b'p';
/// BINPUT: store stack top in memo; index is 1-byte arg.
pub(super) const BINPUT: u8 = b'q';
/// LONG_BINPUT: store stack top in memo; index is 4-byte arg.
pub(super) const LONG_BINPUT: u8 = b'r';
/// SETITEM: add key+value pair to dict.
pub(super) const SETITEM: u8 = b's';
/// TUPLE: build tuple from topmost stack items.
pub(super) const TUPLE: u8 = b't';
/// EMPTY_TUPLE: push empty tuple.
pub(super) const EMPTY_TUPLE: u8 = b')';
/// SETITEMS: modify dict by adding topmost key+value pairs.
pub(super) const SETITEMS: u8 = b'u';
/// BINFLOAT: push float; arg is 8-byte float encoding.
pub(super) const BINFLOAT: u8 = b'G';
/// PROTO: identify pickle protocol.
pub(super) const PROTO: u8 = 0x80;
/// NEWOBJ: build object by applying cls.__new__ to argtuple.
pub(super) const NEWOBJ: u8 = 0x81;
/// EXT1: push object from extension registry; 1-byte index.
pub(super) const EXT1: u8 = 0x82;
/// EXT2: ditto, but 2-byte index.
pub(super) const EXT2: u8 = 0x83;
/// EXT4: ditto, but 4-byte index.
pub(super) const EXT4: u8 = 0x84;
/// TUPLE1: build 1-tuple from stack top.
pub(super) const TUPLE1: u8 = 0x85;
/// TUPLE2: build 2-tuple from two topmost stack items.
pub(super) const TUPLE2: u8 = 0x86;
/// TUPLE3: build 3-tuple from three topmost stack items.
pub(super) const TUPLE3: u8 = 0x87;
/// NEWTRUE: push True.
pub(super) const NEWTRUE: u8 = 0x88;
/// NEWFALSE: push False.
pub(super) const NEWFALSE: u8 = 0x89;
/// LONG1: push long from < 256 bytes.
pub(super) const LONG1: u8 = 0x8a;
/// LONG4: push really big long.
pub(super) const LONG4: u8 = 0x8b;
/// BINBYTES: push bytes; counted binary string argument.
pub(super) const BINBYTES: u8 = b'B';
/// SHORT_BINBYTES: push bytes; counted binary string argument < 256 bytes.
pub(super) const SHORT_BINBYTES: u8 = b'C';
/// SHORT_BINUNICODE: push short string; UTF-8 length < 256 bytes.
pub(super) const SHORT_BINUNICODE: u8 = 0x8c;
/// BINUNICODE8: push very long string.
pub(super) const BINUNICODE8: u8 = 0x8d;
/// BINBYTES8: push very long bytes string.
pub(super) const BINBYTES8: u8 = 0x8e;
/// EMPTY_SET: push empty set on the stack.
pub(super) const EMPTY_SET: u8 = 0x8f;
/// ADDITEMS: modify set by adding topmost stack items.
pub(super) const ADDITEMS: u8 = 0x90;
/// FROZENSET: build frozenset from topmost stack items.
pub(super) const FROZENSET: u8 = 0x91;
/// NEWOBJ_EX: like NEWOBJ but work with keyword only arguments.
pub(super) const NEWOBJ_EX: u8 = 0x92;
/// STACK_GLOBAL: same as GLOBAL but using names on the stacks.
pub(super) const STACK_GLOBAL: u8 = 0x93;
/// MEMOIZE: store top of the stack in memo.
pub(super) const MEMOIZE: u8 = 0x94;
/// FRAME: indicate the beginning of a new frame.
pub(super) const FRAME: u8 = 0x95;
/// BYTEARRAY8: push bytearray.
pub(super) const BYTEARRAY8: u8 = 0x96;
/// NEXT_BUFFER: push next out-of-band buffer.
pub(super) const NEXT_BUFFER: u8 = 0x97;
/// READONLY_BUFFER: make top of stack readonly.
pub(super) const READONLY_BUFFER: u8 = 0x98;

/// The opcode's name, for error messages ("unknown" for a byte that is no opcode).
pub(super) fn op_name(op: u8) -> &'static str {
    match op {
        MARK => "MARK",
        STOP => "STOP",
        POP => "POP",
        POP_MARK => "POP_MARK",
        DUP => "DUP",
        FLOAT => "FLOAT",
        INT => "INT",
        BININT => "BININT",
        BININT1 => "BININT1",
        LONG => "LONG",
        BININT2 => "BININT2",
        NONE => "NONE",
        PERSID => "PERSID",
        BINPERSID => "BINPERSID",
        REDUCE => "REDUCE",
        STRING => "STRING",
        BINSTRING => "BINSTRING",
        SHORT_BINSTRING => "SHORT_BINSTRING",
        UNICODE => "UNICODE",
        BINUNICODE => "BINUNICODE",
        APPEND => "APPEND",
        BUILD => "BUILD",
        GLOBAL => "GLOBAL",
        DICT => "DICT",
        EMPTY_DICT => "EMPTY_DICT",
        APPENDS => "APPENDS",
        GET => "GET",
        BINGET => "BINGET",
        INST => "INST",
        LONG_BINGET => "LONG_BINGET",
        LIST => "LIST",
        EMPTY_LIST => "EMPTY_LIST",
        OBJ => "OBJ",
        PUT => "PUT",
        BINPUT => "BINPUT",
        LONG_BINPUT => "LONG_BINPUT",
        SETITEM => "SETITEM",
        TUPLE => "TUPLE",
        EMPTY_TUPLE => "EMPTY_TUPLE",
        SETITEMS => "SETITEMS",
        BINFLOAT => "BINFLOAT",
        PROTO => "PROTO",
        NEWOBJ => "NEWOBJ",
        EXT1 => "EXT1",
        EXT2 => "EXT2",
        EXT4 => "EXT4",
        TUPLE1 => "TUPLE1",
        TUPLE2 => "TUPLE2",
        TUPLE3 => "TUPLE3",
        NEWTRUE => "NEWTRUE",
        NEWFALSE => "NEWFALSE",
        LONG1 => "LONG1",
        LONG4 => "LONG4",
        BINBYTES => "BINBYTES",
        SHORT_BINBYTES => "SHORT_BINBYTES",
        SHORT_BINUNICODE => "SHORT_BINUNICODE",
        BINUNICODE8 => "BINUNICODE8",
        BINBYTES8 => "BINBYTES8",
        EMPTY_SET => "EMPTY_SET",
        ADDITEMS => "ADDITEMS",
        FROZENSET => "FROZENSET",
        NEWOBJ_EX => "NEWOBJ_EX",
        STACK_GLOBAL => "STACK_GLOBAL",
        MEMOIZE => "MEMOIZE",
        FRAME => "FRAME",
        BYTEARRAY8 => "BYTEARRAY8",
        NEXT_BUFFER => "NEXT_BUFFER",
        READONLY_BUFFER => "READONLY_BUFFER",
        _ => "unknown",
    }
}
