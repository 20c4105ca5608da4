"""Load tokenizers, causal LMs and value models from a ``model_args`` section."""

from __future__ import annotations

from typing import Any

import torch

from roll.models.dtypes import TORCH_DTYPES
from roll.models.logprobs import values_before_tokens
from roll.models.resolve import ensure_hf_folder

ATTN = {"fa2": "flash_attention_2", "fa": "flash_attention_2"}


def torch_dtype(name: str | None) -> torch.dtype | str:
    return TORCH_DTYPES[name] if name else "auto"


def load_tokenizer(model_args: Any) -> Any:
    from transformers import AutoTokenizer

    path = ensure_hf_folder(model_args.model_name_or_path, model_args.gguf_file)
    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=model_args.trust_remote_code)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def _kwargs(model_args: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"dtype": torch_dtype(model_args.dtype), "trust_remote_code": model_args.trust_remote_code}
    if model_args.attn_implementation:
        impl = ATTN.get(model_args.attn_implementation, model_args.attn_implementation)
        if impl == "flash_attention_2" and not torch.cuda.is_available():
            impl = "sdpa"  # flash attention needs CUDA; the CPU path uses SDPA with the same numerics
        kwargs["attn_implementation"] = impl
    return kwargs


def load_causal_lm(model_args: Any) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    path = ensure_hf_folder(model_args.model_name_or_path, model_args.gguf_file)
    return AutoModelForCausalLM.from_pretrained(path, **_kwargs(model_args))


class ValueModel(torch.nn.Module):
    """The LM's transformer body with a scalar head (the critic): ``forward`` returns, for each token
    t, the value of the state before it, V(x_<t) (see ``values_before_tokens``), aligned with the
    log-probs and the response mask."""

    def __init__(self, body: torch.nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.body = body
        self.value_head = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.value_head.weight)
        torch.nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        hidden = self.body(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).last_hidden_state
        return values_before_tokens(self.value_head(hidden.to(self.value_head.weight.dtype)).squeeze(-1))

    def gradient_checkpointing_enable(self, **kwargs: Any) -> None:
        self.body.gradient_checkpointing_enable(**kwargs)


def load_value_model(model_args: Any) -> ValueModel:
    from transformers import AutoModel

    path = ensure_hf_folder(model_args.model_name_or_path, model_args.gguf_file)
    body = AutoModel.from_pretrained(path, **_kwargs(model_args))
    model = ValueModel(body, body.config.hidden_size)
    return model.to(next(body.parameters()).dtype)
