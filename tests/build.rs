//! Builds every WebAssembly guest the tests load (the example plugins, the
//! Python and JavaScript examples and the misbehaving fixtures) and exposes their paths as
//! constants in `OUT_DIR/guests.rs`.

include!("../xtask/src/guests.rs");

fn main() {
    let tests_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = tests_dir.parent().unwrap().to_path_buf();
    let target = root.join("target").join("guests");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());

    let mut guests = Vec::new();
    for manifest in [root.join("plugins/Cargo.toml"), tests_dir.join("fixtures/Cargo.toml")] {
        guests.extend(build_rust_guests(&cargo, &manifest, &target).unwrap_or_else(|e| panic!("{e}")));
    }
    let python = root.join("plugins/python/shouting");
    guests.push(
        build_python_guest(&python, &root.join("wit"), &target.join("python/shouting.wasm"))
            .unwrap_or_else(|e| panic!("{e}")),
    );

    let js = root.join("plugins/js/shouting-js");
    guests.push(
        build_js_guest(&js, &root.join("wit"), &target.join("js/shouting-js.wasm")).unwrap_or_else(|e| panic!("{e}")),
    );

    let mut consts = String::new();
    for g in &guests {
        let ident = g.name.to_uppercase().replace('-', "_");
        consts += &format!("pub const {ident}: &str = {:?};\n", g.wasm.display().to_string());
    }
    std::fs::write(
        PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("guests.rs"),
        consts,
    )
    .unwrap();

    for watched in [
        "wit",
        "plugin-sdk/src",
        "plugin-sdk/Cargo.toml",
        "plugins/Cargo.toml",
        "plugins/python/shouting/app.py",
        "plugins/js/shouting-js/rule.js",
        "plugins/js/shouting-js/package-lock.json",
        "plugins/js/shouting-js/package.json",
    ] {
        println!("cargo::rerun-if-changed={}", root.join(watched).display());
    }
    for dir in ["plugins", "tests/fixtures"] {
        for entry in std::fs::read_dir(root.join(dir)).unwrap().flatten() {
            let p = entry.path();
            if p.join("Cargo.toml").exists() {
                println!("cargo::rerun-if-changed={}", p.join("src").display());
                println!("cargo::rerun-if-changed={}", p.join("Cargo.toml").display());
            }
        }
    }
    println!(
        "cargo::rerun-if-changed={}",
        tests_dir.join("fixtures/Cargo.toml").display()
    );
}
