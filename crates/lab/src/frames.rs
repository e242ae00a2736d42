//! Which frame of a PyTorch snapshot's stack names an allocation's site.
//!
//! A snapshot recorded with `context="all"` lists, innermost first, the unwinder and allocator
//! machinery (`torch::unwind::unwind()`, `CapturedTraceback::gather`, the caching allocator,
//! dispatcher boxing), then ATen, then the Python frames that made the tensor. The site is the
//! first frame that means something to the person reading a replay:
//!
//! 1. the first Python frame (`*.py`) outside the `torch` package;
//! 2. else the first Python frame;
//! 3. else the first frame that is not machinery: not a function or file memory_viz skips
//!    (`torch/cuda/_memory_viz.py`'s `_frame_filter`), not the allocator, not unresolved
//!    (`??`, `unknown`, empty).
//!
//! None when every frame is machinery: the site is then "unknown" rather than the unwinder.

/// Function-name fragments memory_viz omits, and the caching allocator's own frames.
const MACHINERY_FUNCTIONS: &[&str] = &[
    "unwind::unwind",
    "CapturedTraceback::gather",
    "gather_with_cpp",
    "_start",
    "__libc_start_main",
    "PyEval_",
    "PyObject_",
    "PyFunction_",
    "CUDACachingAllocator",
    "CachingAllocator",
    "c10::cuda::",
];

/// File-name fragments memory_viz omits.
const MACHINERY_FILES: &[&str] = &[
    "core/boxing",
    "/Register",
    "/Redispatch",
    "pythonrun.c",
    "Modules/main.c",
    "Objects/call.c",
    "Objects/methodobject.c",
    "pycore_ceval.h",
    "ceval.c",
    "cpython/abstract.h",
];

/// One frame as the rules read it: its file name and its function name.
pub(crate) type Frame<'a> = (&'a str, &'a str);

fn is_python(f: &Frame) -> bool {
    f.0.ends_with(".py")
}

fn in_torch(f: &Frame) -> bool {
    f.0.contains("/torch/") || f.0.starts_with("torch/")
}

fn is_machinery(f: &Frame) -> bool {
    let (file, name) = *f;
    let unresolved = matches!(name, "" | "??" | "unknown") && matches!(file, "" | "??" | "unknown");
    unresolved
        || MACHINERY_FUNCTIONS.iter().any(|m| name.contains(m))
        || MACHINERY_FILES.iter().any(|m| file.contains(m))
}

/// The index in `frames` (innermost first) of the frame that names the site, per the module's
/// rules.
pub(crate) fn site_index(frames: &[Frame]) -> Option<usize> {
    frames
        .iter()
        .position(|f| is_python(f) && !in_torch(f))
        .or_else(|| frames.iter().position(is_python))
        .or_else(|| frames.iter().position(|f| !is_machinery(f)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(file: &'static str, _line: i64, name: &'static str) -> Frame<'static> {
        (file, name)
    }

    fn name_of(frames: &[Frame]) -> Option<String> {
        site_index(frames).map(|i| format!("{}:{}", frames[i].0, frames[i].1))
    }

    #[test]
    fn the_users_python_frame_wins_over_machinery_and_torch() {
        let frames = [
            frame("??", 0, "torch::unwind::unwind()"),
            frame(
                "??",
                0,
                "torch::CapturedTraceback::gather(bool, bool, bool)",
            ),
            frame(
                "??",
                0,
                "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc",
            ),
            frame(
                "aten/src/ATen/native/TensorFactories.cpp",
                10,
                "at::native::empty_cuda",
            ),
            frame(
                "/usr/lib/python3/site-packages/torch/nn/modules/linear.py",
                125,
                "forward",
            ),
            frame("train.py", 40, "step"),
        ];
        assert_eq!(name_of(&frames).as_deref(), Some("train.py:step"));
    }

    #[test]
    fn torch_python_frames_come_next_then_native_non_machinery() {
        let torch_only = [
            frame("??", 0, "torch::unwind::unwind()"),
            frame("/x/torch/nn/functional.py", 10, "linear"),
        ];
        assert_eq!(
            name_of(&torch_only).as_deref(),
            Some("/x/torch/nn/functional.py:linear")
        );
        let native = [
            frame("??", 0, "torch::unwind::unwind()"),
            frame("??", 0, "unknown"),
            frame(
                "c10/core/boxing/KernelFunction.h",
                1,
                "c10::BoxedKernel::call",
            ),
            frame(
                "aten/src/ATen/native/TensorFactories.cpp",
                10,
                "at::native::empty_cuda",
            ),
        ];
        assert_eq!(
            name_of(&native).as_deref(),
            Some("aten/src/ATen/native/TensorFactories.cpp:at::native::empty_cuda")
        );
    }

    #[test]
    fn only_machinery_is_no_site() {
        let frames = [
            frame("??", 0, "torch::unwind::unwind()"),
            frame("??", 0, "unknown"),
        ];
        assert_eq!(name_of(&frames), None);
        assert_eq!(name_of(&[]), None);
    }
}
