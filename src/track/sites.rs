//! Allocation sites: capturing the Python and native call stacks of an allocation, interning
//! them, and turning them into text at report time.
//!
//! # Capture (in the hook, before any arena or tracker lock is taken)
//!
//! - **Native**: `backtrace(3)` into a fixed array of instruction pointers. Nothing is resolved
//!   in the hook.
//! - **Python**: CPython's C API, found with `dlsym(RTLD_DEFAULT, ...)` once (no pyo3, no link
//!   to libpython). The algorithm of `shared/reference/dependencies.md` §4.2: skip when Python
//!   is absent, not initialised or finalising; `held = PyGILState_Check()`; when not held and
//!   `PyGILState_GetThisThreadState()` is NULL (a thread Python never saw) skip; otherwise
//!   `PyGILState_Ensure`, walk the frames from `PyThreadState_GetFrame` through
//!   `PyFrame_GetBack`, storing `(code object, line)`, intern the stack, release. A thread that
//!   shows no Python frames (autograd workers keep a thread state but run no Python) skips the
//!   next [`NO_FRAMES_SKIP`] captures without touching the GIL, then looks again (custom autograd
//!   Functions do run Python there).
//!
//! # Interning and references
//!
//! A stack is interned (frames → id, under the interner's own lock) while the GIL is still held:
//! the lock order is GIL → interner, and the GIL is never requested while the interner lock is
//! held. A *new* stack keeps the code-object references `PyFrame_GetCode` returned (so the code
//! objects, and the pointers that name them, stay valid for the life of the process); for a stack
//! already known they are dropped with `Py_DecRef`, still under the GIL and after the interner
//! lock is released.
//!
//! # Text (report time)
//!
//! Stacks are copied out under the interner lock; the lock is released; then the GIL is taken
//! (`PyGILState_Ensure`: the JSON exports are called through ctypes' `CDLL`, which releases it)
//! to read `co_filename` and `co_qualname` (`co_name` before 3.11). Native frames are resolved
//! with `dladdr` and the object's own ELF symbol table (static functions too), demangled when
//! they are legacy Rust symbols. Text is cached per frame. Leading frames of torch-arena itself
//! (the capture, the allocator, the exports) are dropped from native stacks.

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::io::{Read, Seek, SeekFrom};
use std::sync::Arc;

use once_cell::sync::{Lazy, OnceCell};
use parking_lot::Mutex;

use crate::json;

/// `sites` mode bit: capture Python frames.
pub const SITES_PYTHON: u8 = 1;
/// `sites` mode bit: capture native frames.
pub const SITES_NATIVE: u8 = 2;
/// Deepest stack kept, per kind.
pub const MAX_FRAMES: usize = 64;
/// Most distinct stacks interned; later new stacks get site 0 (not captured).
pub const MAX_STACKS: usize = 1 << 16;
/// Captures a thread skips after it showed no Python frames, before it looks again.
pub const NO_FRAMES_SKIP: u32 = 256;

/// One frame of a captured stack, as captured (not yet text).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Frame {
    /// A return address.
    Native(usize),
    /// A Python code object (a reference is held by the interner) and the line being run.
    Python { code: usize, line: i32 },
    /// A Python code object and the byte offset of the instruction being run (CPython ≥ 3.11):
    /// the line is computed from it at report time, which makes a capture several times cheaper
    /// than asking for the line in the hook.
    PythonAt { code: usize, lasti: i32 },
}

/// Interned stacks: frames (innermost first) → site id (1-based; 0 = none).
#[derive(Default)]
pub struct Interner {
    inner: Mutex<InternInner>,
}

#[derive(Default)]
struct InternInner {
    ids: HashMap<Box<[Frame]>, u32>,
    stacks: Vec<Arc<[Frame]>>,
}

impl Interner {
    /// The id of `frames` and whether it was new. `(0, false)` for an empty stack or a full table.
    pub fn intern(&self, frames: &[Frame]) -> (u32, bool) {
        if frames.is_empty() {
            return (0, false);
        }
        let mut g = self.inner.lock();
        if let Some(&id) = g.ids.get(frames) {
            return (id, false);
        }
        if g.stacks.len() >= MAX_STACKS {
            return (0, false);
        }
        g.stacks.push(Arc::from(frames));
        let id = g.stacks.len() as u32;
        g.ids.insert(frames.into(), id);
        (id, true)
    }

