"""Rollouts with a scripted policy and a tiny model: token-exact rows, groups, seeds, step-wise
rows, tool episodes, env faults, custom env managers."""

import dataclasses
import re
import time

import pytest
import torch
from transformers import AutoTokenizer

from roll.agentic.conversation import ChatTemplate
from roll.agentic.env_managers.base import EpisodeLimits
from roll.agentic.generation import RequestBatcher, ScriptedPolicy
from roll.agentic.group_filters import GroupFilter
from roll.agentic.rollout import RolloutFailure, local_factory, make_rollout
from roll.configs.loading import load_config

from .support import QWEN_STYLE_TOOLS, CountingSokoban, HangingSokoban, RaisesCounter, RecordingBackend

ANSWERS = ["<answer>Up</answer>", "<answer>Down</answer>", "<answer>Left</answer>", "<answer>Right</answer>", "no idea"]


def config(*overrides):
    base = ["rollout_batch_size=8", "val_batch_size=4", "train_env_manager.num_env_groups=2", "train_env_manager.group_size=4",
            "train_env_manager.num_groups_partition=[2]", "sequence_length=4096", "render_save_dir=null",
            "val_env_manager.num_env_groups=4", "val_env_manager.num_groups_partition=[4]",
            "train_env_manager.group_filter_cls=null",  # (the default's replaying filter is tested on its own)
            "grid_describe_offsets=false"]  # ROLL's board; the default's offsets line is tested where it is turned on
    return load_config("agentic_sokoban", overrides=base + list(overrides)).config


def rollout(cfg, tokenizer, backend, mode="train"):
    template = ChatTemplate(tokenizer)
    template.check_prefix_preserving()
    batcher = RequestBatcher(backend, 1, max_batch_size=32, max_wait_s=0.005)
    limits = EpisodeLimits.of(cfg.train_env_manager if mode == "train" else cfg.val_env_manager)
    factory = lambda params, frames: local_factory(template, batcher.generate, params, cfg.sequence_length, frames,  # noqa: E731
                                                   limits=limits)
    return make_rollout(cfg, mode, template, factory, batcher.take_stats), template


@pytest.fixture
def tok(tiny_model_path):
    return AutoTokenizer.from_pretrained(tiny_model_path)


def _sampled(recorder, prompt, tokens):
    """The generation returned for exactly this prompt with exactly these tokens (envs of a group
    share prompts, so the prompt alone is ambiguous)."""
    matches = [g for p, g in recorder.records if p == prompt and g.token_ids == tokens]
    assert matches, "no generation was sampled for this prompt with these tokens"
    return matches[0]


def assert_token_exact(result, template, recorder):
    b = result.batch
    for i, traj in enumerate(result.trajectories):
        row = traj.row
        ids = b["input_ids"][i][b["attention_mask"][i].bool()].tolist()
        assert ids == row.input_ids
        # decode(input_ids) is the chat-templated conversation (the row stops after the last model turn)
        rendered = template.render(traj.messages, traj.tools if template.renders_tools() else None)
        assert rendered.startswith(template.decode(ids))
        # masked tokens are exactly the sampled ones, turn by turn, with their log-probs
        mask = b["response_mask"][i][: len(ids)].bool()
        sampled, logprobs = [], []
        for start, end in row.turn_spans:
            gen = _sampled(recorder, row.input_ids[:start], row.input_ids[start:end])
            sampled += gen.token_ids
            logprobs += gen.logprobs
        assert torch.tensor(ids)[mask].tolist() == sampled
        torch.testing.assert_close(b["infer_logprobs"][i][: len(ids)][mask], torch.tensor(logprobs))


def test_token_exact_rows_with_a_scripted_policy(tok):
    cfg = config()
    recorder = RecordingBackend(ScriptedPolicy(tok, ANSWERS, seed=1))
    r, template = rollout(cfg, tok, recorder)
    result = r.collect(8, step=0)
    assert len(result.batch) == 8
    assert_token_exact(result, template, recorder)


