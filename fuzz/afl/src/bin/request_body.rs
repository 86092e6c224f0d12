//! AFL++ entry point of the `request_body` target (see `instinct_fuzz::request_body`).

fn main() {
    // Loaded before the fork server starts, so each run skips it.
    instinct_fuzz::init();
    afl::fuzz!(|data: &[u8]| instinct_fuzz::request_body(data));
}
