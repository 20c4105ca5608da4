"""Merge a LoRA run's adapter into its base model and save a plain HF model folder.

    python -m roll.models.export --checkpoint output/agentic_sokoban/checkpoints/step_15 --out merged/

``--checkpoint`` is a checkpoint folder (its ``actor_train/adapter`` is used), or an adapter folder
itself. The base model is the one the adapter names (``adapter_config.json``), or ``--base``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path


def adapter_folder(path: str | Path) -> Path:
    """The peft adapter folder of a checkpoint folder, a role folder in it, or the adapter folder itself."""
    path = Path(path).expanduser()
    for candidate in (path, path / "adapter", path / "actor_train" / "adapter"):
        if (candidate / "adapter_config.json").is_file():
            return candidate
    raise FileNotFoundError(f"no LoRA adapter (adapter_config.json) in {path}, {path / 'adapter'} or "
                            f"{path / 'actor_train' / 'adapter'}")


def export_merged(checkpoint: str | Path, out: str | Path, base: str | None = None) -> Path:
    """Write ``out``: the base model with the adapter merged into its weights, and its tokenizer."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = adapter_folder(checkpoint)
    base = base or json.loads((folder / "adapter_config.json").read_text())["base_model_name_or_path"]
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, str(folder)).merge_and_unload()
    out = Path(out).expanduser()
    merged.save_pretrained(out)
    AutoTokenizer.from_pretrained(base).save_pretrained(out)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m roll.models.export", description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True, help="checkpoint folder (or its adapter folder)")
    p.add_argument("--out", required=True, help="folder to write the merged model to")
    p.add_argument("--base", default=None, help="base model folder (default: the one the adapter names)")
    args = p.parse_args(argv)
    try:
        out = export_merged(args.checkpoint, args.out, args.base)
    except FileNotFoundError as e:
        print(f"export error: {e}", file=sys.stderr)
        return 2
    print(f"merged model written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