def test_token_exact_rows_with_a_tiny_model_and_truncated_turns(tiny_model_path, tok):
    from roll.strategies.hf_infer import HFInferStrategy

    from ..strategies.helpers import worker_config

    infer = HFInferStrategy(worker_config(tiny_model_path, "hf_infer"))
    infer.initialize()
    cfg = config("max_tokens_per_step=12", "max_actions_per_traj=3")
    recorder = RecordingBackend(lambda rank, prompts, params: infer.generate(prompts, params))
    r, template = rollout(cfg, tok, recorder)
    result = r.collect(8, step=0)
    assert result.metrics["rollout/SimpleSokoban/turns_hit_token_cap"] > 0  # random model: turns end at the cap
    b = result.batch
    for i, traj in enumerate(result.trajectories):
        ids = b["input_ids"][i][b["attention_mask"][i].bool()].tolist()
        mask = b["response_mask"][i][: len(ids)].bool()
        sampled = [t for s, e in traj.row.turn_spans for t in _sampled(recorder, traj.row.input_ids[:s], traj.row.input_ids[s:e]).token_ids]
        assert torch.tensor(ids)[mask].tolist() == sampled
        for _, e in traj.row.turn_spans:
            if ids[e - 1] != template.eos_id:  # a capped turn is closed by an added (unmasked) EOS
                assert ids[e] == template.eos_id and not mask[e]
    # The log-probs returned at sampling time match a forward pass over the rows.
    lp = infer.compute_log_probs(b)
    m = b["response_mask"].bool()
    torch.testing.assert_close(lp[m], b["infer_logprobs"][m], atol=1e-4, rtol=0)


def test_groups_share_seeds_and_partitions_match(tok):
    cfg = config("custom_envs.FrozenLake=${custom_env.FrozenLake}", "train_env_manager.tags=[SimpleSokoban,FrozenLake]",
                 "train_env_manager.num_env_groups=3", "train_env_manager.num_groups_partition=[2,1]",
                 "train_env_manager.group_size=2", "rollout_batch_size=6")
    r, _ = rollout(cfg, tok, ScriptedPolicy(tok, ANSWERS))
    assert [s.tag for s in r.slots] == ["SimpleSokoban"] * 4 + ["FrozenLake"] * 2
    assert [s.group_id for s in r.slots] == [0, 0, 1, 1, 2, 2]
    result = r.collect(6, step=3)
    first_obs = {}
    for t in result.trajectories:
        opening = 1 + 2 * int(t.request.slot.entry.get("num_demonstrations") or 0)  # system, demonstration pairs
        first_obs.setdefault(t.request.slot.group_id, set()).add(t.messages[opening]["content"])
        assert t.request.seed == result.trajectories[[x.request.slot.group_id for x in result.trajectories].index(t.request.slot.group_id)].request.seed
    assert all(len(v) == 1 for v in first_obs.values())  # one group = one level
    assert len({next(iter(v)) for v in first_obs.values()}) == 3
    groups = result.batch["traj_group_id"].tolist()
    assert sorted(set(groups)) == [f"rollout-3-g{g}-e0" for g in range(3)]
    assert result.metrics["rollout/FrozenLake/num_actions"] >= 1 and "rollout/SimpleSokoban/success" in result.metrics


def _demonstrations_and_first_board(t):
    """(example boards and replies, the episode's own first board) of a trajectory's conversation."""
    n = int(t.request.slot.entry.get("num_demonstrations") or 0)
    pairs = tuple((t.messages[1 + 2 * i]["content"], t.messages[2 + 2 * i]["content"]) for i in range(n))
    first = t.messages[1 + 2 * n]["content"]
    return pairs, first[first.index("Turn 1,"):]  # without the instruction that leads the first user message


@pytest.mark.parametrize("per_episode", [False, True])
def test_demonstrations_per_episode_follow_the_episode_seed(tok, per_episode):
    tags = ["custom_envs.FrozenLake=${custom_env.FrozenLake}", "train_env_manager.tags=[FrozenLake]",
            "train_env_manager.num_env_groups=6", "train_env_manager.num_groups_partition=[6]",
            "train_env_manager.group_size=2", "rollout_batch_size=12", "num_demonstrations=3"]
    cfg = config(*tags, f"demonstrations_per_episode={str(per_episode).lower()}")
    result = rollout(cfg, tok, ScriptedPolicy(tok, ANSWERS))[0].collect(12, step=0)
    plain = {t.request.seed: _demonstrations_and_first_board(t)[1]  # the same levels opened without examples
             for t in rollout(config(*tags, "num_demonstrations=0"), tok, ScriptedPolicy(tok, ANSWERS))[0].collect(12, step=0).trajectories}
    by_group: dict = {}
    for t in result.trajectories:
        pairs, first = _demonstrations_and_first_board(t)
        assert len(pairs) == 3 and all(reply.startswith("<answer>") for _, reply in pairs)
        assert first == plain[t.request.seed]  # making the examples did not change the episode's level
        by_group.setdefault(t.request.slot.group_id, set()).add(pairs)
    assert all(len(v) == 1 for v in by_group.values())  # a group's episodes share their seed and their examples
    openings = {next(iter(v)) for v in by_group.values()}
    if per_episode:
        assert len(openings) == 6  # each level its own examples
        assert len({pairs[-1][1] for pairs in openings}) > 1  # the last example's move is not the same everywhere
    else:
        assert len(openings) == 1  # one fixed set for the tag


