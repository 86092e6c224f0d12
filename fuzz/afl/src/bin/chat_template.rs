//! AFL++ entry point of the `chat_template` target (see `instinct_fuzz::chat_template`).

fn main() {
    // Loaded before the fork server starts, so each run skips it.
    instinct_fuzz::init();
    afl::fuzz!(|data: &[u8]| instinct_fuzz::chat_template(data));
}
