"""Methods mixed into every vLLM worker (``worker_extension_cls``), called through ``collective_rpc``.
Imported inside vLLM's worker processes only; it imports no vLLM itself."""

from __future__ import annotations

import torch


def pack_tensors(named_tensors: list) -> bytes:
    """One weight bucket as safetensors bytes. ``collective_rpc`` carries its arguments from the client to the
    engine process with msgpack, which turns a tensor nested in a list into a plain list (seen with vLLM 0.32's
    AsyncLLM); bytes cross whole, without pickle."""
    from safetensors.torch import save

    return save({str(name): tensor.contiguous() for name, tensor in named_tensors})


def unpack_tensors(payload: bytes) -> dict[str, torch.Tensor]:
    from safetensors.torch import load

    return load(payload)


class RollWorkerExtension:
    model_runner: object  # set by vLLM's worker

    def roll_load_weights(self, payload: bytes) -> int:
        """Load one bucket of HF-named full tensors (``pack_tensors``) through the model's own ``load_weights``
        (which stacks q/k/v and gate/up and takes this rank's tensor-parallel shard)."""
        model = self.model_runner.model
        device = next(model.parameters()).device
        tensors = unpack_tensors(payload)
        model.load_weights(weights=((name, tensor.to(device, non_blocking=True)) for name, tensor in tensors.items()))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return len(tensors)

    def roll_reload_file(self, path: str) -> int:
        """CPU build: a whole synced state (a safetensors file, HF names) through vLLM's layer-wise reload
        (``reload_weights``), which puts each layer back in checkpoint layout, loads it and re-runs its post-load
        processing (the oneDNN re-pack that plain ``load_weights`` cannot write into). One call for the whole state:
        a layer whose weights arrived in two reloads (q apart from k/v) would be re-packed half new."""
        from safetensors.torch import load_file

        state = load_file(path)
        config = getattr(getattr(self.model_runner, "model_config", None), "hf_config", None)
        if getattr(config, "tie_word_embeddings", False) and "lm_head.weight" not in state:
            # a tied head keeps its own packed copy of the embedding (for the logits GEMM); a reload that never
            # names it restores the old copy, so the head gets the new embedding under its own name
            embed = next((t for n, t in state.items() if n.endswith("embed_tokens.weight")), None)
            if embed is not None:
                state["lm_head.weight"] = embed
        self.reload_weights(weights_iterator=iter(state.items()), is_checkpoint_format=True)
        return len(state)