def _boards(t):
    """Every board the conversation shows (examples and the episode's turns), as lists of rows."""
    return [m["content"].split("The board:\n")[1].split("\nWhich move")[0].split("\n")
            for m in t.messages if m["role"] == "user"]


@pytest.mark.parametrize("tag", ["FrozenLake", "SimpleSokoban"])
def test_grid_cell_separator_reaches_every_board_the_model_reads(tok, tag):
    tags = [f"custom_envs.{tag}=${{custom_env.{tag}}}", f"train_env_manager.tags=[{tag}]", "num_demonstrations=2"]
    plain = {t.request.seed: _boards(t) for t in rollout(config(*tags), tok, ScriptedPolicy(tok, ANSWERS))[0].collect(8, step=0).trajectories}
    spaced = rollout(config(*tags, "grid_cell_separator=' '"), tok, ScriptedPolicy(tok, ANSWERS))[0].collect(8, step=0)
    for t in spaced.trajectories:
        boards = _boards(t)
        assert len(boards) >= 3  # two examples and the episode's first turn at least
        for board, same in zip(boards[:3], plain[t.request.seed][:3]):  # the two examples and the first turn
            assert [row.split(" ") for row in board] == [list(row) for row in same]
        height, width = len(boards[0]), len(boards[0][0].split(" "))
        for board in boards[3:]:  # later turns: the board after a move, a blocked move or an invalid reply
            assert all([len(c) for c in row.split(" ")] == [1] * width for row in board[-height:])


def _cell(rows, symbols):
    """The (row, column) of the one cell showing one of ``symbols``."""
    (cell,) = [(r, c) for r, row in enumerate(rows) for c, ch in enumerate(row) if ch in symbols]
    return cell


def _positions_prefix(rows, player):
    r, c = _cell(rows, player)
    return f"Positions: you ({r + 1}, {c + 1}); "


def _goal_offsets(rows, player):
    (pr, pc), (gr, gc) = _cell(rows, player), _cell(rows, "G√")
    said = ([f"{abs(gr - pr)} {'down' if gr > pr else 'up'}"] if gr != pr else []) + (
        [f"{abs(gc - pc)} {'right' if gc > pc else 'left'}"] if gc != pc else [])
    return f"From you: goal {', '.join(said) or 'here'}."


POSITIONS = ("grid_describe_positions", "(row, column), counting from (1, 1)", _positions_prefix, False)
# the whole offsets line for FrozenLake's goal; Sokoban's (boxes, targets) is checked by hand in tests/envs/test_grid.py
OFFSETS = ("grid_describe_offsets", "columns left or right things are from you", _goal_offsets, True)


def test_the_default_boards_carry_the_offsets_line():
    cfg = load_config("agentic_sokoban").config
    assert cfg.custom_envs["SimpleSokoban"].env_config["describe_offsets"] is True


@pytest.mark.parametrize("tag, player, key, sentence, expected, full", [
    ("FrozenLake", "PX√", *POSITIONS), ("SimpleSokoban", "PS", *POSITIONS), ("FrozenLake", "PX√", *OFFSETS)])
def test_grid_board_lines_reach_every_board_the_model_reads(tok, tag, player, key, sentence, expected, full):
    tags = [f"custom_envs.{tag}=${{custom_env.{tag}}}", f"train_env_manager.tags=[{tag}]", "num_demonstrations=2"]
    plain = {t.request.seed: _boards(t) for t in rollout(config(*tags), tok, ScriptedPolicy(tok, ANSWERS))[0].collect(8, step=0).trajectories}
    described = rollout(config(*tags, f"{key}=true"), tok, ScriptedPolicy(tok, ANSWERS))[0].collect(8, step=0)
    for t in described.trajectories:
        assert sentence in t.messages[0]["content"] + t.messages[1]["content"]
        boards = _boards(t)
        assert len(boards) >= 3  # two examples and the episode's first turn at least
        height = len(plain[t.request.seed][0])
        for i, board in enumerate(boards):
            rows, line = board[-height - 1:-1], board[-1]
            if i < 3:  # the two examples and the first turn: the plain run's board, and the line under it
                assert rows == plain[t.request.seed][i]
            if full:
                assert line == expected(rows, player)
            else:
                assert line.startswith(expected(rows, player))


