"""Checks of what a loaded config points at on this machine, run before anything starts (``--dry_run``
included): models exist, class paths import, every env the run uses can be built and reset with its
``env_config``, the output folder is writable, a resume path is a complete checkpoint.

Each failure is a ConfigError naming the key. Nothing here starts Ray, loads a model or writes a file
that stays (the writability probe removes itself). This part sits above ``roll.configs`` (which loads a config
with neither torch nor Ray) because these checks reach the runtime parts; they import them only where a config
names something that is not ours, so ``--dry_run`` of a shipped config stays free of torch and Ray.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from roll.configs import schema
from roll.configs.errors import ConfigError


def check_inputs(cfg: schema.PipelineConfig, rollout_only: bool = False) -> None:
    for role in schema.ROLES:
        worker = getattr(cfg, role, None)
        if worker is None or (rollout_only and role != "actor_infer"):
            continue
        _check_model(f"{role}.model_args.model_name_or_path", worker.model_args.model_name_or_path)
        _check_class_path(f"{role}.worker_cls", getattr(worker, "worker_cls", None), "worker")
        strategy = worker.strategy_args.strategy_name
        if "." in strategy:
            _check_class_path(f"{role}.strategy_args.strategy_name", strategy, "strategy")
    if not rollout_only:
        _check_embedding_adapter(cfg)
    validation = cfg.eval_steps > 0 and not rollout_only
    for name in ("train_env_manager", "val_env_manager") if validation else ("train_env_manager",):
        em = getattr(cfg, name)
        _check_class_path(f"{name}.worker_cls", em.worker_cls, "env_manager_worker")
        _check_class_path(f"{name}.env_manager_cls", em.env_manager_cls, "env_manager")
        _check_class_path(f"{name}.group_filter_cls", em.group_filter_cls, "group_filter")
    used = dict.fromkeys(cfg.train_env_manager.tags + (cfg.val_env_manager.tags if validation else []))
    for tag in used:
        # a hung constructor or reset stops the start like a hung step stops an episode
        limit = max(float(getattr(cfg, m).env_step_timeout) for m in ("train_env_manager", "val_env_manager"))
        _check_env(f"custom_envs.{tag}", cfg.custom_envs[tag], limit)
    _check_writable("output_dir", cfg.output_dir)
    if cfg.rollout_dump_dir:
        _check_writable("rollout_dump_dir", cfg.rollout_dump_dir)
    mock = cfg.rollout_mock
    if mock is not None and mock.enable:
        if mock.mode == "dump":
            _check_writable("rollout_mock.dump_dir", mock.dump_dir)
        else:
            _check_replay(mock.dump_dir, cfg)
    _check_resume(cfg.resume_from_checkpoint, cfg.output_dir)
    _check_local_gpus(cfg, rollout_only)


def _check_local_gpus(cfg: schema.PipelineConfig, rollout_only: bool) -> None:
    """On a GPU machine that starts its own Ray cluster, the devices named exist here (without a GPU, devices are
    virtual CPU slots; a joined or multi-node cluster is checked when Ray is up)."""
    if not gpu_driver() or os.environ.get("RAY_ADDRESS") or os.environ.get("WORLD_SIZE", "1") not in ("", "1"):
        return
    import torch  # only where a GPU can be: torch's import is most of a dry run's time

    if not torch.cuda.is_available():
        return
    from roll.distributed.resources import check_devices_fit

    roles = ["actor_infer"] if rollout_only else schema.ROLES
    check_devices_fit({r: getattr(cfg, r).device_mapping for r in roles
                       if getattr(cfg, r, None) is not None and isinstance(getattr(cfg, r).device_mapping, list)},
                      cfg.num_gpus_per_node, [torch.cuda.device_count()])


def gpu_driver() -> bool:
    """Whether this machine has a GPU driver torch can use: NVIDIA's, or ROCm's (AMD GPUs, which torch also
    reports through torch.cuda). Without one torch sees no GPU, so it need not be imported to ask."""
    return (Path("/proc/driver/nvidia/version").exists() or shutil.which("nvidia-smi") is not None
            or Path("/dev/kfd").exists())


def _check_model(path: str, name: str | None) -> None:
    if name is None:
        return
    from roll.models.resolve import locate

    try:
        folder, gguf = locate(str(name))
    except FileNotFoundError as e:
        raise ConfigError(path, str(e)) from None
    local = str(name).startswith(("/", "./", "../", "~")) or Path(folder).expanduser().exists()
    config = Path(folder).expanduser() / "config.json"
    if local and gguf is None and not config.is_file():
        raise ConfigError(path, f"{name!r} is not a model folder (no config.json there)")
    if _vision_language(str(name), config if local and config.is_file() else None):
        raise ConfigError(path, f"{name!r} is a vision-language model; those are not shipped (text envs with causal "
                          "language models only)")


def _check_embedding_adapter(cfg: schema.PipelineConfig) -> None:
    """An adapter on the input embedding of a model whose config.json ties the output head to it: a merge would
    move the head too (merged syncs, the export). Models without a config.json here (GGUF, hub ids) are checked
    when actor_train builds the adapter."""
    ma = cfg.actor_train.model_args
    names = {n.strip() for n in (ma.lora_target or "").split(",")}
    if not names & {"all-embedding", "embed_tokens"} or not ma.model_name_or_path:
        return
    import json

    from roll.models.resolve import locate

    folder, gguf = locate(str(ma.model_name_or_path))
    config = Path(folder).expanduser() / "config.json"
    if gguf is None and config.is_file() and json.loads(config.read_text()).get("tie_word_embeddings") is True:
        raise ConfigError("actor_train.model_args.lora_target",
                          f"{ma.lora_target!r} adapts the input embedding, but this model's output head shares that "
                          "weight (tie_word_embeddings); leave the embedding out")


def _vision_language(name: str, config: Path | None) -> bool:
    """A model with a vision tower: from its config.json when it is here, else from a hub id's -VL- name."""
    if config is not None:
        import json

        try:
            data = json.loads(config.read_text())
        except (OSError, ValueError):
            return False
        return "vision_config" in data
    return "-vl-" in f"-{name.rsplit('/', 1)[-1].lower()}-"


