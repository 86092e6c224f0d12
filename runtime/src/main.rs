fn main() {
    eprintln!("instinct: not built yet");
    std::process::exit(2);
}