def test_step_wise_rows_carry_state_hashes(tok):
    cfg = config("custom_env.SimpleSokoban.env_manager_cls=roll.agentic.env_managers.step.StepEnvManager",
                 "+custom_env.SimpleSokoban.history_window=1", "train_env_manager.group_size=2", "rollout_batch_size=4")
    r, template = rollout(cfg, tok, ScriptedPolicy(tok, ANSWERS))
    assert r.granularity == "step"
    result = r.collect(4, step=0)
    b = result.batch
    assert len(b) == sum(len(t.steps) for t in result.trajectories) > 4
    assert len(b["state_hash"]) == len(b) and all(len(h) == 16 for h in b["state_hash"])
    first = {}
    for i in range(len(b)):
        if b["step_idx"][i] == 0:
            first.setdefault(b["traj_group_id"][i], set()).add(b["state_hash"][i])
    assert all(len(v) == 1 for v in first.values())  # same group, same first state
    # each step row is exactly its prompt plus the sampled tokens: the opening (with its demonstration
    # exchanges) and at most 1 past exchange
    demos = cfg.custom_envs["SimpleSokoban"].num_demonstrations
    for i in range(len(b)):
        ids = b["input_ids"][i][b["attention_mask"][i].bool()]
        text = template.decode(ids.tolist())
        assert text.count("<|im_start|>assistant") <= 2 + demos
        assert text.count("<|im_start|>assistant") >= 1 + demos


ROLL_STEP_TEMPLATE = ("Task: {env_instruction}\nSteps so far: {step_count}; the last {history_length}: [{history}]\n"
                      "Now step {current_step}, board: [{current_observation}] ({max_response_length} tokens)")


def test_roll_step_template_renders_the_recent_history_in_one_user_message(tok):
    """ROLL's GiGPO configs: one user message per turn with the last history_length - 1 steps as text."""
    cfg = config("custom_env.SimpleSokoban.env_manager_cls=roll.pipeline.agentic.env_manager.step_env_manager.StepEnvManager",
                 "+custom_env.SimpleSokoban.history_length=3", f"custom_env.SimpleSokoban.agent_template='{ROLL_STEP_TEMPLATE}'",
                 "custom_env.SimpleSokoban.num_demonstrations=0", "custom_env.SimpleSokoban.max_steps=4",
                 "train_env_manager.group_size=2", "rollout_batch_size=4")
    r, template = rollout(cfg, tok, ScriptedPolicy(tok, ANSWERS))
    result = r.collect(4, step=0)
    b = result.batch
    long = max(result.trajectories, key=lambda t: len(t.steps))
    assert len(long.steps) >= 3
    for rec in long.steps:
        text = template.decode(rec.row.input_ids)
        assert text.count("<|im_start|>user") == 1 and text.count("<|im_start|>assistant") == 1
        shown = min(rec.step_idx, 2)  # history_length 3 counts the current step: at most 2 past ones
        assert f"Steps so far: {rec.step_idx}; the last {shown}:" in text and f"Now step {rec.step_idx + 1}," in text
        assert text.count("(step: ") == shown and f"board: [{rec.observation}]" in text
        if rec.step_idx >= 1:
            prev = long.steps[rec.step_idx - 1]
            assert f"(step: {rec.step_idx}, observation: {prev.observation}, action: {prev.action}" in text
            assert f"reward: {prev.reward})" in text
    assert len(b) == sum(len(t.steps) for t in result.trajectories)


def test_step_history_placeholders_need_the_step_wise_manager():
    from roll.configs.errors import ConfigError

    with pytest.raises(ConfigError, match="step-wise manager only"):
        config(f"custom_env.SimpleSokoban.agent_template='{ROLL_STEP_TEMPLATE}'")


