//! AFL++ entry point of the `image` target (see `instinct_fuzz::image`).

fn main() {
    // Loaded before the fork server starts, so each run skips it.
    instinct_fuzz::init();
    afl::fuzz!(|data: &[u8]| instinct_fuzz::image(data));
}
