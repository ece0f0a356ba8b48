"""Builds the model that `cargo xtask vllm up` serves, without any hub access.

Usage: python make_model.py OUT_DIR LAYERS HIDDEN INTERMEDIATE HEADS KV_HEADS

A random-init LlamaForCausalLM of that shape (vocab 32000, bfloat16 safetensors; vLLM casts to
the dtype it serves in) and a byte-level BPE tokenizer trained here on this interpreter's
standard-library sources. Everything is seeded, so the weights are the same on every machine;
the tokenizer depends only on the CPython version's sources. `cargo xtask vllm up` picks the
shape from the decode step it measures on the machine (`SIZES` in xtask/src/vllm_size.rs).
"""

import os
import pathlib
import random
import sys
import sysconfig

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import numpy as np  # noqa: E402
import torch  # noqa: E402
from tokenizers import (  # noqa: E402
    Tokenizer,
    decoders,
    models,
    pre_tokenizers,
    processors,
    trainers,
)
from transformers import (  # noqa: E402
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

SEED = 0
VOCAB = 32000
UNK, BOS, EOS = "<unk>", "<s>", "</s>"


def corpus():
    """The standard library's Python sources (tests and site-packages left out), in a fixed order."""
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "test", "tests", "idlelib"}
    files = sorted(
        p for p in stdlib.rglob("*.py") if not skip.intersection(p.relative_to(stdlib).parts)
    )
    for path in files:
        yield path.read_text(encoding="utf-8", errors="replace")


def tokenizer():
    """A byte-level BPE with Llama's special tokens (ids 0, 1, 2) that prepends BOS."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=[UNK, BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    if tok.get_vocab_size() != VOCAB:
        sys.exit(f"the tokenizer reached {tok.get_vocab_size()} tokens, not {VOCAB}")
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", special_tokens=[(BOS, tok.token_to_id(BOS))]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        model_max_length=2048,
    )


def model(layers, hidden, intermediate, heads, kv_heads):
    """Random weights from a fixed seed."""
    random.seed(SEED)
    np.random.seed(SEED)
    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=2048,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config).to(torch.bfloat16)


def main():
    if len(sys.argv) != 7 or not all(a.isdigit() for a in sys.argv[2:]):
        sys.exit(__doc__)
    out = pathlib.Path(sys.argv[1])
    shape = [int(a) for a in sys.argv[2:]]
    tokenizer().save_pretrained(out)
    m = model(*shape)
    m.save_pretrained(out)
    params = sum(p.numel() for p in m.parameters())
    print(f"make_model: {params / 1e6:.1f}M parameters in {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
