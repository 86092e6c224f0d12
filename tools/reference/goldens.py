"""Writes model/assets/tiny/goldens.json: fp32 CPU reference outputs of the tiny checkpoint.

For each golden prompt, for the base model and for base + text adapter (PEFT, unmerged, fp32), records the
final-normed hidden state at the last position, the 26 letter logits there, the letter probabilities for
n = 26 and n = 3, and their top-two margins. Uses the text path Cua uses (AutoModelForCausalLM), checked
against Qwen3_5ForConditionalGeneration. Run after make_tiny.py and tiny_adapters.py.
"""

import json
import sys
import time

import tokenizers
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3_5ForConditionalGeneration

from tiny_common import (
    LETTER_IDS,
    NUM_RANKS,
    TEXT_ADAPTER_DIR,
    TINY_DIR,
    assert_reference_kernels_absent,
    chat_messages,
    goldens_provenance,
    letter_readout,
    named_golden_prompts,
    render_chat,
    use_strict_fp32,
)

SCRIPTS = ["goldens.py", "tiny_common.py", "make_tiny.py", "tiny_tokenizer.py", "tiny_adapters.py"]
# The text path and the vision-language model's text path run the same code on the same weights.
PATH_AGREEMENT_TOLERANCE = 1e-5
# A random adapter that barely moves the answers would not test the LoRA path.
MIN_ADAPTER_EFFECT = 0.05


def load_text_model():
    model = AutoModelForCausalLM.from_pretrained(TINY_DIR, dtype=torch.float32, attn_implementation="eager")
    if type(model).__name__ != "Qwen3_5ForCausalLM" or model.config._attn_implementation != "eager":
        raise RuntimeError(f"unexpected text model {type(model).__name__} / {model.config._attn_implementation}")
    return model.eval()


def as_record(result: dict) -> dict:
    return {
        "final_hidden": result["final_hidden"].tolist(),
        "letter_logits": result["letter_logits"].tolist(),
        "probs_26": result["probs_26"].tolist(),
        "probs_3": result["probs_3"].tolist(),
        "argmax_26": int(result["probs_26"].argmax()),
        "argmax_3": int(result["probs_3"].argmax()),
        "margin_26": result["margin_26"],
        "margin_3": result["margin_3"],
    }


def check_hidden_is_final_normed(model, result: dict) -> None:
    """The captured hidden state must be the one the (tied) LM head multiplies."""
    embeddings = model.get_input_embeddings().weight.detach()
    recomputed = embeddings @ result["final_hidden"]
    if not torch.allclose(recomputed, result["logits"], atol=1e-4, rtol=1e-5):
        raise RuntimeError("captured hidden state does not produce the logits: not after the final norm?")


def check_text_paths_agree(text_model, ids: list[int]) -> float:
    vlm = Qwen3_5ForConditionalGeneration.from_pretrained(
        TINY_DIR, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    from_text = letter_readout(text_model, ids)
    from_vlm = letter_readout(vlm, ids)
    difference = max(
        float((from_text["logits"] - from_vlm["logits"]).abs().max()),
        float((from_text["final_hidden"] - from_vlm["final_hidden"]).abs().max()),
    )
    if difference > PATH_AGREEMENT_TOLERANCE:
        raise RuntimeError(f"CausalLM and ConditionalGeneration text paths differ by {difference}")
    return difference


def main() -> None:
    started = time.time()
    assert_reference_kernels_absent()
    use_strict_fp32()
    torch.manual_seed(0)

    tokenizer = AutoTokenizer.from_pretrained(TINY_DIR)
    messages = chat_messages()
    rendered, _ = render_chat(tokenizer)
    prompts = named_golden_prompts(tokenizer)
    if any(i >= NUM_RANKS for _, ids in prompts[:-1] for i in ids):
        raise RuntimeError("random golden prompts must avoid special tokens")

    base = load_text_model()
    base_results = {}
    for name, ids in prompts:
        base_results[name] = letter_readout(base, ids)
        check_hidden_is_final_normed(base, base_results[name])
    path_difference = check_text_paths_agree(base, prompts[4][1])

    adapted = PeftModel.from_pretrained(load_text_model(), TEXT_ADAPTER_DIR, is_trainable=False).eval()
    if any(p.dtype != torch.float32 for p in adapted.parameters()):
        raise RuntimeError("adapter or base not fp32")
    adapter_results = {name: letter_readout(adapted, ids) for name, ids in prompts}
    adapter_effect = max(
        float((base_results[n]["probs_26"] - adapter_results[n]["probs_26"]).abs().max()) for n, _ in prompts
    )
    if adapter_effect < MIN_ADAPTER_EFFECT:
        raise RuntimeError(f"the text adapter moves letter probabilities by only {adapter_effect}")

    cases = []
    for name, ids in prompts:
        case = {"name": name, "length": len(ids), "input_ids": ids}
        if name == "chat":
            case["messages"] = messages
            case["rendered"] = rendered
        case["base"] = as_record(base_results[name])
        case["text_adapter"] = as_record(adapter_results[name])
        cases.append(case)

    checkpoint_files = sorted(TINY_DIR.glob("*.safetensors")) + sorted(TEXT_ADAPTER_DIR.glob("*"))
    goldens = {
        **goldens_provenance(
            "fp32 CPU reference outputs of the tiny Qwen3.5 checkpoint, written by goldens.py",
            SCRIPTS,
            checkpoint_files,
            tokenizers=tokenizers.__version__,
        ),
        "settings": {
            "dtype": "float32",
            "device": "cpu",
            "tf32": False,
            "attn_implementation": "eager",
            "delta_rule_and_conv": "transformers pure-torch fallbacks (fla, causal_conv1d, kernels absent)",
            "model_class": "Qwen3_5ForCausalLM via AutoModelForCausalLM",
            "adapter": "PEFT LoRA unmerged, fp32, scale lora_alpha / r = 2",
            "final_hidden": "output of the final RMSNorm at the last position",
            "probs_n": "softmax over the first n letter logits",
            "margin_n": "top-1 minus top-2 of probs_n",
        },
        "letter_ids": LETTER_IDS,
        "checks": {
            "causal_vs_conditional_max_abs_diff": path_difference,
            "adapter_max_abs_prob_change": adapter_effect,
        },
        "cases": cases,
    }
    out = TINY_DIR / "goldens.json"
    out.write_text(json.dumps(goldens, indent=1) + "\n")

    summary = {
        name: {
            kind: [round(r["margin_26"], 3), round(r["margin_3"], 3), int(r["probs_26"].argmax())]
            for kind, r in (("base", base_results[name]), ("adapter", adapter_results[name]))
        }
        for name, _ in prompts
    }
    print(json.dumps({"margins [m26, m3, argmax26]": summary, "checks": goldens["checks"]}, indent=1))
    print(f"wrote {out} ({out.stat().st_size} bytes) in {time.time() - started:.1f} s")


if __name__ == "__main__":
    sys.exit(main())
