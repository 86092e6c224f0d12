//! AFL++ entry point of the `tokenizer` target (see `instinct_fuzz::tokenizer`).

fn main() {
    // Loaded before the fork server starts, so each run skips it.
    instinct_fuzz::init();
    afl::fuzz!(|data: &[u8]| instinct_fuzz::tokenizer(data));
}