@pytest.mark.parametrize("template_kind", ["smollm2_style_tiny", "qwen_style"])
def test_tool_env_full_episode_through_tool_messages(tok, template_kind):
    if template_kind == "qwen_style":
        tok.chat_template = QWEN_STYLE_TOOLS
    cfg = config("custom_envs.SokobanTool=${custom_env.SokobanTool}", "train_env_manager.tags=[SokobanTool]",
                 "max_tokens_per_step=64")
    moves = [f'<tool_call>{{"name": "move", "arguments": {{"direction": "{d}"}}}}</tool_call>' for d in ("Up", "Down", "Left", "Right")]
    recorder = RecordingBackend(ScriptedPolicy(tok, moves + ["not a call"], seed=3))
    r, template = rollout(cfg, tok, recorder)
    result = r.collect(8, step=0)
    roles = [m["role"] for t in result.trajectories for m in t.messages]
    assert "tool" in roles and "assistant" in roles
    assert_token_exact(result, template, recorder)
    text = template.decode(result.batch["input_ids"][0].tolist())
    assert ("<tool_response>" in text) == (template_kind == "qwen_style")
    assert '"move"' in text  # the tool schema reached the prompt either way


def test_a_flaky_env_loses_no_other_trajectory_and_errors_are_counted(tok):
    cfg = config("+custom_envs.Flaky.env_type=flaky_sokoban", "+custom_envs.Flaky.entry_point=tests.agentic.support:FlakySokoban",
                 "+custom_envs.Flaky.max_steps=5", "+custom_envs.Flaky.env_config={fail_rate: 0.3, format_penalty: -0.1}",
                 "train_env_manager.tags=[SimpleSokoban,Flaky]", "train_env_manager.num_env_groups=4",
                 "train_env_manager.num_groups_partition=[2,2]", "train_env_manager.group_size=2", "rollout_batch_size=8")
    RaisesCounter.count = 0
    r, _ = rollout(cfg, tok, ScriptedPolicy(tok, ANSWERS))
    result = r.collect(8, step=0)
    assert result.metrics["rollout/env_errors"] == RaisesCounter.count > 0
    sokoban = [t for t in result.trajectories if t.request.slot.tag == "SimpleSokoban"]
    assert len(sokoban) == 4  # every healthy env's trajectory is there
    assert len(result.batch) >= 4


def test_a_hung_env_is_reported_dropped_and_retried_and_the_rollout_finishes(tok, caplog):
    cfg = config("+custom_envs.Hangs.env_type=hanging_sokoban", "+custom_envs.Hangs.entry_point=tests.agentic.support:HangingSokoban",
                 "+custom_envs.Hangs.max_steps=4", "+custom_envs.Hangs.env_config={hang_s: 30}",
                 "train_env_manager.tags=[SimpleSokoban,Hangs]", "train_env_manager.num_env_groups=2",
                 "train_env_manager.num_groups_partition=[1,1]", "train_env_manager.group_size=2", "rollout_batch_size=4",
                 "train_env_manager.env_step_timeout=0.5")
    HangingSokoban.hung.clear()
    r, _ = rollout(cfg, tok, ScriptedPolicy(tok, ANSWERS))
    start = time.perf_counter()
    with caplog.at_level("WARNING"):
        result = r.collect(4, step=0)
    assert time.perf_counter() - start < 10  # not the 30 s the env sleeps
    assert result.metrics["rollout/env_errors"] == 1.0  # the group's shared level hung once, in one env
    assert len(result.trajectories) == 4  # the retry on a fresh env completed the episode
    line = next(r.message for r in caplog.records if "hung" in r.message)
    assert "Hangs" in line and "seed" in line and "env_step_timeout=0.5" in line and "turn 2" in line


def test_when_no_episode_survives_the_step_stops_with_one_line_naming_the_env(tok):
    cfg = config("+custom_envs.Flaky.env_type=flaky_sokoban", "+custom_envs.Flaky.entry_point=tests.agentic.support:FlakySokoban",
                 "+custom_envs.Flaky.max_steps=3", "+custom_envs.Flaky.env_config={fail_rate: 1.0}",
                 "train_env_manager.tags=[Flaky]", "train_env_manager.max_env_retries=1")
    r, _ = rollout(cfg, tok, ScriptedPolicy(tok, ANSWERS))
    with pytest.raises(RolloutFailure) as info:
        r.collect(8, step=0)
    message = str(info.value)
    assert "\n" not in message and "0 of 8 episodes survived" in message and "Flaky (env" in message


