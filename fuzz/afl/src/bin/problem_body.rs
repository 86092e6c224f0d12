//! AFL++ entry point of the `problem_body` target (see `instinct_fuzz::problem_body`).

fn main() {
    // Loaded before the fork server starts, so each run skips it.
    instinct_fuzz::init();
    afl::fuzz!(|data: &[u8]| instinct_fuzz::problem_body(data));
}
