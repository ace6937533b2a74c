"""Load the model a gate runs (a local folder, a hub id already in the local cache, or a GGUF file),
and build tiny randomly initialized Llama / Qwen2 models for tests.

Loading never downloads: ``local_files_only=True`` always (a gate must run offline, and a test
must never reach the network).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from pa_oracle.gates.errors import GateInputError

if TYPE_CHECKING:  # transformers is imported where a model is built (``pa_oracle.gates`` imports without it)
    from transformers import PreTrainedModel

_Module = TypeVar("_Module", bound=torch.nn.Module)
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
        raise GateInputError(f"dtype must be one of {sorted(DTYPES)}, got {name!r}")
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
            raise GateInputError(f"GGUF file {Path(folder) / gguf} does not exist")
        extra["gguf_file"] = str(gguf)
    elif Path(folder).exists() and not Path(folder).is_dir():
        raise GateInputError(f"{folder} is a file; pass a GGUF file as gguf_file=")
    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=parse_dtype(dtype), attn_implementation=attn_implementation, local_files_only=True, **extra
    )
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True, **extra)
    if tokenizer.pad_token is None:  # only masked positions ever hold it
        tokenizer.pad_token = tokenizer.eos_token if tokenizer.eos_token is not None else tokenizer.unk_token
    source = f"{folder}/{extra['gguf_file']}" if extra else folder
    return LoadedModel(_moved(model, device).eval(), tokenizer, source)


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


def save_tiny(folder: str | Path, spec: TinySpec | None = None) -> Path:
    """A tiny model (``tiny_model(spec)``) and ``tiny_tokenizer`` saved to ``folder``, loadable by ``load_model``."""
    folder = Path(folder)
    tiny_model(spec or TinySpec()).save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder


@dataclass(frozen=True)
class TinySpec:
    """The shape of a tiny test model. The default GQA ratio is 3 (6 query heads, 2 KV heads), so a
    wrong head map (h % Hkv instead of h // group) sends most heads to the wrong KV head. Only
    ``qwen2`` has a ``sliding_window`` (in every layer)."""

    architecture: str = "llama"
    num_heads: int = 6
    num_kv_heads: int = 2
    head_dim: int = 16
    num_layers: int = 2
    vocab_size: int = TINY_VOCAB
    sliding_window: int | None = None

    def __post_init__(self) -> None:
        if self.architecture == "llama" and self.sliding_window is not None:
            raise ValueError("Llama has no sliding window; use architecture='qwen2'")
        if self.architecture not in TINY_ARCHITECTURES:
            raise ValueError(f"architecture must be one of {TINY_ARCHITECTURES}, got {self.architecture!r}")

    def build(self) -> PreTrainedModel:
        """The randomly initialized model of this shape (float32, seeded by the caller)."""
        from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

        width = self.num_heads * self.head_dim
        common: dict[str, Any] = {
            "vocab_size": self.vocab_size, "hidden_size": width, "intermediate_size": 2 * width,
            "num_hidden_layers": self.num_layers, "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads, "head_dim": self.head_dim, "max_position_embeddings": 4096,
            "initializer_range": 0.2, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
            "tie_word_embeddings": False,
        }
        if self.architecture == "llama":
            llama = LlamaConfig(**common)
            llama._attn_implementation = "sdpa"
            return LlamaForCausalLM(llama)
        window: dict[str, Any] = {"use_sliding_window": True, "sliding_window": self.sliding_window, "max_window_layers": 0}
        qwen2 = Qwen2Config(**common, **(window if self.sliding_window else {}))
        qwen2._attn_implementation = "sdpa"
        return Qwen2ForCausalLM(qwen2)


def tiny_model(spec: TinySpec | None = None, *, seed: int = 0, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """A randomly initialized causal LM of ``spec``'s shape (default ``TinySpec()``: Llama, GQA ratio 3),
    small enough for CPU tests, in eval mode.

    Weights are drawn with a larger std than the usual 0.02 so that attention is far from uniform
    (a nearly uniform softmax would hide attention bugs)."""
    spec = spec or TinySpec()
    torch.manual_seed(seed)
    return _moved(spec.build(), dtype).eval()


def _moved(model: _Module, where: torch.dtype | str | torch.device) -> _Module:
    """``model.to(where)`` (a module moves in place). Called through ``torch.nn.Module``'s signature:
    transformers wraps ``PreTrainedModel.to`` in ``functools.wraps``, which typeshed types as an
    unbound function; at run time transformers' own ``to`` runs all the same."""
    module: torch.nn.Module = model
    module.to(where)
    return model