    /// The frames of site `id` (None for 0 or an unknown id).
    pub fn stack(&self, id: u32) -> Option<Arc<[Frame]>> {
        let g = self.inner.lock();
        g.stacks.get((id as usize).checked_sub(1)?).cloned()
    }

    /// Before `fork()` (`crate::fork`): holds the table's lock.
    pub fn fork_prepare(&self) {
        crate::fork::hold(&self.inner);
    }

    /// After `fork()`: gives back what [`Interner::fork_prepare`] held.
    ///
    /// # Safety
    /// Once after each `fork_prepare`, on the same thread.
    pub unsafe fn fork_release(&self, child: bool) {
        // SAFETY: the caller's contract.
        unsafe { crate::fork::release(&self.inner, child) };
    }

    /// Number of interned stacks.
    pub fn len(&self) -> usize {
        self.inner.lock().stacks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

// ---------------------------------------------------------------------------------------------
// Native capture.

/// Append the calling thread's return addresses (innermost first) to `out`.
#[inline(never)]
pub fn capture_native(out: &mut Vec<Frame>) {
    let mut buf = [std::ptr::null_mut::<c_void>(); MAX_FRAMES];
    // SAFETY: `buf` holds MAX_FRAMES pointers; backtrace writes at most that many.
    let n = unsafe { libc::backtrace(buf.as_mut_ptr(), MAX_FRAMES as c_int) };
    let n = usize::try_from(n).unwrap_or(0).min(MAX_FRAMES);
    out.extend(buf[..n].iter().map(|&p| Frame::Native(p as usize)));
}

// ---------------------------------------------------------------------------------------------
// CPython, found at run time.

type FnInt = unsafe extern "C" fn() -> c_int;
type FnPtr = unsafe extern "C" fn() -> *mut c_void;
type FnObj = unsafe extern "C" fn(*mut c_void) -> *mut c_void;
type FnObjInt = unsafe extern "C" fn(*mut c_void) -> c_int;
type FnObjVoid = unsafe extern "C" fn(*mut c_void);
type FnIntVoid = unsafe extern "C" fn(c_int);
type FnVoid = unsafe extern "C" fn();
type FnObjIntInt = unsafe extern "C" fn(*mut c_void, c_int) -> c_int;
type FnGetAttr = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;
type FnUtf8 = unsafe extern "C" fn(*mut c_void, *mut isize) -> *const c_char;

/// The CPython functions we call (all exported by 3.10–3.13).
struct Py {
    is_initialized: FnInt,
    is_finalizing: Option<FnInt>,
    gil_check: FnInt,
    gil_ensure: FnInt,
    gil_release: FnIntVoid,
    this_thread_state: FnPtr,
    thread_state_get: FnPtr,
    thread_state_get_frame: FnObj,
    frame_get_code: FnObj,
    frame_get_line: FnObjInt,
    /// `PyFrame_GetLasti` and `PyCode_Addr2Line` (3.11+): lines deferred to report time.
    frame_get_lasti: Option<FnObjInt>,
    code_addr2line: Option<FnObjIntInt>,
    frame_get_back: FnObj,
    decref: FnObjVoid,
    getattr: FnGetAttr,
    as_utf8: FnUtf8,
    err_clear: FnVoid,
}

/// `dlsym(RTLD_DEFAULT, name)` as a function pointer of type `T`.
///
/// # Safety
/// `T` must be the function pointer type of the symbol `name`.
unsafe fn sym<T: Copy>(name: &CStr) -> Option<T> {
    // SAFETY: dlsym with a NUL-terminated name; RTLD_DEFAULT searches the global scope.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    if p.is_null() {
        None
    } else {
        debug_assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
        // SAFETY: the caller names the right type; function pointers are pointer-sized.
        Some(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) })
    }
}

static PY: OnceCell<Option<Py>> = OnceCell::new();