def class_bases(kind: str) -> tuple[type, ...]:
    """What a class path of each kind must derive from (a config may name our classes, ROLL's mapped to ours,
    or a user's own subclasses; never a function such as os.system)."""
    if kind == "worker":
        from roll.workers.base import RoleWorker

        return (RoleWorker,)
    if kind == "strategy":
        from roll.strategies.base import InferenceStrategy, TrainStrategy

        return (InferenceStrategy, TrainStrategy)
    if kind == "env_manager_worker":
        from roll.agentic.rollout import EnvManagerHost

        return (EnvManagerHost,)
    if kind == "env_manager":
        from roll.agentic.env_managers.base import TrajEnvManager

        return (TrajEnvManager,)
    if kind == "group_filter":
        from roll.agentic.group_filters import GroupFilter

        return (GroupFilter,)
    raise ValueError(f"unknown class kind {kind!r}")


def _check_class_path(path: str, value: str | None, kind: str) -> None:
    if not value:
        return
    from roll.configs.shipped import SHIPPED_CLASSES, roll_class

    target = roll_class(value)
    if SHIPPED_CLASSES.get(target) == kind:  # ours, of the right kind: no need to import it (and torch) here
        return
    from envs.registration import load_entry_point

    try:
        load_entry_point(target, class_bases(kind))
    except ValueError as e:
        raise ConfigError(path, str(e)) from None


def _check_env(path: str, entry: schema.CustomEnvConfig, timeout: float = 0.0) -> None:
    """Build the env with its env_config and reset it once: unknown ids, arguments the env does not take
    and values it refuses (dim_room [0, 0], num_boxes 1000, format_penalty 'abc') all show here. Each call is
    bounded by ``timeout`` seconds (env_step_timeout; 0: unbounded)."""
    from envs.registration import make_env
    from envs.task_data import DataUnavailable

    _check_class_path(f"{path}.env_manager_cls", entry.env_manager_cls, "env_manager")
    tools = _check_tools(f"{path}.tool_wrapper", entry.tool_wrapper) if entry.tool_wrapper else None
    try:
        env = _bounded(lambda: make_env(entry.env_type, entry.entry_point, **dict(entry.env_config or {})),
                       timeout, path, "building the env")
    except DataUnavailable as e:  # a data set that is not on this machine: said before anything starts
        raise ConfigError(f"{path}.env_config.dataset_name", str(e)) from None
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - whatever the env's constructor refuses, named by key
        raise ConfigError(f"{path}.env_config", _one_line(e)) from None
    if tools is not None:
        from envs.tools.tool_wrapper import ToolEnvWrapper

        env = ToolEnvWrapper(env, tools, **dict(entry.tool_wrapper.get("wrapper_args") or {}))
    try:
        _bounded(lambda: env.reset(seed=0), timeout, path, "env.reset")
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001
        raise ConfigError(f"{path}.env_config", f"the env fails to reset: {_one_line(e)}") from None
    if entry.num_demonstrations > 0:
        try:
            _bounded(lambda: env.demonstrations(1), timeout, path, "env.demonstrations")
        except (ValueError, NotImplementedError) as e:
            raise ConfigError(f"{path}.num_demonstrations", _one_line(e)) from None
    close = getattr(env, "close", None)
    if close is not None:
        close()


