//! Carries the kernel scheduler's interposer in the `mmkd` binary. `mmk-interposer` is a
//! dependency of this package, so cargo builds its shared library (into
//! `target/<profile>/deps/`, for the target being built) before it compiles the binaries;
//! `src/bin/mmkd.rs` includes the file this script names in `MMK_CARRIED_INTERPOSER`
//! (through `mmk_carry::carried_interposer!`, which carries nothing in a check build).
//! mmkd writes it out when no interposer is installed beside it, so that
//! `cargo run --bin mmkd` and `cargo install` run the whole product.

fn main() {
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    // OUT_DIR is target/[<triple>/]<profile>/build/<package>-<hash>/out.
    let deps = out
        .ancestors()
        .nth(3)
        .expect("OUT_DIR is under target/<profile>/build")
        .join("deps");
    println!(
        "cargo:rustc-env=MMK_CARRIED_INTERPOSER={}",
        deps.join("libmmk_interposer.so").display()
    );
}