/// The CPython API of this process, resolved once (None: no Python here).
fn python() -> Option<&'static Py> {
    PY.get_or_init(|| {
        // SAFETY: each symbol is named with its C signature above.
        unsafe {
            Some(Py {
                is_initialized: sym(c"Py_IsInitialized")?,
                is_finalizing: sym(c"Py_IsFinalizing").or_else(|| sym(c"_Py_IsFinalizing")),
                gil_check: sym(c"PyGILState_Check")?,
                gil_ensure: sym(c"PyGILState_Ensure")?,
                gil_release: sym(c"PyGILState_Release")?,
                this_thread_state: sym(c"PyGILState_GetThisThreadState")?,
                thread_state_get: sym(c"PyThreadState_Get")?,
                thread_state_get_frame: sym(c"PyThreadState_GetFrame")?,
                frame_get_code: sym(c"PyFrame_GetCode")?,
                frame_get_line: sym(c"PyFrame_GetLineNumber")?,
                frame_get_lasti: sym(c"PyFrame_GetLasti"),
                code_addr2line: sym(c"PyCode_Addr2Line"),
                frame_get_back: sym(c"PyFrame_GetBack")?,
                decref: sym(c"Py_DecRef")?,
                getattr: sym(c"PyObject_GetAttrString")?,
                as_utf8: sym(c"PyUnicode_AsUTF8AndSize")?,
                err_clear: sym(c"PyErr_Clear")?,
            })
        }
    })
    .as_ref()
}

impl Py {
    /// Initialised and not shutting down.
    fn usable(&self) -> bool {
        // SAFETY: both may be called at any time, with or without the GIL.
        unsafe { (self.is_initialized)() != 0 && self.is_finalizing.is_none_or(|f| f() == 0) }
    }
}

/// Whether this process has a usable Python interpreter (for tests and reports).
pub fn python_present() -> bool {
    python().is_some_and(Py::usable)
}

thread_local! {
    /// Captures still to skip on this thread because it showed no Python frames.
    static SKIP_PYTHON: Cell<u32> = const { Cell::new(0) };
}

/// Capture the calling thread's Python stack, put `native` (innermost, already captured) in front
/// of it and intern the whole under the GIL. `None`: no Python frames here (the caller interns
/// `native` alone).
pub fn capture_python(native: &[Frame], interner: &Interner) -> Option<u32> {
    let py = python()?;
    let skip = SKIP_PYTHON.try_with(|s| {
        let n = s.get();
        if n > 0 {
            s.set(n - 1);
        }
        n > 0
    });
    if skip.unwrap_or(true) || !py.usable() {
        return None;
    }
    // SAFETY: the CPython calls follow the algorithm above: the GIL is ensured before any frame
    // is touched and released after the last reference we drop; no lock of ours is held while
    // waiting for the GIL (the interner lock is taken and released inside).
    unsafe {
        let held = (py.gil_check)() != 0;
        if !held && (py.this_thread_state)().is_null() {
            return None;
        }
        let state = (py.gil_ensure)();
        let mut frames: Vec<Frame> = Vec::with_capacity(native.len() + 16);
        frames.extend_from_slice(native);
        let tstate = (py.thread_state_get)();
        let mut frame = if tstate.is_null() {
            std::ptr::null_mut()
        } else {
            (py.thread_state_get_frame)(tstate)
        };
        let mut depth = 0;
        while !frame.is_null() {
            if depth == MAX_FRAMES {
                (py.decref)(frame);
                break;
            }
            let code = (py.frame_get_code)(frame);
            if !code.is_null() {
                frames.push(match (py.frame_get_lasti, py.code_addr2line) {
                    (Some(lasti), Some(_)) => Frame::PythonAt {
                        code: code as usize,
                        lasti: lasti(frame),
                    },
                    _ => Frame::Python {
                        code: code as usize,
                        line: (py.frame_get_line)(frame),
                    },
                });
                depth += 1;
            }
            let back = (py.frame_get_back)(frame);
            (py.decref)(frame);
            frame = back;
        }
        if depth == 0 {
            (py.gil_release)(state);
            let _ = SKIP_PYTHON.try_with(|s| s.set(NO_FRAMES_SKIP));
            return None;
        }
        let (id, new) = interner.intern(&frames);
        if !new {
            for f in &frames[native.len()..] {
                if let Frame::Python { code, .. } | Frame::PythonAt { code, .. } = *f {
                    (py.decref)(code as *mut c_void);
                }
            }
        }
        (py.gil_release)(state);
        Some(id)
    }
}

