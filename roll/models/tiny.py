"""A tiny random-init causal LM with a locally trained BPE tokenizer and a ChatML template.

For tests and smoke runs: no download, builds in about a second, same code paths as a real model.
"""

from __future__ import annotations

from pathlib import Path

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

_CORPUS = """
Sokoban. You are the player on a grid seen from above. Step into a box to shove it onto a target.
Symbols: #: wall, _: empty, O: target, X: box, P: player. The board: Which move do you make?
Moves: Up, Down, Left, Right. Reply with one move in answer tags, like <answer>Up</answer>.
<answer>Up</answer> <answer>Down</answer> <answer>Left</answer> <answer>Right</answer>
<think>I should push the box to the target.</think> <answer>Right</answer>
Turn 1: Observation: ###### #__O## #_X__# #_P__# ###### You have 5 actions left.
FrozenLake: walk to the goal G without falling into a hole O. Invalid response: no action found.
<tool_call>{"name": "move", "arguments": {"direction": "Up"}}</tool_call>
<tool_response>Result: 17</tool_response> Numbers: [3, 4, 5, 6] Target: 17 calculate submit_answer
system user assistant tool The quick brown fox jumps over the lazy dog 0123456789 + - * / ( ) = , . : ; ! ?
"""


def build_tiny_model(path: str | Path, vocab_size: int = 512, hidden_size: int = 64, num_layers: int = 2,
                     num_heads: int = 4, seed: int = 0, tie_word_embeddings: bool = True,
                     num_kv_heads: int | None = None) -> Path:
    """Write a tiny Llama-style model and its tokenizer to ``path`` (returned); the output head shares the input
    embedding's weight unless ``tie_word_embeddings`` is False; ``num_kv_heads`` below ``num_heads`` makes its attention
    grouped-query (several query heads reading one key/value head), as SmolLM2's is."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([_CORPUS] * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, unk_token=None)
    fast.chat_template = CHATML
    fast.save_pretrained(path)

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(fast), hidden_size=hidden_size, intermediate_size=hidden_size * 2, num_hidden_layers=num_layers,
        num_attention_heads=num_heads, num_key_value_heads=num_kv_heads or num_heads, max_position_embeddings=2048,
        tie_word_embeddings=tie_word_embeddings, eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id, bos_token_id=None,
    )
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = fast.eos_token_id
    model.generation_config.pad_token_id = fast.pad_token_id
    model.save_pretrained(path)
    return path
