"""Load the model a gate runs (a local folder, a hub id already in the local cache, or a GGUF file),
and build tiny randomly initialized Llama / Qwen2 models for tests.

Loading never downloads: ``local_files_only=True`` always (a gate must run offline, and a test
must never reach the network).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoadedModel:
    model: Any  # a transformers causal LM, in eval mode
    tokenizer: Any  # its tokenizer, with a pad token
    source: str  # what was loaded, for reports


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {name!r}")
    return DTYPES[name]


def load_model(
    path_or_id: str | Path,
    *,
    gguf_file: str | Path | None = None,
    dtype: str | torch.dtype = "float32",
    attn_implementation: str,
    device: str | torch.device = "cpu",
) -> LoadedModel:
    """A causal LM and its tokenizer. ``gguf_file`` (a path, or a name inside ``path_or_id``) loads
    a GGUF checkpoint, dequantized to ``dtype`` (transformers reads it with the ``gguf`` package).
    ``attn_implementation`` is required: GGUF and offline loads have no default to fall back on."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, extra = str(path_or_id), {}
    if gguf_file is not None:
        gguf = Path(gguf_file)
        if gguf.is_absolute() or gguf.exists():
            folder, gguf = str(gguf.resolve().parent), Path(gguf.name)
        if not (Path(folder) / gguf).is_file():
            raise FileNotFoundError(f"GGUF file {Path(folder) / gguf} does not exist")
        extra["gguf_file"] = str(gguf)
    elif Path(folder).exists() and not Path(folder).is_dir():
        raise ValueError(f"{folder} is a file; pass a GGUF file as gguf_file=")
    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=parse_dtype(dtype), attn_implementation=attn_implementation, local_files_only=True, **extra
    )
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True, **extra)
    if tokenizer.pad_token is None:  # only masked positions ever hold it
        tokenizer.pad_token = tokenizer.eos_token if tokenizer.eos_token is not None else tokenizer.unk_token
    source = f"{folder}/{extra['gguf_file']}" if extra else folder
    return LoadedModel(model.to(device).eval(), tokenizer, source)


TINY_ARCHITECTURES = ("llama", "qwen2")
TINY_SPECIAL_TOKENS = ("<pad>", "<s>", "</s>")  # ids 0, 1, 2; then one token per byte
TINY_VOCAB = len(TINY_SPECIAL_TOKENS) + 256


def tiny_tokenizer() -> Any:
    """A byte-level tokenizer with no merges (one token per UTF-8 byte), built offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {tok: i for i, tok in enumerate([*TINY_SPECIAL_TOKENS, *alphabet])}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    pad, bos, eos = TINY_SPECIAL_TOKENS
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token=pad, bos_token=bos, eos_token=eos)


def save_tiny(folder: str | Path, architecture: str = "llama", **kwargs: Any) -> Path:
    """A tiny model (``tiny_model``) and ``tiny_tokenizer`` saved to ``folder``, loadable by ``load_model``."""
    folder = Path(folder)
    tiny_model(architecture, **kwargs).save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder


def tiny_model(
    architecture: str = "llama",
    *,
    num_heads: int = 6,
    num_kv_heads: int = 2,
    head_dim: int = 16,
    num_layers: int = 2,
    vocab_size: int = TINY_VOCAB,
    sliding_window: int | None = None,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> Any:
    """A randomly initialized causal LM small enough for CPU tests. The default GQA ratio is 3, so
    a wrong head map (h % Hkv instead of h // group) sends most heads to the wrong KV head.

    Weights are drawn with a larger std than the usual 0.02 so that attention is far from uniform
    (a nearly uniform softmax would hide attention bugs)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    common: dict[str, Any] = {
        "vocab_size": vocab_size, "hidden_size": num_heads * head_dim, "intermediate_size": 2 * num_heads * head_dim,
        "num_hidden_layers": num_layers, "num_attention_heads": num_heads, "num_key_value_heads": num_kv_heads,
        "head_dim": head_dim, "max_position_embeddings": 4096, "initializer_range": 0.2, "pad_token_id": 0,
        "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False,
    }
    if architecture == "llama":
        if sliding_window is not None:
            raise ValueError("Llama has no sliding window; use architecture='qwen2'")
        config = LlamaConfig(**common)
        cls = LlamaForCausalLM
    elif architecture == "qwen2":
        window = {"use_sliding_window": True, "sliding_window": sliding_window, "max_window_layers": 0}
        config = Qwen2Config(**common, **(window if sliding_window else {}))
        cls = Qwen2ForCausalLM
    else:
        raise ValueError(f"architecture must be one of {TINY_ARCHITECTURES}, got {architecture!r}")
    torch.manual_seed(seed)
    config._attn_implementation = "sdpa"
    return cls(config).to(dtype).eval()