/// `co_filename` and `co_qualname` (else `co_name`) of each code object, and the line of each
/// byte offset given (`PyCode_Addr2Line`), read under the GIL. `None` for all when Python cannot
/// be entered (absent, finalising).
fn python_code_text(codes: &[(usize, Option<i32>)]) -> Option<Vec<(String, String, Option<i32>)>> {
    let py = python()?;
    if codes.is_empty() || !py.usable() {
        return None;
    }
    // SAFETY: the code objects are kept alive by the interner's references; every call is made
    // with the GIL held; each new reference is dropped.
    unsafe {
        let state = (py.gil_ensure)();
        let attr = |obj: *mut c_void, name: &CStr| -> Option<String> {
            let v = (py.getattr)(obj, name.as_ptr());
            if v.is_null() {
                (py.err_clear)();
                return None;
            }
            let mut len: isize = 0;
            let p = (py.as_utf8)(v, &mut len);
            let out = if p.is_null() || len < 0 {
                (py.err_clear)();
                None
            } else {
                let bytes = std::slice::from_raw_parts(p.cast::<u8>(), len as usize);
                Some(String::from_utf8_lossy(bytes).into_owned())
            };
            (py.decref)(v);
            out
        };
        let out = codes
            .iter()
            .map(|&(c, lasti)| {
                let obj = c as *mut c_void;
                let file = attr(obj, c"co_filename").unwrap_or_else(|| "?".into());
                let name = attr(obj, c"co_qualname")
                    .or_else(|| attr(obj, c"co_name"))
                    .unwrap_or_else(|| "?".into());
                let line = lasti.zip(py.code_addr2line).map(|(at, f)| f(obj, at));
                (file, name, line)
            })
            .collect();
        (py.gil_release)(state);
        Some(out)
    }
}

// ---------------------------------------------------------------------------------------------
// Text of frames.

/// One frame as text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrameText {
    pub filename: String,
    pub line: i64,
    pub name: String,
    /// "python" or "native".
    pub kind: &'static str,
    /// The return address of a native frame.
    pub ip: Option<usize>,
}

impl FrameText {
    /// The frame as a JSON object (the contract's frame schema).
    pub fn to_json(&self) -> String {
        let mut o = json::Object::new();
        o.str("filename", &self.filename)
            .int("line", self.line)
            .str("name", &self.name)
            .str("kind", self.kind);
        if let Some(ip) = self.ip {
            o.str("ip", &format!("{ip:#x}"));
        }
        o.finish()
    }
}

/// Cached text of frames.
#[derive(Default)]
pub struct Symbolizer {
    cache: Mutex<HashMap<Frame, Arc<FrameText>>>,
}

/// Native frame names that belong to torch-arena's own capture path, dropped from the top of
/// native stacks.
const OWN_FRAMES: &[&str] = &[
    "torch_arena::track::",
    "torch_arena::allocator::TorchArena::malloc",
    "torch_arena::abi::",
    "torch_arena_try_malloc",
    "torch_arena_malloc",
    "backtrace",
];

/// The exports an allocation enters torch-arena through: frames up to the outermost of them are
/// torch-arena's own.
const ENTRY_FRAMES: &[&str] = &["torch_arena_malloc+", "torch_arena_try_malloc+"];

impl Symbolizer {
    /// Before `fork()` (`crate::fork`): holds the cache's lock.
    pub fn fork_prepare(&self) {
        crate::fork::hold(&self.cache);
    }

    /// After `fork()`: gives back what [`Symbolizer::fork_prepare`] held.
    ///
    /// # Safety
    /// Once after each `fork_prepare`, on the same thread.
    pub unsafe fn fork_release(&self, child: bool) {
        // SAFETY: the caller's contract.
        unsafe { crate::fork::release(&self.cache, child) };
    }

