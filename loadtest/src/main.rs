//! Placeholder: the load-test harness (issue 3) lives here. It talks to the server over HTTP only.

fn main() {
    eprintln!("instinct-loadtest is not built yet: see loadtest/README.md");
    std::process::exit(2);
}
