"""Builds the tiny byte-level BPE tokenizer: the first NUM_RANKS ranks of the real Qwen3.5 vocabulary."""

import base64
import json
from pathlib import Path

import tiktoken
from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE

from tiny_common import NUM_RANKS, PRETOKENIZE_REGEX, QWEN_RANKS_FILE, SPECIAL_IDS, SPECIAL_TOKENS


def byte_level_alphabet() -> dict[int, str]:
    """The GPT-2 byte-level map: printable Latin-1 bytes stand for themselves, the rest move to U+0100 onwards."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    mapping = {byte: chr(byte) for byte in printable}
    next_code_point = 0x100
    for byte in range(256):
        if byte not in mapping:
            mapping[byte] = chr(next_code_point)
            next_code_point += 1
    return mapping


def read_ranks(limit: int) -> dict[bytes, int]:
    ranks = {}
    for line in QWEN_RANKS_FILE.read_bytes().splitlines():
        if not line:
            continue
        token_b64, rank = line.split()
        if int(rank) < limit:
            ranks[base64.b64decode(token_b64)] = int(rank)
    if sorted(ranks.values()) != list(range(limit)):
        raise ValueError(f"ranks 0..{limit} are not contiguous in {QWEN_RANKS_FILE}")
    return ranks


def split_by_lower_ranks(token: bytes, ranks: dict[bytes, int]) -> list[bytes]:
    """tiktoken's merge loop on `token`, allowing only merges ranked below the token itself."""
    ceiling = ranks[token]
    parts = [token[i : i + 1] for i in range(len(token))]
    while True:
        best = None
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and rank < ceiling and (best is None or rank < best[0]):
                best = (rank, i)
        if best is None:
            return parts
        i = best[1]
        parts[i : i + 2] = [parts[i] + parts[i + 1]]


def derive_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    merges = []
    for token, _rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) == 1:
            continue
        parts = split_by_lower_ranks(token, ranks)
        if len(parts) != 2:
            raise ValueError(f"token {token!r} is not one merge of two lower-ranked tokens: {parts}")
        merges.append((parts[0], parts[1]))
    return merges


def build_tokenizer() -> Tokenizer:
    ranks = read_ranks(NUM_RANKS)
    alphabet = byte_level_alphabet()

    def as_text(token: bytes) -> str:
        return "".join(alphabet[b] for b in token)

    vocab = {as_text(token): rank for token, rank in ranks.items()}
    merges = [(as_text(left), as_text(right)) for left, right in derive_merges(ranks)]
    tokenizer = Tokenizer(
        BPE(vocab=vocab, merges=merges, continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False)
    )
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(
        [AddedToken(token, special=True, normalized=False) for token in SPECIAL_TOKENS]
    )
    for token, expected_id in SPECIAL_IDS.items():
        if tokenizer.token_to_id(token) != expected_id:
            raise ValueError(f"{token} got id {tokenizer.token_to_id(token)}, expected {expected_id}")
    return tokenizer


def check_against_tiktoken(tokenizer: Tokenizer, texts: list[str]) -> None:
    """Our merges must tokenize exactly like tiktoken's rank-ordered BPE restricted to the same ranks."""
    reference = tiktoken.Encoding(
        "qwen3_5-tiny",
        pat_str=PRETOKENIZE_REGEX,
        mergeable_ranks=read_ranks(NUM_RANKS),
        special_tokens=SPECIAL_IDS,
    )
    for text in texts:
        ours = tokenizer.encode(text, add_special_tokens=False).ids
        theirs = reference.encode(text, allowed_special="all")
        if ours != theirs:
            raise ValueError(f"tiny tokenizer disagrees with tiktoken on {text[:80]!r}")


def tokenizer_config() -> dict:
    return {
        "tokenizer_class": "Qwen3_5Tokenizer",
        "add_prefix_space": False,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "errors": "replace",
        "split_special_tokens": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 262144,
        "added_tokens_decoder": {
            str(token_id): {
                "content": token,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for token, token_id in SPECIAL_IDS.items()
        },
    }


def write_tokenizer(out_dir: Path, check_texts: list[str]) -> None:
    tokenizer = build_tokenizer()
    check_against_tiktoken(tokenizer, check_texts)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=2) + "\n")
