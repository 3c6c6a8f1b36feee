//! `carried_interposer!()`: the bytes of the interposer that the `mmkd` binary carries.
//!
//! The repo's build.rs names the file (`MMK_CARRIED_INTERPOSER`, where cargo puts the
//! `mmk-interposer` shared library it built as a dependency of the binary). By the time a
//! binary of the package compiles, its dependencies are built, so in a build the file is
//! there and this expands to `include_bytes!` of it (which also makes the binary rebuild
//! when the library changes). In `cargo check` or clippy, dependencies are only checked,
//! no library is built, and this expands to an empty slice: such a build carries nothing,
//! and runs nothing either.

use proc_macro::TokenStream;

#[proc_macro]
pub fn carried_interposer(_input: TokenStream) -> TokenStream {
    let path = std::env::var("MMK_CARRIED_INTERPOSER").unwrap_or_default();
    let code = if !path.is_empty() && std::path::Path::new(&path).is_file() {
        format!("include_bytes!({path:?}) as &[u8]")
    } else {
        "&[] as &[u8]".to_owned()
    };
    code.parse().unwrap_or_default()
}
