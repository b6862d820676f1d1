//! `alpha-native`: train, sample, evaluate and benchmark GPT language models on the CPU.

/// Huge pages for the arenas (see the module).
#[global_allocator]
static ALLOCATOR: alpha_native::hugepages::HugePageAlloc = alpha_native::hugepages::HugePageAlloc;

fn main() {
    if let Err(msg) = alpha_native::cli::run(std::env::args_os().collect()) {
        eprintln!("error: {msg:#}");
        std::process::exit(1);
    }
}
