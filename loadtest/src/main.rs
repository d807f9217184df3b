fn main() {
    eprintln!("sieve-loadtest: not built yet (see the load-test issue)");
    std::process::exit(2);
}
