"""Load Hugging Face models and tokenizers from a local folder (or a hub id, where there is network).

Config names a model by ``path``; a path that exists on disk must be a folder with a ``config.json``. Any
other string that looks like a hub id (``org/name``) is handed to ``from_pretrained``, which downloads
it, or finds it in the local Hugging Face cache when offline.
"""

from __future__ import annotations

import os
import pathlib

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PretrainedConfig, PreTrainedModel

from hybridflow.errors import HybridflowError
from hybridflow.models.dtypes import DTYPES


class ModelLoadError(HybridflowError, ValueError):
    """A model or tokenizer path or option that cannot be loaded; the message names the value and the fix."""


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """Map a config string ("float32", "bf16", ...) to a torch dtype; a torch dtype passes through."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ModelLoadError(f"dtype={dtype!r} is not supported; choose one of {sorted(DTYPES)}")
    return DTYPES[dtype]


def resolve_model_path(path: str | os.PathLike) -> str:
    """Check a model path: a local folder must hold ``config.json``; a hub id is passed on unchanged.

    Raises ModelLoadError naming the path when a local-looking path is missing or is not a model folder.
    """
    text = os.fspath(path)
    local = pathlib.Path(text).expanduser()
    if local.exists():
        if not (local / "config.json").is_file():
            raise ModelLoadError(
                f"model path {text!r} exists but has no config.json: point it at a folder saved with "
                "save_pretrained (config.json, weights, tokenizer files)"
            )
        return str(local)
    if _looks_like_local_path(text):
        raise ModelLoadError(f"model path {text!r} does not exist: give an existing folder or a hub id like 'org/name'")
    return text


def _looks_like_local_path(text: str) -> bool:
    # A hub id is "name" or "org/name"; anything rooted, relative-dotted or deeper is meant as a folder.
    return text.startswith(("/", ".", "~")) or text.count("/") > 1


def load_model_config(path: str | os.PathLike, trust_remote_code: bool = False) -> PretrainedConfig:
    """The model's ``config.json`` as a transformers config."""
    return from_pretrained_or_raise(AutoConfig, resolve_model_path(path), trust_remote_code=trust_remote_code)


def load_tokenizer(
    path: str | os.PathLike,
    trust_remote_code: bool = False,
    padding_side: str | None = None,
    chat_template: str | None = None,
):
    """The tokenizer saved with the model. A tokenizer without a pad token pads with its EOS token;
    ``chat_template`` (a Jinja string) replaces the saved chat template."""
    kwargs = {"trust_remote_code": trust_remote_code}
    if padding_side is not None:
        kwargs["padding_side"] = padding_side
    tokenizer = from_pretrained_or_raise(AutoTokenizer, resolve_model_path(path), **kwargs)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if chat_template is not None:
        tokenizer.chat_template = chat_template
        _check_template_syntax(tokenizer)
    return tokenizer


def _check_template_syntax(tokenizer) -> None:
    """Render a one-message conversation: a template that does not parse fails here, not at the first row."""
    import jinja2

    try:
        tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    except jinja2.TemplateSyntaxError as error:
        raise ModelLoadError(
            f"model.custom_chat_template is not a valid Jinja template (line {error.lineno}: {error.message}); "
            "fix it, or set it to null to use the tokenizer's own"
        ) from None
    except jinja2.TemplateError:
        return  # it parses; it only refuses this probe conversation (e.g. one that needs a system turn)


def check_vocabulary(tokenizer, tokenizer_dir: str, model_path: str, trust_remote_code: bool = False) -> None:
    """Refuse a tokenizer with fewer than half as many tokens as the model has embedding rows: it is not the
    model's (a folder that lost ``tokenizer.json`` loads a few special tokens, and every prompt becomes the
    same few ids). Models pad their rows a little past the tokenizer, never to twice its size."""
    config = load_model_config(model_path, trust_remote_code)
    rows = getattr(config, "vocab_size", None) or getattr(config.get_text_config(), "vocab_size", None)
    if rows and 2 * len(tokenizer) < rows:
        raise ModelLoadError(
            f"the tokenizer loaded from {tokenizer_dir} has {len(tokenizer)} tokens but the model {model_path} has "
            f"vocab_size={rows}: it is not the model's tokenizer; copy the model's tokenizer files "
            "(tokenizer.json, ...) there"
        )


def load_causal_lm(
    path: str | os.PathLike,
    dtype: str | torch.dtype = "float32",
    attn_implementation: str = "sdpa",
    trust_remote_code: bool = False,
) -> PreTrainedModel:
    """A causal LM from ``path`` with weights in ``dtype`` and the given attention ("sdpa", "eager",
    "flash_attention_2", ...), on CPU; the caller moves or shards it."""
    return from_pretrained_or_raise(
        AutoModelForCausalLM,
        resolve_model_path(path),
        dtype=resolve_dtype(dtype),
        attn_implementation=attn_implementation,
        trust_remote_code=trust_remote_code,
    )


def from_pretrained_or_raise(auto_class, path: str, **kwargs):
    """``auto_class.from_pretrained(path, **kwargs)``, turning a load failure into a ModelLoadError."""
    try:
        return auto_class.from_pretrained(path, **kwargs)
    except OSError as error:
        raise ModelLoadError(
            f"could not load {auto_class.__name__} from {path!r}: {error}. Without network, download the model "
            "first and set the path to its local folder"
        ) from error
