//! Chat rendering of a Cua-S1 prompt (`[system, user]`, generation prompt on, thinking left at its
//! default, so the prompt ends with the open `<think>` line).

/// The built-in Qwen3.5 rendering of `[system, user]` with the generation prompt, byte-identical to
/// the checkpoint's own template for these two messages. Message contents are trimmed with Python
/// `str.strip` semantics, as the template does.
pub fn render_builtin(system: &str, user: &str) -> String {
    format!(
        "<|im_start|>system\n{}<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n<think>\n",
        py_strip(system),
        py_strip(user)
    )
}

/// Python's `str.strip()` with no argument: strips Unicode whitespace as Python defines it.
pub fn py_strip(s: &str) -> &str {
    s.trim_matches(is_py_whitespace)
}

/// Python's `str.isspace` for one character (Unicode White_Space plus the ASCII separators
/// 0x1C-0x1F, which Python also strips).
fn is_py_whitespace(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}
