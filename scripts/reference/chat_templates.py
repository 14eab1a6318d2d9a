"""Reference for models/tests: chat templates as transformers 5.23's `apply_chat_template` renders
them (jinja2's sandbox, upstream's tojson / raise_exception, special tokens, tools, documents,
continue_final_message, named templates) and where a tokenizer keeps them.

Usage: python chat_templates.py OUT_DIR   (TCHTRAIN_ASSETS names the assets folder)

Writes, all on SmolLM2-135M's tokenizer:
  OUT_DIR/smollm2/        its own folder's tokenizer (chat_template.jinja), copied
  OUT_DIR/qwen_style/     tokenizer_config.json's `chat_template` a string: a Qwen2.5-style
                          template with tools and tool calls (QWEN_STYLE below)
  OUT_DIR/named/          tokenizer_config.json's `chat_template` a list: `default` (SmolLM2's)
                          and `tool_use` (the Qwen-style one)
  OUT_DIR/named_saved/    `named` loaded and saved by save_pretrained: chat_template.jinja and
                          additional_chat_templates/tool_use.jinja, the key out of the config
  OUT_DIR/cases.json      each case: folder, conversation (JSON text), options, and the rendered
                          text and token ids (tokenize=True's input_ids), or the error
"""

import json
import os
import shutil
import sys
from pathlib import Path

import transformers as tf

OUT = Path(sys.argv[1])
ASSETS = Path(os.environ["TCHTRAIN_ASSETS"])

QWEN_STYLE = '{%- if tools %}\n    {{- \'<|im_start|>system\\n\' }}\n    {%- if messages[0][\'role\'] == \'system\' %}\n        {{- messages[0][\'content\'] }}\n    {%- else %}\n        {{- \'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.\' }}\n    {%- endif %}\n    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}\n    {%- for tool in tools %}\n        {{- "\\n" }}\n        {{- tool | tojson }}\n    {%- endfor %}\n    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}\n{%- else %}\n    {%- if messages[0][\'role\'] == \'system\' %}\n        {{- \'<|im_start|>system\\n\' + messages[0][\'content\'] + \'<|im_end|>\\n\' }}\n    {%- else %}\n        {{- \'<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n\' }}\n    {%- endif %}\n{%- endif %}\n{%- for message in messages %}\n    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}\n        {{- \'<|im_start|>\' + message.role + \'\\n\' + message.content + \'<|im_end|>\' + \'\\n\' }}\n    {%- elif message.role == "assistant" %}\n        {{- \'<|im_start|>\' + message.role }}\n        {%- if message.content %}\n            {{- \'\\n\' + message.content }}\n        {%- endif %}\n        {%- for tool_call in message.tool_calls %}\n            {%- if tool_call.function is defined %}\n                {%- set tool_call = tool_call.function %}\n            {%- endif %}\n            {{- \'\\n<tool_call>\\n{"name": "\' }}\n            {{- tool_call.name }}\n            {{- \'", "arguments": \' }}\n            {{- tool_call.arguments | tojson }}\n            {{- \'}\\n</tool_call>\' }}\n        {%- endfor %}\n        {{- \'<|im_end|>\\n\' }}\n    {%- elif message.role == "tool" %}\n        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}\n            {{- \'<|im_start|>user\' }}\n        {%- endif %}\n        {{- \'\\n<tool_response>\\n\' }}\n        {{- message.content }}\n        {{- \'\\n</tool_response>\' }}\n        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}\n            {{- \'<|im_end|>\\n\' }}\n        {%- endif %}\n    {%- endif %}\n{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- \'<|im_start|>assistant\\n\' }}\n{%- endif %}\n'

# Exercises the environment: tojson's options and float spelling, Python string methods,
# namespace, loop controls, a generation block, special tokens, template kwargs, reasoning
# aliases, dropped null keys, raise_exception.
FEATURES = """{{- bos_token }}
{%- set ns = namespace(n=0) %}
{%- for m in messages %}
    {%- if m.role == 'skip' %}{% continue %}{% endif %}
    {%- set ns.n = ns.n + 1 %}
    {{- '[' + m.role.upper() + ']' + (m.content | default('<none>')).strip() }}
    {%- if m.thinking is defined %}{{ ' think=' + m.thinking + '/' + m.reasoning_content }}{% endif %}
    {%- if m.content is defined and m.content.startswith('split:') %}{{ ' ' + (m.content.split(':', 1)[1].split(',') | tojson) }}{% endif %}
    {%- if m.data is defined %}
{{ m.data | tojson(indent=2) }}
{{ m.data | tojson(sort_keys=true, ensure_ascii=true) }}
{{ m.data | tojson(separators=(',', ':')) }}
{%- for k, v in m.data.items() %} {{ k }}={{ v }}{% endfor %}
    {%- endif %}
    {%- if m.role == 'stop' %}{% break %}{% endif %}
{% endfor %}
{%- if documents %}{% for d in documents %}<doc {{ d.title }}>{{ d.text }}</doc>{% endfor %}{% endif %}
{%- if enable_thinking is defined and not enable_thinking %}<no_think>{% endif %}
{%- if add_generation_prompt %}{% generation %}<assistant n={{ ns.n }}>{% endgeneration %}{% endif %}
{{- eos_token }}"""