def _bounded(fn: Any, timeout: float, path: str, what: str) -> Any:
    """``fn()`` in a daemon thread, waited for at most ``timeout`` seconds (0: as long as it takes); a call
    that does not return in time is left behind and named in a ConfigError."""
    if not timeout:
        return fn()
    import threading

    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = e

    thread = threading.Thread(target=target, daemon=True, name=f"env-check-{path}")
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise ConfigError(f"{path}.env_config", f"{what} did not return within env_step_timeout={timeout:g} s "
                          "during the start-up check")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _check_tools(path: str, tool_wrapper: dict[str, Any]) -> list[Any]:
    """Build each tool of a tool_wrapper (a bad tool id, argument or sandbox type is named by its key); a
    search tool's server must accept connections now."""
    from envs.tools.tool_wrapper import make_tool

    if not isinstance(tool_wrapper, dict):
        raise ConfigError(path, f"must be a mapping with wrapper_args and tool_configs, got {tool_wrapper!r}")
    unknown = sorted(set(tool_wrapper) - {"wrapper_args", "tool_configs"})
    if unknown:
        raise ConfigError(f"{path}.{unknown[0]}", "is not a tool_wrapper key (keys: wrapper_args, tool_configs)")
    args = tool_wrapper.get("wrapper_args") or {}
    bad = sorted(set(args) - {"tool_reward", "tool_success_reward", "max_tool_uses"})
    if bad:
        raise ConfigError(f"{path}.wrapper_args.{bad[0]}", "is not a wrapper_args key (keys: tool_reward, "
                          "tool_success_reward, max_tool_uses)")
    for key in ("tool_reward", "tool_success_reward"):
        value = args.get(key, 0.0)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value or abs(value) == float("inf"):
            raise ConfigError(f"{path}.wrapper_args.{key}", f"must be a finite number, got {value!r}")
    uses = args.get("max_tool_uses", 10)
    if uses is not None and (not isinstance(uses, int) or isinstance(uses, bool) or uses < 0):
        raise ConfigError(f"{path}.wrapper_args.max_tool_uses", f"must be an integer >= 0 or null, got {uses!r}")
    configs = tool_wrapper.get("tool_configs") or []
    if not isinstance(configs, list) or not configs:
        raise ConfigError(f"{path}.tool_configs", "must list at least one {tool_id, tool_args}")
    tools = []
    for i, config in enumerate(configs):
        where = f"{path}.tool_configs[{i}]"
        if not isinstance(config, dict) or "tool_id" not in config:
            raise ConfigError(where, "must be a mapping with tool_id (and tool_args)")
        try:
            tool = make_tool(str(config["tool_id"]), config.get("tool_args"))
        except TypeError as e:
            raise ConfigError(f"{where}.tool_args", _one_line(e)) from None
        except ValueError as e:
            key = "tool_id" if "tool id" in str(e) or "not shipped" in str(e) else "tool_args"
            key = "tool_args.search_url" if "search_url" in str(e) else key
            raise ConfigError(f"{where}.{key}", str(e)) from None
        probe = getattr(tool, "probe", None)
        problem = probe() if probe is not None else None
        if problem:
            raise ConfigError(f"{where}.tool_args.search_url", f"{tool.search_url}: {problem}; start the retrieval "
                              "server first, or point search_url (or SEARCH_URL) at a running one")
        tools.append(tool)
    return tools


def _check_replay(folder: str, cfg: schema.PipelineConfig) -> None:
    """rollout_mock: mock replays every training step the run takes: each must have its dump."""
    from roll.agentic.rollout_dump import dumped_steps, step_file
    from roll.utils.checkpoint import read_state, resolve_resume

    resume = resolve_resume(cfg.resume_from_checkpoint, cfg.output_dir, verify=False)
    start = int(read_state(resume)["step"]) + 1 if resume is not None else 0
    have = set(dumped_steps(folder, "train"))
    missing = [s for s in range(start, cfg.max_steps) if s not in have]
    if missing:
        raise ConfigError("rollout_mock.dump_dir", f"no dump of train step {missing[0]} ({step_file(folder, 'train', missing[0], '.pt')}); "
                          f"{len(missing)} of the run's {cfg.max_steps - start} steps are missing")


def _check_writable(path: str, folder: str) -> None:
    target = Path(folder).expanduser()
    probe_dir = next((p for p in [target, *target.parents] if p.exists()), Path("."))
    if not probe_dir.is_dir() or not os.access(probe_dir, os.W_OK | os.X_OK):
        raise ConfigError(path, f"{folder!r} cannot be written ({probe_dir} is not a writable folder)")
    try:  # the nearest existing folder takes a file (root passes os.access even on /proc)
        with tempfile.NamedTemporaryFile(dir=probe_dir, prefix=".roll-write-check-"):
            pass
    except OSError as e:
        raise ConfigError(path, f"{folder!r} cannot be written ({probe_dir}: {e.strerror})") from None


def _check_resume(value: Any, output_dir: str) -> None:
    """The checkpoint a resume would start from matches its manifest (hashes every file once)."""
    from roll.utils.checkpoint import CheckpointError, resolve_resume

    try:
        resolve_resume(value, output_dir)
    except CheckpointError as e:
        raise ConfigError("resume_from_checkpoint", str(e)) from None


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:300]}"
