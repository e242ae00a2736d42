//! Builds the C++ entry points PyTorch calls (`cpp_shim/`), and the two test fixtures:
//! a fake `libcuda.so.1` (host memory behind the driver calls we use) and the C++ harness that
//! loads our cdylib with dlopen exactly as PyTorch does.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());

    // 1. The shim: torch_arena_malloc / torch_arena_free live in C++ so an OOM can be thrown as a
    //    C++ exception. rustc's version script exports only Rust symbols from a cdylib; a second
    //    version script (the linker merges them) exports the shim's.
    let shim = manifest.join("cpp_shim/shim.cpp");
    println!("cargo:rerun-if-changed=cpp_shim");
    if shim.exists() {
        cc::Build::new()
            .cpp(true)
            .std("c++17")
            .file(&shim)
            .include(manifest.join("cpp_shim"))
            .flag_if_supported("-fvisibility=hidden")
            .warnings(true)
            .extra_warnings(true)
            .compile("torch_arena_shim");
        let map = manifest.join("cpp_shim/exports.map");
        println!("cargo:rerun-if-changed={}", map.display());
        println!(
            "cargo:rustc-link-arg-cdylib=-Wl,--version-script={}",
            map.display()
        );
    }

    // 2. The fake CUDA driver, a shared library whose SONAME is libcuda.so.1.
    let fake = manifest.join("tests/fixtures/fakecuda.c");
    println!("cargo:rerun-if-changed=tests/fixtures");
    if fake.exists() {
        let dir = out.join("fakecuda");
        std::fs::create_dir_all(&dir).unwrap();
        let so = dir.join("libcuda.so.1");
        let compiler = cc::Build::new().pic(true).opt_level(2).get_compiler();
        run(compiler
            .to_command()
            .args(["-shared", "-Wl,-soname,libcuda.so.1", "-o"])
            .arg(&so)
            .arg(&fake)
            .arg("-lpthread"));
        println!("cargo:rustc-env=FAKE_LIBCUDA={}", so.display());
    }

    // 3. The C++ harness (an executable that dlopens the cdylib; it does not link against us).
    let harness = manifest.join("tests/harness/harness.cpp");
    println!("cargo:rerun-if-changed=tests/harness");
    if harness.exists() {
        let exe = out.join("torch_arena_harness");
        let compiler = cc::Build::new().cpp(true).opt_level(1).get_compiler();
        run(compiler
            .to_command()
            .args(["-std=c++17", "-o"])
            .arg(&exe)
            .arg(&harness)
            .arg(format!("-I{}", manifest.join("cpp_shim").display()))
            .args(["-ldl", "-lpthread"]));
        println!("cargo:rustc-env=TORCH_ARENA_HARNESS={}", exe.display());
    }
}

fn run(cmd: &mut Command) {
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("could not run {cmd:?}: {e}"));
    assert!(status.success(), "build step failed: {cmd:?}");
}