@pytest.mark.parametrize("limit, per_host", [(0, 0), (2, 0), (3, 4)])
def test_max_env_step_concurrent_bounds_env_calls_across_managers(tok, limit, per_host):
    """8 envs of one tag step in parallel; with max_env_step_concurrent the calls in flight never exceed it,
    also when the envs are split over two managers (4 envs each: a share of the limit each)."""
    cfg = config("+custom_envs.Slow.env_type=counting_sokoban", "+custom_envs.Slow.entry_point=tests.agentic.support:CountingSokoban",
                 "+custom_envs.Slow.max_steps=3", f"+custom_envs.Slow.max_env_step_concurrent={limit}",
                 "train_env_manager.tags=[Slow]", f"train_env_manager.max_env_num_per_worker={per_host}")
    CountingSokoban.peak = 0
    r, _ = rollout(cfg, tok, ScriptedPolicy(tok, ANSWERS))
    assert len(r.managers) == (2 if per_host else 1)
    result = r.collect(8, step=0)
    assert len(result.trajectories) == 8
    if limit:
        assert 1 <= CountingSokoban.peak <= limit
    else:
        assert CountingSokoban.peak > 3  # without a limit the envs do overlap


def test_a_share_of_healthy_episodes_can_be_required(tok):
    cfg = config("+custom_envs.Flaky.env_type=flaky_sokoban", "+custom_envs.Flaky.entry_point=tests.agentic.support:FlakySokoban",
                 "+custom_envs.Flaky.max_steps=5", "+custom_envs.Flaky.env_config={fail_rate: 0.9}",
                 "train_env_manager.tags=[SimpleSokoban,Flaky]", "train_env_manager.num_groups_partition=[1,1]",
                 "train_env_manager.max_env_retries=0", "train_env_manager.min_healthy_share=1.0")
    r, _ = rollout(cfg, tok, ScriptedPolicy(tok, ANSWERS))
    with pytest.raises(RolloutFailure, match="min_healthy_share 1.0"):
        r.collect(8, step=0)


def test_custom_env_manager_from_examples(tok, monkeypatch):
    from ..configs.conftest import REPO

    monkeypatch.syspath_prepend(str(REPO / "examples"))
    cfg = config("train_env_manager.env_manager_cls=custom_env.hint_manager.HintEnvManager",
                 "custom_env.SimpleSokoban.env_manager_cls=null")
    r, _ = rollout(cfg, tok, ScriptedPolicy(tok, ANSWERS))
    result = r.collect(8, step=0)
    users = [m["content"] for t in result.trajectories for m in t.messages if m["role"] == "user"]
    assert users and all("Hint:" in u for u in users)
    assert result.metrics["rollout/SimpleSokoban/hints_given"] >= 1


def test_roll_class_paths_are_aliases(tok):
    cfg = config("custom_env.SimpleSokoban.env_manager_cls=roll.pipeline.agentic.env_manager.traj_env_manager.TrajEnvManager")
    r, _ = rollout(cfg, tok, ScriptedPolicy(tok, ANSWERS))
    assert len(r.collect(8).batch) == 8


def test_validation_uses_its_own_manager_and_greedy_sampling(tok):
    cfg = config()
    r, _ = rollout(cfg, tok, ScriptedPolicy(tok, ANSWERS), mode="val")
    assert r.name == "val" and len(r.slots) == cfg.val_env_manager.num_env_groups
    assert r.managers[0].params.greedy
    assert len(r.collect(cfg.val_batch_size).batch) == cfg.val_batch_size


def test_render_writes_transcripts_and_frames(tok, tmp_path):
    cfg = dataclasses.replace(config(), render_save_dir=str(tmp_path))
    r, _ = rollout(cfg, tok, ScriptedPolicy(tok, ANSWERS))
    r.collect(8, step=2)
    folder = tmp_path / "rollout" / "step_00002"
    files = sorted(p.name for p in folder.iterdir())
    assert any(f.endswith(".txt") for f in files) and any(f.endswith(".png") for f in files)
    from PIL import Image

    gif = next(folder / f for f in files if f.endswith(".gif"))
    frames = len([f for f in files if f.startswith(gif.stem + "_frame")])
    with Image.open(gif) as image:  # the episode as one animation: every state shown for 600 ms
        durations = []
        for i in range(image.n_frames):  # (identical neighbouring states are merged into one longer frame)
            image.seek(i)
            durations.append(image.info["duration"])
    assert frames > 1 and sum(durations) == 600 * frames