RAISES = "{% if messages[0].role != 'user' %}{{ raise_exception('Conversations must start with a user message') }}{% endif %}{{ messages[0].content }}"


def main():
    smol = ASSETS / "smollm2-135m"
    shutil.copytree(smol, OUT / "smollm2", ignore=shutil.ignore_patterns("*.safetensors", "config.json", "generation_config.json"))
    base = json.loads((smol / "tokenizer_config.json").read_text())
    smol_template = (smol / "chat_template.jinja").read_text()
    for folder, template in [
        ("qwen_style", QWEN_STYLE),
        ("named", [{"name": "default", "template": smol_template}, {"name": "tool_use", "template": QWEN_STYLE}]),
    ]:
        (OUT / folder).mkdir()
        shutil.copy(smol / "tokenizer.json", OUT / folder / "tokenizer.json")
        (OUT / folder / "tokenizer_config.json").write_text(json.dumps({**base, "chat_template": template}, indent=2))
    tf.AutoTokenizer.from_pretrained(OUT / "named").save_pretrained(OUT / "named_saved")
    assert (OUT / "named_saved" / "additional_chat_templates" / "tool_use.jinja").exists()
    assert "chat_template" not in json.loads((OUT / "named_saved" / "tokenizer_config.json").read_text())

    chat = [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4."},
        {"role": "user", "content": "And 3+3?"},
    ]
    tools = [{
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather <now> & 'later'",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1e-05}}, "required": ["city"]},
        },
    }]
    tool_chat = [
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich", "days": 2}}}]},
        {"role": "tool", "content": '{"t": 20.5}'},
        {"role": "tool", "content": '{"t": 19}'},
    ]
    features_chat = [
        {"role": "user", "content": "  padded  "},
        {"role": "skip", "content": "never shown"},
        {"role": "assistant", "content": "split:a,b,c", "reasoning": "because"},
        {"role": "user", "content": None, "data": {"zeta": 1.5, "alpha": [1, 2.0, 1e-06, 1e+20], "émoji": "😀 <&>", "nested": {"b": True, "a": None}}},
        {"role": "stop", "content": "last"},
        {"role": "user", "content": "after the break"},
    ]
    cases = [
        ("smollm2", chat, {"add_generation_prompt": True}),
        ("smollm2", chat[1:2], {}),
        ("smollm2", chat[:3], {"continue_final_message": True}),
        ("smollm2", chat[:3], {"continue_final_message": True, "add_generation_prompt": True}),
        ("smollm2", [], {}),
        ("qwen_style", chat, {"add_generation_prompt": True}),
        ("qwen_style", tool_chat, {"tools": tools, "add_generation_prompt": True}),
        ("named", chat, {}),
        ("named", tool_chat, {"tools": tools}),
        ("named", chat, {"chat_template": "tool_use"}),
        ("named_saved", tool_chat, {"tools": tools}),
        ("smollm2", features_chat, {"chat_template": FEATURES, "add_generation_prompt": True, "documents": [{"title": "T", "text": "body"}], "enable_thinking": False}),
        ("smollm2", features_chat[:3], {"chat_template": FEATURES, "continue_final_message": "reasoning"}),
        ("smollm2", chat, {"chat_template": RAISES}),
        ("smollm2", chat[1:], {"chat_template": RAISES}),
    ]
    out = []
    for folder, conversation, options in cases:
        tok = tf.AutoTokenizer.from_pretrained(OUT / folder)
        case = {
            "folder": folder,
            "conversation": json.dumps(conversation, ensure_ascii=False),
            "options": {k: (json.dumps(v, ensure_ascii=False) if k in ("tools", "documents") else v) for k, v in options.items()},
        }
        try:
            case["text"] = tok.apply_chat_template(conversation, tokenize=False, **options)
            case["input_ids"] = list(tok.apply_chat_template(conversation, **options)["input_ids"])
        except Exception as e:  # the Rust side must fail too
            case["error"] = f"{type(e).__name__}: {e}"
        out.append(case)
    (OUT / "cases.json").write_text(json.dumps(out, indent=1, ensure_ascii=False))
    print(f"chat_templates: {len(out)} cases, {sum('error' in c for c in out)} errors")


if __name__ == "__main__":
    main()
