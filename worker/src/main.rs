fn main() {
    eprintln!("sieve-worker: not built yet");
    std::process::exit(2);
}
