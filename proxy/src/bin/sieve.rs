//! `sieve up` / `sieve score`: not built yet (waits for the real worker).
fn main() {
    eprintln!("sieve: not built yet");
    std::process::exit(2);
}