    /// The text of `frames` (innermost first), leading torch-arena frames dropped. Takes the GIL
    /// for Python frames not seen before: call it with no lock of ours held.
    pub fn resolve(&self, frames: &[Frame]) -> Vec<Arc<FrameText>> {
        let missing: Vec<Frame> = {
            let cache = self.cache.lock();
            frames
                .iter()
                .filter(|f| !cache.contains_key(f))
                .copied()
                .collect()
        };
        if !missing.is_empty() {
            let codes: Vec<(usize, Option<i32>)> = missing
                .iter()
                .filter_map(|f| match *f {
                    Frame::Python { code, .. } => Some((code, None)),
                    Frame::PythonAt { code, lasti } => Some((code, Some(lasti))),
                    Frame::Native(_) => None,
                })
                .collect();
            let py_text = python_code_text(&codes);
            let mut made = Vec::with_capacity(missing.len());
            let mut ci = 0;
            for f in &missing {
                let t = match *f {
                    Frame::Python { .. } | Frame::PythonAt { .. } => {
                        let (file, name, at_line) = py_text
                            .as_ref()
                            .and_then(|v| v.get(ci).cloned())
                            .unwrap_or_else(|| ("?".into(), "?".into(), None));
                        ci += 1;
                        let line = match *f {
                            Frame::Python { line, .. } => line,
                            _ => at_line.unwrap_or(0),
                        };
                        FrameText {
                            filename: file,
                            line: line as i64,
                            name,
                            kind: "python",
                            ip: None,
                        }
                    }
                    Frame::Native(ip) => {
                        let (object, name) = resolve_native(ip);
                        FrameText {
                            filename: object,
                            line: 0,
                            name,
                            kind: "native",
                            ip: Some(ip),
                        }
                    }
                };
                made.push((*f, Arc::new(t)));
            }
            let mut cache = self.cache.lock();
            for (f, t) in made {
                cache.entry(f).or_insert(t);
            }
        }
        let cache = self.cache.lock();
        let mut out: Vec<Arc<FrameText>> = frames
            .iter()
            .filter_map(|f| cache.get(f).cloned())
            .collect();
        // Through the exports, everything up to the export itself is ours (with the Rust
        // runtime's catch_unwind frames in between); called from Rust, the leading frames of
        // torch-arena are.
        let native = out.iter().take_while(|t| t.kind == "native").count();
        let own = match out[..native]
            .iter()
            .rposition(|t| ENTRY_FRAMES.iter().any(|e| t.name.starts_with(e)))
        {
            Some(i) => i + 1,
            None => out[..native]
                .iter()
                .take_while(|t| OWN_FRAMES.iter().any(|o| t.name.contains(o)))
                .count(),
        };
        out.drain(..own);
        out
    }
}

// ---------------------------------------------------------------------------------------------
// Native symbols: dladdr, then the object's ELF symbol table.

/// Function symbols of one ELF object: sorted `(start, size, name)` at their link addresses, and
/// the bias to add for run-time addresses.
struct ElfSyms {
    funcs: Vec<(u64, u64, String)>,
}

static ELF_CACHE: Lazy<Mutex<HashMap<String, Option<Arc<ElfSyms>>>>> =
    Lazy::new(|| Mutex::new(HashMap::new()));

/// Before `fork()` (`crate::fork`): holds the symbol tables' cache (a leaf lock).
pub fn fork_prepare() {
    crate::fork::hold(&ELF_CACHE);
}

/// After `fork()`: gives back what [`fork_prepare`] held.
///
/// # Safety
/// Once after each `fork_prepare`, on the same thread.
pub unsafe fn fork_release(child: bool) {
    // SAFETY: the caller's contract.
    unsafe { crate::fork::release(&ELF_CACHE, child) };
}

