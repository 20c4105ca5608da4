from roll.configs.loading import load_config


def tiny_overrides(model_path, tmp_path, *overrides):
    """Overrides that scale the default config down to a tiny model and a few short episodes."""
    base = [
        f"pretrain={model_path}", f"output_dir={tmp_path}/out", f"logging_dir={tmp_path}/out/logs",
        f"render_save_dir={tmp_path}/out/render", f"tracker_kwargs.log_dir={tmp_path}/out/tb",
        "max_steps=2", "save_steps=1", "eval_steps=1", "logging_steps=1",
        "rollout_batch_size=4", "train_env_manager.num_env_groups=2", "train_env_manager.group_size=2",
        "train_env_manager.num_groups_partition=[2]", "val_batch_size=2", "val_env_manager.num_env_groups=2",
        "val_env_manager.num_groups_partition=[2]", "max_actions_per_traj=2", "max_tokens_per_step=8",
        "sequence_length=2048", "actor_train.training_args.per_device_train_batch_size=2",
        "actor_train.training_args.gradient_accumulation_steps=1", "actor_train.training_args.learning_rate=1e-3",
        "actor_train.infer_batch_size=4",
        # a random tiny model scores alike in most groups: the default's replaying filter would triple each rollout
        "train_env_manager.group_filter_cls=null",
    ]
    return base + list(overrides)


# a reference role (hf_infer on device 0) for tests that turn a KL term on
REFERENCE = ("+reference.device_mapping=[0]", "+reference.strategy_args.strategy_name=hf_infer",
             "+reference.model_args.dtype=fp32", "+reference.infer_batch_size=4")


def tiny_config(model_path, tmp_path, *overrides):
    return load_config("agentic_sokoban", overrides=tiny_overrides(model_path, tmp_path, *overrides)).config


def run_recorded(cfg) -> dict[int, dict[str, float]]:
    """Run a pipeline on ``cfg`` in this process; every logged step's metrics, by step."""
    from roll.agentic.pipeline import AgenticPipeline
    from roll.utils.tracking import Tracker

    class Recorder(Tracker):
        def __init__(self):
            self.steps = {}

        def log(self, metrics, step):
            self.steps[step] = dict(metrics)

        def close(self):
            pass

    pipeline = AgenticPipeline(cfg)
    pipeline.tracker = recorder = Recorder()
    try:
        pipeline.run()
    finally:
        pipeline.shutdown()
    return recorder.steps


def run(cfg):
    """Run the pipeline on ``cfg`` and shut it down, whatever happens; returns the last step's metrics."""
    from roll.agentic.pipeline import AgenticPipeline

    pipeline = AgenticPipeline(cfg)
    try:
        return pipeline.run()
    finally:
        pipeline.shutdown()