def test_validation_plays_the_same_levels_at_every_eval(tok):
    """The val curve must measure the policy, not level difficulty: its episode seeds depend on the run's
    seed only (so a resumed run keeps them), while training levels change every step."""
    cfg = config()
    val, _ = rollout(cfg, tok, ScriptedPolicy(tok, ANSWERS), mode="val")
    assert [q.seed for q in val.requests(0)] == [q.seed for q in val.requests(7)]
    train, _ = rollout(cfg, tok, ScriptedPolicy(tok, ANSWERS))
    assert [q.seed for q in train.requests(0)] != [q.seed for q in train.requests(1)]
    again, _ = rollout(dataclasses.replace(cfg), tok, ScriptedPolicy(tok, ANSWERS), mode="val")
    assert [q.seed for q in again.requests(3)] == [q.seed for q in val.requests(0)]


def test_redundant_envs_keep_whole_groups_and_are_counted(tok):
    cfg = config("train_env_manager.group_size=2", "train_env_manager.group_size_redundancy=1", "rollout_batch_size=4")
    r, _ = rollout(cfg, tok, ScriptedPolicy(tok, ANSWERS))
    assert [s.group_id for s in r.slots] == [0, 0, 0, 1, 1, 1]  # group_size + 1 envs per group
    result = r.collect(4, step=0)
    assert len(result.batch) == 4 and result.metrics["rollout/redundant_left_out"] == 2.0
    groups = result.batch["traj_group_id"].tolist()
    assert sorted(groups.count(g) for g in set(groups)) == [2, 2]
    # the kept episodes are each group's lowest-numbered envs
    assert [t.request.slot.env_id for t in result.trajectories] == [0, 1, 3, 4]


def test_the_env_monitor_reports_progress_and_names_a_stuck_env(tok, caplog):
    """With the env-call limit off, an env stuck in step for 1.5 s is reported once (tag, env, seed, turn, phase)
    while the rollout runs, and the rollout then finishes it."""
    cfg = config("+custom_envs.Hangs.env_type=hanging_sokoban", "+custom_envs.Hangs.entry_point=tests.agentic.support:HangingSokoban",
                 "+custom_envs.Hangs.max_steps=4", "+custom_envs.Hangs.env_config={hang_s: 1.5}",
                 "train_env_manager.tags=[Hangs]", "train_env_manager.num_env_groups=1", "train_env_manager.group_size=2",
                 "train_env_manager.num_groups_partition=[1]", "rollout_batch_size=2", "train_env_manager.env_step_timeout=0",
                 "env_monitor.monitor_interval=0.2", "env_monitor.hung_timeout=0.6")
    HangingSokoban.hung.clear()
    r, _ = rollout(cfg, tok, ScriptedPolicy(tok, ANSWERS))
    with caplog.at_level("INFO", logger="roll.agentic.env_monitor"):
        result = r.collect(2, step=0)
    assert len(result.trajectories) == 2 and result.metrics["rollout/env_errors"] == 0  # slow, not dropped
    assert result.metrics["rollout/env_hung_reports"] == 1.0  # both envs share the seed: one of them hangs
    warning = next(rec.message for rec in caplog.records if "no progress" in rec.message)
    assert "(Hangs, seed" in warning and "in env.step of turn 2" in warning and "hung_timeout=0.6" in warning
    assert any("episodes finished" in rec.message and "running" in rec.message for rec in caplog.records)


def test_the_env_monitor_can_be_switched_off(tok, caplog):
    cfg = config("env_monitor.enable=false", "env_monitor.monitor_interval=0.01")
    r, _ = rollout(cfg, tok, ScriptedPolicy(tok, ANSWERS))
    with caplog.at_level("INFO", logger="roll.agentic.env_monitor"):
        result = r.collect(8, step=0)
    assert result.metrics["rollout/env_hung_reports"] == 0.0
    assert not [rec for rec in caplog.records if rec.name == "roll.agentic.env_monitor"]


class DropGroupZeroOnce(GroupFilter):
    """A group filter (ROLL's interface) that drops group 0 the first time it is asked, and records its calls."""

    calls: list = []

    def __init__(self, config, env_manager_config, mode):
        self.mode = mode
        DropGroupZeroOnce.calls = []

    def filter(self, group_id, episode_id, group):
        DropGroupZeroOnce.calls.append((group_id, episode_id, len(group), group[0].request.seed))
        return group_id == 0 and len(DropGroupZeroOnce.calls) <= 2