/// `(object path, "symbol+0xoff")` of a return address (`"?"` where unknown).
pub fn resolve_native(ip: usize) -> (String, String) {
    // A return address points after the call: look up the byte before it.
    let at = ip.saturating_sub(1);
    let mut info: libc::Dl_info = libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    // SAFETY: dladdr only reads the loader's tables and writes `info`.
    let ok = unsafe { libc::dladdr(at as *const c_void, &mut info) } != 0;
    if !ok {
        return ("?".into(), format!("{ip:#x}"));
    }
    // SAFETY: dladdr's strings are NUL-terminated and live as long as the object stays loaded.
    let cstr = |p: *const c_char| {
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    };
    let mut object = cstr(info.dli_fname).unwrap_or_default();
    let base = info.dli_fbase as u64;
    let syms = elf_syms(&object).or_else(|| {
        // The main program is named by argv[0] (or ""): read it through /proc.
        let exe = elf_syms("/proc/self/exe")?;
        if object.is_empty() {
            object = std::fs::read_link("/proc/self/exe")
                .map(|p| p.display().to_string())
                .unwrap_or_default();
        }
        Some(exe)
    });
    if let Some(syms) = syms.as_ref().and_then(|s| lookup(s, base, at as u64)) {
        return (object, syms);
    }
    match (cstr(info.dli_sname), info.dli_saddr as usize) {
        (Some(name), saddr) if saddr != 0 => (
            object,
            format!("{}+{:#x}", demangle(&name), ip.saturating_sub(saddr)),
        ),
        _ => (object, format!("{:#x}", ip.saturating_sub(base as usize))),
    }
}

/// The function containing run-time address `addr` in an object loaded at `base`.
fn lookup(s: &ElfSyms, base: u64, addr: u64) -> Option<String> {
    let rel = addr.checked_sub(base)?;
    let i = s.funcs.partition_point(|&(start, _, _)| start <= rel);
    let (start, size, name) = s.funcs.get(i.checked_sub(1)?)?;
    (rel < start + (*size).max(1)).then(|| format!("{}+{:#x}", demangle(name), rel + 1 - start))
}

fn elf_syms(path: &str) -> Option<Arc<ElfSyms>> {
    if path.is_empty() {
        return None;
    }
    if let Some(hit) = ELF_CACHE.lock().get(path) {
        return hit.clone();
    }
    let read = read_elf_syms(path).map(Arc::new);
    ELF_CACHE.lock().insert(path.to_string(), read.clone());
    read
}

/// Parse a 64-bit little-endian ELF file's `.symtab` (else `.dynsym`) function symbols, relative
/// to its lowest loaded address (so `run-time address - dli_fbase` finds them). Reads only the
/// headers and the two sections.
fn read_elf_syms(path: &str) -> Option<ElfSyms> {
    let mut f = std::fs::File::open(path).ok()?;
    let mut hdr = [0u8; 64];
    f.read_exact(&mut hdr).ok()?;
    if &hdr[..4] != b"\x7fELF" || hdr[4] != 2 || hdr[5] != 1 {
        return None;
    }
    let u16_at = |b: &[u8], o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
    let u32_at = |b: &[u8], o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
    let u64_at = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
    let (phoff, shoff) = (u64_at(&hdr, 0x20), u64_at(&hdr, 0x28));
    let (phentsize, phnum) = (u16_at(&hdr, 0x36) as usize, u16_at(&hdr, 0x38) as usize);
    let (shentsize, shnum) = (u16_at(&hdr, 0x3a) as usize, u16_at(&hdr, 0x3c) as usize);
    if phentsize < 56 || shentsize < 64 || shnum == 0 {
        return None;
    }
    let read_at = |f: &mut std::fs::File, off: u64, len: usize| -> Option<Vec<u8>> {
        if len > (1 << 30) {
            return None;
        }
        let mut v = vec![0u8; len];
        f.seek(SeekFrom::Start(off)).ok()?;
        f.read_exact(&mut v).ok()?;
        Some(v)
    };
    let ph = read_at(&mut f, phoff, phentsize * phnum)?;
    let min_vaddr = (0..phnum)
        .map(|i| &ph[i * phentsize..])
        .filter(|p| u32_at(p, 0) == 1)
        .map(|p| u64_at(p, 16))
        .min()?
        & !0xfff;
    let sh = read_at(&mut f, shoff, shentsize * shnum)?;
    let section = |i: usize| &sh[i * shentsize..(i + 1) * shentsize];
    let table = (0..shnum)
        .find(|&i| u32_at(section(i), 4) == 2)
        .or_else(|| (0..shnum).find(|&i| u32_at(section(i), 4) == 11))?;
    let s = section(table);
    let (off, size, link) = (u64_at(s, 24), u64_at(s, 32), u32_at(s, 40) as usize);
    if link >= shnum {
        return None;
    }
    let strs = section(link);
    let symtab = read_at(&mut f, off, size as usize)?;
    let strtab = read_at(&mut f, u64_at(strs, 24), u64_at(strs, 32) as usize)?;
    let mut funcs = Vec::new();
    for sym in symtab.chunks_exact(24) {
        let (info, value, size) = (sym[4], u64_at(sym, 8), u64_at(sym, 16));
        if info & 0xf != 2 || value == 0 {
            continue;
        }
        let name_off = u32_at(sym, 0) as usize;
        let Some(rest) = strtab.get(name_off..) else {
            continue;
        };
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        let name = String::from_utf8_lossy(&rest[..end]).into_owned();
        funcs.push((value - min_vaddr.min(value), size, name));
    }
    funcs.sort_unstable_by_key(|f| f.0);
    Some(ElfSyms { funcs })
}

