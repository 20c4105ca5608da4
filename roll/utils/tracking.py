"""Metric trackers chosen by ``track_with``: tensorboard (event files under ``tracker_kwargs.log_dir``
or ``logging_dir``), wandb (``mode: offline`` works without network), stdout."""

from __future__ import annotations

import json
import logging
import math
import os
import sys
from typing import Any

log = logging.getLogger(__name__)


class Tracker:
    def log(self, metrics: dict[str, float], step: int) -> None:
        raise NotImplementedError

    def log_episode(self, name: str, text: str, image: Any | None, step: int) -> None:
        """One sampled episode beside the curves: its transcript and its frames as one image ([H, W, 3]
        uint8), where the tracker can show them."""

    def close(self) -> None:
        pass


class StdoutTracker(Tracker):
    def __init__(self, stream: Any = None) -> None:
        self.stream = stream or sys.stdout

    def log(self, metrics: dict[str, float], step: int) -> None:
        shown = {k: round(v, 5) for k, v in sorted(metrics.items()) if _finite(v)}
        print(json.dumps({"step": step, **shown}), file=self.stream, flush=True)


class TensorBoardTracker(Tracker):
    def __init__(self, log_dir: str) -> None:
        from torch.utils.tensorboard import SummaryWriter

        os.makedirs(log_dir, exist_ok=True)
        self.log_dir = log_dir
        self.writer = SummaryWriter(log_dir=log_dir)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for k, v in metrics.items():
            if _finite(v):
                self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def log_episode(self, name: str, text: str, image: Any | None, step: int) -> None:
        self.writer.add_text(name, "```\n" + text + "\n```", step)  # a code block keeps the boards aligned
        if image is not None:
            self.writer.add_image(name, image, step, dataformats="HWC")
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbTracker(Tracker):
    def __init__(self, **kwargs: Any) -> None:
        try:
            import wandb
        except ImportError:
            raise RuntimeError("track_with: wandb needs the wandb package (pip install 'roll[wandb]')") from None
        api_key = kwargs.pop("api_key", None)
        if api_key:
            wandb.login(key=str(api_key))
        self.run = wandb.init(**kwargs)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log({k: v for k, v in metrics.items() if _finite(v)}, step=step)

    def log_episode(self, name: str, text: str, image: Any | None, step: int) -> None:
        import wandb

        entry: dict[str, Any] = {f"{name}/transcript": wandb.Html(f"<pre>{_html_escape(text)}</pre>")}
        if image is not None:
            entry[f"{name}/frames"] = wandb.Image(image)
        self.run.log(entry, step=step)

    def close(self) -> None:
        self.run.finish()


def make_tracker(track_with: str, tracker_kwargs: dict[str, Any], logging_dir: str, exp_name: str) -> Tracker:
    kwargs = dict(tracker_kwargs)
    if track_with == "tensorboard":
        return TensorBoardTracker(kwargs.get("log_dir") or os.path.join(logging_dir, "tensorboard"))
    if track_with == "wandb":
        kwargs.setdefault("name", exp_name)
        kwargs.setdefault("dir", logging_dir)
        return WandbTracker(**kwargs)
    return StdoutTracker()


def _html_escape(text: str) -> str:
    import html

    return html.escape(text)


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)