def test_a_group_filter_replays_the_groups_it_drops_on_fresh_levels(tok):
    cfg = config("++train_env_manager.group_filter_cls=tests.agentic.test_rollout.DropGroupZeroOnce")
    r, _ = rollout(cfg, tok, ScriptedPolicy(tok, ANSWERS))
    result = r.collect(8, step=2)
    calls = DropGroupZeroOnce.calls
    # asked about both groups once, then only about the replayed group 0 (kept the second time)
    assert [(g, e, n) for g, e, n, _ in calls] == [(0, 0, 4), (1, 0, 4), (0, 0, 4)]
    assert calls[2][3] != calls[0][3]  # the replay is a fresh level
    seeds = {t.request.slot.group_id: t.request.seed for t in result.trajectories}
    assert seeds == {0: calls[2][3], 1: calls[1][3]} and len(result.batch) == 8
    assert result.metrics["rollout/groups_filtered"] == 1.0 and result.metrics["rollout/groups_kept_after_resamples"] == 0.0


def test_uniform_groups_are_dropped_up_to_the_resample_limit(tok):
    cfg = config("++train_env_manager.group_filter_cls=roll.agentic.group_filters.DropUniformRewards",
                 "++train_env_manager.group_filter_max_resamples=2")
    r, _ = rollout(cfg, tok, ScriptedPolicy(tok, ["<answer>Up</answer>"]))  # one answer: every group scores alike
    result = r.collect(8, step=0)
    assert result.metrics["rollout/groups_filtered"] == 4.0  # 2 groups x 2 replays
    assert result.metrics["rollout/groups_kept_after_resamples"] == 2.0 and len(result.batch) == 8
    assert "rollout/trained_score" in result.metrics  # (rollout/score stays the scheduled levels')
    val, _ = rollout(config("+val_env_manager.group_filter_cls=roll.agentic.group_filters.DropUniformRewards"), tok,
                     ScriptedPolicy(tok, ["<answer>Up</answer>"]), mode="val")
    assert val.collect(4, step=0).metrics["val/groups_filtered"] == 0.0  # validation keeps every group


def test_a_group_filter_that_does_not_import_stops_at_load(tmp_path):
    from roll.configs.errors import ConfigError
    from roll.preflight import check_inputs

    cfg = config("++train_env_manager.group_filter_cls=no.such.Filter", f"output_dir={tmp_path}")
    with pytest.raises(ConfigError, match="train_env_manager.group_filter_cls"):
        check_inputs(cfg)


def test_a_failure_outside_the_env_stops_the_collection_in_one_line_naming_where(tok):
    """Issue 29: a generation (engine) failure is not the env's: it is not retried and hidden among env errors,
    it stops the collection naming the manager, env, seed, turn and phase."""
    from roll.agentic.env_managers.base import EpisodeCrash

    def broken_engine(rank, prompts, params):
        raise RuntimeError("CUDA error: an illegal memory access\nsecond line of engine noise")

    r, _ = rollout(config(), tok, broken_engine)
    with pytest.raises(EpisodeCrash) as e:
        r.collect(8, step=0)
    message = str(e.value)
    assert re.fullmatch(r"TrajEnvManager, env \d+ \(SimpleSokoban, seed \d+\), during turn 1, generate: "
                        r"RuntimeError: CUDA error: an illegal memory access", message), message


def test_an_env_that_raises_is_still_an_env_error_and_the_default_share_stops_a_step_losing_most(tok):
    from roll.agentic.rollout import RolloutFailure

    cfg = config("custom_env.SimpleSokoban.env_type=faulty", "+custom_env.SimpleSokoban.env_config.inner=sokoban",
                 "+custom_env.SimpleSokoban.env_config.raise_rate=1.0")
    assert cfg.train_env_manager.min_healthy_share == 0.5
    r, _ = rollout(cfg, tok, ScriptedPolicy(tok, ANSWERS))
    with pytest.raises(RolloutFailure, match=r"0 of 8 episodes survived \(min_healthy_share 0.5\); first error: "
                                             r"SimpleSokoban .*InjectedFault: injected env failure"):
        r.collect(8, step=0)