/// Legacy Rust mangling (`_ZN3foo3bar17h0123456789abcdefE` → `foo::bar`); anything else is
/// returned as it is.
pub fn demangle(sym: &str) -> String {
    let Some(body) = sym.strip_prefix("_ZN").or_else(|| sym.strip_prefix("__ZN")) else {
        return sym.to_string();
    };
    let mut parts: Vec<String> = Vec::new();
    let mut rest = body;
    loop {
        if rest.starts_with('E') || rest.is_empty() {
            break;
        }
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let Ok(n) = rest[..digits].parse::<usize>() else {
            return sym.to_string();
        };
        let Some(part) = rest.get(digits..digits + n) else {
            return sym.to_string();
        };
        parts.push(part.to_string());
        rest = &rest[digits + n..];
    }
    if parts
        .last()
        .is_some_and(|h| h.len() == 17 && h.starts_with('h'))
    {
        parts.pop();
    }
    let text = parts
        .iter()
        .map(|p| {
            let p = p
                .strip_prefix('_')
                .filter(|q| q.starts_with('$'))
                .unwrap_or(p);
            p.replace("$LT$", "<")
                .replace("$GT$", ">")
                .replace("$RF$", "&")
                .replace("$BP$", "*")
                .replace("$C$", ",")
                .replace("$LP$", "(")
                .replace("$RP$", ")")
                .replace("$u20$", " ")
                .replace("$u27$", "'")
                .replace("$u5b$", "[")
                .replace("$u5d$", "]")
                .replace("$u7b$", "{")
                .replace("$u7d$", "}")
                .replace("$u7e$", "~")
                .replace("..", "::")
        })
        .collect::<Vec<_>>()
        .join("::");
    if text.is_empty() {
        sym.to_string()
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legacy_rust_symbols_are_demangled() {
        assert_eq!(
            demangle("_ZN11torch_arena5track5sites14capture_native17h0123456789abcdefE"),
            "torch_arena::track::sites::capture_native"
        );
        assert_eq!(
            demangle(
                "_ZN4core3ptr56drop_in_place$LT$std..rt..lang_start$LT$$LP$$RP$$GT$$GT$17h0123456789abcdefE"
            ),
            "core::ptr::drop_in_place<std::rt::lang_start<()>>"
        );
        assert_eq!(demangle("cuMemAlloc_v2"), "cuMemAlloc_v2");
    }

    #[test]
    fn interning_gives_stable_ids() {
        let i = Interner::default();
        let a = [Frame::Native(1), Frame::Native(2)];
        let b = [Frame::Python { code: 7, line: 3 }];
        assert_eq!(i.intern(&a), (1, true));
        assert_eq!(i.intern(&b), (2, true));
        assert_eq!(i.intern(&a), (1, false));
        assert_eq!(i.intern(&[]), (0, false));
        assert_eq!(i.stack(2).as_deref(), Some(&b[..]));
        assert!(i.stack(0).is_none() && i.stack(3).is_none());
    }
}
