#!/usr/bin/env python3
"""Writes tests/data/chat_templates/<name>.json: a chat template and cases rendered by transformers.

Run with /work/venv-hf/bin/python (transformers + jinja2, no network):
    python scripts/chat_template_fixtures/make_chat_fixtures.py [OUT_DIR]

Each file is {"template": str, "cases": [{"messages", "add_generation_prompt", "bos_token",
"eos_token", ["date_string"], "expected" | "error"}]}. The expected strings come from
transformers.utils.chat_template_utils.render_jinja_template, the function that
tokenizer.apply_chat_template(..., tokenize=False) uses; "error" is the message of the
jinja2 TemplateError raised by the template's raise_exception.
The templates are reproductions of the models' tokenizer_config.json "chat_template" (see the
README next to the output), plus "constructs", a template written for the interpreter's tests.
"""
import json
import os
import sys

import jinja2
from transformers.utils.chat_template_utils import render_jinja_template

LLAMA3 = r"""{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message + builtin tools #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\n\n"}}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- "<|python_tag|>" + tool_call.name + ".call(" }}
            {%- for arg_name, arg_val in tool_call.arguments | items %}
                {{- arg_name + '="' + arg_val + '"' }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- endif %}
                {%- endfor %}
            {{- ")" }}
        {%- else  %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- '{"name": "' + tool_call.name + '", ' }}
            {{- '"parameters": ' }}
            {{- tool_call.arguments | tojson }}
            {{- "}" }}
        {%- endif %}
        {%- if builtin_tools is defined %}
            {#- This means we're in ipython mode #}
            {{- "<|eom_id|>" }}
        {%- else %}
            {{- "<|eot_id|>" }}
        {%- endif %}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""

LLAMA3_2 = r"""{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""

QWEN25 = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

MISTRAL = r"""{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- ' [INST] ' + system_message + '\n\n' + message['content'] + ' [/INST]' }}
        {%- else %}
            {{- ' [INST] ' + message['content'] + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] + eos_token}}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}
    {%- endif %}
{%- endfor %}
"""

MISTRAL_V03 = r"""{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}

{#- This block checks for alternating user/assistant messages, skipping tool calling messages #}
{%- set ns = namespace() %}
{%- set ns.index = 0 %}
{%- for message in loop_messages %}
    {%- if not (message.role == "tool" or message.role == "tool_results" or (message.tool_calls is defined and message.tool_calls is not none)) %}
        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}
            {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}
        {%- endif %}
        {%- set ns.index = ns.index + 1 %}
    {%- endif %}
{%- endfor %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if tools is not none and (message == user_messages[-1]) %}
            {{- "[AVAILABLE_TOOLS] [" }}
            {%- for tool in tools %}
                {%- set tool = tool.function %}
                {{- '{"type": "function", "function": {' }}
                {%- for key, val in tool.items() if key != "return" %}
                    {%- if val is string %}
                        {{- '"' + key + '": "' + val + '"' }}
                    {%- else %}
                        {{- '"' + key + '": ' + val|tojson }}
                    {%- endif %}
                    {%- if not loop.last %}
                        {{- ", " }}
                    {%- endif %}
                {%- endfor %}
                {{- "}}" }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- else %}
                    {{- "]" }}
                {%- endif %}
            {%- endfor %}
            {{- "[/AVAILABLE_TOOLS]" }}
            {%- endif %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST] " + system_message + "\n\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message.tool_calls is defined and message.tool_calls is not none %}
        {{- "[TOOL_CALLS] [" }}
        {%- for tool_call in message.tool_calls %}
            {%- set out = tool_call.function|tojson %}
            {{- out[:-1] }}
            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}
                {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
            {%- endif %}
            {{- ', "id": "' + tool_call.id + '"}' }}
            {%- if not loop.last %}
                {{- ", " }}
            {%- else %}
                {{- "]" + eos_token }}
            {%- endif %}
        {%- endfor %}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"]|trim + eos_token}}
    {%- elif message["role"] == "tool_results" or message["role"] == "tool" %}
        {%- if message.content is defined and message.content.content is defined %}
            {%- set content = message.content.content %}
        {%- else %}
            {%- set content = message.content %}
        {%- endif %}
        {{- '[TOOL_RESULTS] {"content": ' + content|string + ", " }}
        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}
            {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
        {%- endif %}
        {{- '"call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
    {%- endif %}
{%- endfor %}
"""

MISTRAL_V01 = r"""{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"""

LLAMA2 = r"""{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"""

CHATML = r"""{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"""

# Not a model's template: the constructs the interpreter supports beyond the five families,
# each rendered by jinja2 through transformers (namespace, loop variables, tests, filters,
# methods, slicing, ternaries, whitespace control, comments, for ... if, tuple unpacking).
CONSTRUCTS = r"""{# constructs #}
{%- set ns = namespace(count=0, last_role=none, seen="") %}
{%- for m in messages %}
    {%- set ns.count = ns.count + 1 %}
    {%- set ns.seen = ns.seen ~ m.role[0] | upper %}
    {%- if ns.last_role is none %}first={{ m.role }};{% endif %}
    {%- set ns.last_role = m.role %}
    [{{ loop.index }}/{{ loop.length }} i0={{ loop.index0 }} f={{ loop.first }} l={{ loop.last }}] {{ m['role'] | capitalize }}: {{ m.content | trim | tojson }}
    {%- if m.content.strip().startswith('Hi') %} (greets){% elif m.content.endswith('?') %} (asks){% else %} (says){% endif %}
{% endfor %}
count={{ ns.count }} seen={{ ns.seen }} last={{ ns.last_role | lower }}
users={% for m in messages if m.role == 'user' %}{{ loop.index }}:{{ m.content | length }}{{ ',' if not loop.last else '' }}{% endfor %}

tail={{ messages[1:] | length }} head={{ messages[:1][0].role }} neg={{ messages[-1].role }}
{{ 'gen' if add_generation_prompt else 'nogen' }} {{ 7 - 2 * 3 }} {{ 17 % 5 }} {{ 7 // 2 }} {{ -3 + 10 }}
{{ "a b  c".split() | join("|") }} {{ "x,y".split(",") | tojson }} {{ "ab" in "cabd" }} {{ 'z' not in ['a', 'b'] }}
{{ undefined_thing }}[{{ undefined_thing is defined }}{{ bos_token is defined }}{{ bos_token is string }}{{ none is none }}{{ 1 is string }}]
{{ {"k": [1, 2.5, true, none, "é\"\n"]} | tojson }} {{ [1, [2, 3]] | tojson(indent=2) }}
{{ 3 < 4 and 4 >= 4 and not 2 > 3 and 2 <= 2 and 1 != 2 or false }} {{ (1 + 2) ~ "x" ~ none ~ true }}
{%- for k, v in {"a": 1, "b": "two"} | items %} {{ k }}={{ v }}{% endfor %}
{% if messages | length > 2 %}many{% elif messages %}few{% else %}none{% endif %}
  {%+ if true %}kept-indent{% endif +%}
  {% if true %}lstripped{% endif %}
{{ "  padded  " | trim }}|{{ "MiXeD" | lower }}|{{ "hello world" | title }}|{{ "abc".upper() }}|{{ "a-b-c".replace("-", "+") }}
{{- eos_token -}}
"""

TEMPLATES = {
    "llama3": LLAMA3,
    "llama3_2": LLAMA3_2,
    "qwen2_5": QWEN25,
    "mistral": MISTRAL,
    "mistral_v0_1": MISTRAL_V01,
    "mistral_v0_3": MISTRAL_V03,
    "llama2": LLAMA2,
    "chatml": CHATML,
    "constructs": CONSTRUCTS,
}

TOKENS = {
    "llama3": ("<|begin_of_text|>", "<|eot_id|>"),
    "llama3_2": ("<|begin_of_text|>", "<|eot_id|>"),
    "qwen2_5": ("", "<|im_end|>"),
    "mistral": ("<s>", "</s>"),
    "mistral_v0_1": ("<s>", "</s>"),
    "mistral_v0_3": ("<s>", "</s>"),
    "llama2": ("<s>", "</s>"),
    "chatml": ("<s>", "<|im_end|>"),
    "constructs": ("<s>", "</s>"),
}

SYS = {"role": "system", "content": "You are a concise assistant."}
U1 = {"role": "user", "content": "Hi! What is the capital of France?"}
A1 = {"role": "assistant", "content": "Paris."}
U2 = {"role": "user", "content": "And of Germany?"}
A2 = {"role": "assistant", "content": "Berlin."}
UNI = {"role": "user", "content": "Grüße aus Köln — 你好，世界！ Привет 🙂 ¿qué tal? ∑x²"}
AUNI = {"role": "assistant", "content": "こんにちは 👋 «très bien»"}
WS = {"role": "user", "content": "  \n\tpadded question?  \n "}
AWS = {"role": "assistant", "content": "\n  padded answer \t"}
SYSWS = {"role": "system", "content": "\n  Be brief.  \n"}

CONVERSATIONS = [
    ("system_user", [SYS, U1]),
    ("user_only", [U1]),
    ("multi_turn", [U1, A1, U2]),
    ("system_multi_turn", [SYS, U1, A1, U2, A2]),
    ("ends_with_assistant", [U1, A1]),
    ("non_ascii", [SYS, UNI, AUNI, U2]),
    ("whitespace", [SYSWS, WS, AWS, U2]),
    ("whitespace_no_system", [WS, AWS]),
]

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "The city, e.g. Paris"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
]
UW = {"role": "user", "content": " What's the weather in Paris and Köln? "}
CALL = {"role": "assistant", "tool_calls": [{"type": "function", "function": {
    "name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]}
CALL_WITH_TEXT = {"role": "assistant", "content": "Let me check.", "tool_calls": [
    {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
    {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Köln"}}}]}
RESULT = {"role": "tool", "content": "22°C, sunny"}
RESULT2 = {"role": "tool", "content": {"temperature": 18, "sky": "cloudy"}}
ANSWER = {"role": "assistant", "content": "Paris: 22°C and sunny."}

TOOL_CASES = {
    "llama3": [
        ("tools_system_user", [SYS, UW]),
        ("tools_call_and_result", [SYS, UW, CALL, RESULT, ANSWER, U2]),
        ("tools_mapping_result", [UW, CALL, RESULT2]),
        ("tools_two_calls", [UW, CALL_WITH_TEXT]),
        ("tools_no_user", [SYS]),
    ],
    "qwen2_5": [
        ("tools_system_user", [SYS, UW]),
        ("tools_no_system", [UW]),
        ("tools_call_and_result", [SYS, UW, CALL, RESULT, ANSWER, U2]),
        ("tools_two_calls_two_results", [UW, CALL_WITH_TEXT, RESULT, RESULT2]),
    ],
}
TOOL_CASES["llama3_2"] = TOOL_CASES["llama3"]
CALL_ID = {"role": "assistant", "tool_calls": [{"id": "call00001", "type": "function", "function": {
    "name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]}
CALL_BAD_ID = {"role": "assistant", "tool_calls": [{"id": "x", "type": "function", "function": {
    "name": "get_weather", "arguments": {"city": "Paris"}}}]}
RESULT_ID = {"role": "tool", "tool_call_id": "call00001", "content": "22°C, sunny"}
RESULT_ID_MAP = {"role": "tool", "tool_call_id": "call00001", "content": {"content": "22°C"}}
TOOL_CASES["mistral_v0_3"] = [
    ("tools_system_user", [SYS, UW]),
    ("tools_call_and_result", [SYS, UW, CALL_ID, RESULT_ID, ANSWER, U2]),
    ("tools_nested_content", [UW, CALL_ID, RESULT_ID_MAP, ANSWER]),
    ("tools_bad_call_id", [UW, CALL_BAD_ID]),
]

ERRORS = {
    "mistral": [
        ("user_user", [U1, U2]),
        ("assistant_first", [A1, U1]),
        ("system_then_assistant", [SYS, A1]),
        ("tool_role", [U1, A1, {"role": "tool", "content": "42"}]),
    ],
    "mistral_v0_3": [
        ("user_user", [U1, U2]),
        ("assistant_first", [SYS, A1, U1]),
        ("tool_role_without_id", [U1, A1, {"role": "tool", "content": "42"}]),
        ("other_role", [U1, {"role": "critic", "content": "no"}]),
    ],
    "mistral_v0_1": [
        ("user_user", [U1, U2]),
        ("system_role", [SYS, U1]),
    ],
    "llama2": [
        ("user_user", [SYS, U1, U2]),
        ("assistant_first", [A1]),
    ],
}


# Small templates for the corners of jinja2 the families above may not reach; each is rendered
# with SNIPPET_MESSAGES (add_generation_prompt=True, bos "<s>", eos "</s>") and recorded with
# its output or, for a jinja2 error, "error": the exception's type and message.
SNIPPET_MESSAGES = [SYS, U1, A1, UNI]
SNIPPETS = [
    # whitespace control, trim_blocks, lstrip_blocks, comments, newlines
    "a  {%- if true %}  b  {% endif -%}  c",
    "x\n  {% if true %}\n    y\n  {% endif %}\nz\n",
    "x\n\t {%+ if true %}y{% endif +%}\nz",
    "x\n  {{ 'v' }}\n  {# c #}\nz",
    "x {#- c -#}   y\n{# c #}\nz\n\n",
    "a\r\nb\rc{% if true %}\r\nd{% endif %}",
    "{% for m in messages %}\n  {{- m.role }}\n{% endfor %}\n",
    "{%- for m in messages -%}\n  [{{ m.role -}}  ]\n{%- endfor %}",
    "  {% set x = 1 %}  {{ x }}",
    "{{ '{{ not a tag }}' }}{{ \"%}\" }}{{ '}}' }}",
    # literals and escapes
    r"{{ 'a\tb\\n\'q\' \"d\" \u00e9 \x41 \101 \q' }}",
    "{{ 'adj' \"acent\" }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1.5e-7 }} {{ 2.5e-3 }} {{ 100.0 }} {{ 1_000 }} {{ 3.0 * 2 }}",
    "{{ 7 // -2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 7 / 2 }} {{ 6 / 3 }} {{ -(3) }} {{ +4 }}",
    "{{ [1, 'it\\'s', \"q\\\"\", none, true, 1.5, [2]] }} {{ {'a': 1, 'b': [none]} }} {{ none }} {{ true }}",
    "{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 1 == 1.0 }} {{ 1 == true }} {{ 0 == false }} {{ none == false }} {{ 'a' == 'a' }}",
    "{{ 'b' in {'b': 1} }} {{ 2 in [1, 2] }} {{ 'x' not in 'abc' }} {{ [1] + [2] }} {{ 'ab' * 3 }} {{ not 1 == 2 }} {{ not none }}",
    "{{ 1 and 'x' }}|{{ 0 or '' or 'z' }}|{{ none or 0 }}|{{ 'a' if 0 }}|{{ 'a' if 1 }}|{{ 'p' if false else 'q' if true else 'r' }}",
    "{{ 1 + 2 ~ 3 }}",
    "{{ 'x' ~ 1 ~ none ~ nothing ~ true }} {{ - 3 | abs }} {{ (- 3) | abs }}",
    # access and slicing
    "{{ messages[0]['role'] }} {{ messages[-1].role }} {{ messages[1:3] | length }} {{ messages[::-1][0].role }} {{ messages[::2] | length }} {{ messages[10:] | length }}",
    "{{ 'héllo wörld'[1:4] }} {{ 'héllo'[::-1] }} {{ 'héllo'[-1] }} {{ 'héllo' | length }} {{ 'abc'[5] }}|{{ messages[9] }}|{{ messages[0].nope }}",
    "{{ messages[0].content.split()[1] }} {{ messages[1].content.split('!', 1) | tojson }} {{ 'a,b,,c'.split(',') | tojson }} {{ ' a  b '.split() | tojson }} {{ 'a b c'.split(none, 1) | tojson }}",
    "{{ '  x  '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ '  y'.lstrip() }}|{{ 'z  '.rstrip() }}|{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }}{{ 'abc'.startswith('') }}",
    "{{ 'hello wORLD 3rd'.title() }}|{{ 'hELLO'.capitalize() }}|{{ 'aaa'.replace('a', 'b', 2) }}|{{ 'ab'.replace('', '-') }}|{{ 'Mx'.upper() }}{{ 'Mx'.lower() }}",
    "{{ {'a': 1}.get('a') }} {{ {'a': 1}.get('b') }} {{ {'a': 1}.get('b', 2) }} {{ {'a': 1, 'b': 2}.items() | list }} {{ {'a': 1}.keys() | list }} {{ {'a': 1}.values() | list }}",
    # loops and scoping
    "{% for x in [1, 2, 3] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}",
    "{% for x in [] %}a{% else %}empty{% endfor %}{% for x in [1] %}a{% else %}empty{% endfor %}",
    "{% for k in {'b': 1, 'a': 2} %}{{ k }}{% endfor %} {% for c in 'hé' %}[{{ c }}]{% endfor %} {% for k, v in {'x': 1}.items() %}{{ k }}{{ v }}{% endfor %}",
    "{% for x in [1, 2] %}{% for y in 'ab' %}{{ loop.index }}{{ x }}{{ y }} {% endfor %}{{ loop.index }}|{% endfor %}",
    "{% set x = 'top' %}{% for i in [1, 2] %}{{ x }}{% set x = i %}{{ x }}{% endfor %}{{ x }}",
    "{% if true %}{% set y = 'if-scope' %}{% endif %}{{ y }}{% for i in [1] %}{% set z = 1 %}{% endfor %}[{{ z }}]",
    "{% set ns = namespace(n=0, s='') %}{% for i in [1, 2, 3] if i != 2 %}{% set ns.n = ns.n + i %}{% set ns.s = ns.s ~ loop.index %}{% endfor %}{{ ns.n }} {{ ns.s }}",
    "{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}{{ ns.c is defined }}",
    "{% set messages = messages[1:] %}{{ messages | length }}{% for m in messages %}{% set messages = [] %}{{ messages | length }}{% endfor %}{{ messages | length }}",
    # filters and tests
    "{{ nothing | default('d') }}|{{ '' | default('d') }}|{{ '' | default('d', true) }}|{{ [3, 1] | first }}{{ [3, 1] | last }}|{{ [1, 2] | join('-') }}|{{ 'abc' | list }}",
    "{{ ['a', 'b', 'a'] | reject('equalto', 'a') | list }} {{ [1, 2, 3, 4] | select('odd') | list }} {{ [1, none] | reject('none') | list }} {{ {'a': 1} | items | list }}",
    "{{ ' x ' | trim }}|{{ 'xyx' | trim('x') }}|{{ 'ab' | upper }}|{{ 'AB' | lower }}|{{ 'aB' | capitalize }}|{{ 'a b' | title }}|{{ 'aXa' | replace('a', 'o') }}|{{ 5 | string }}{{ '42' | int + 1 }}{{ 'x' | int }}{{ 3.7 | int }}|{{ -2 | abs }}",
    "{{ {'b': [1, 2.0, {'c': none}], 'a': 'é\\n\\u0001\"'} | tojson }}|{{ {'b': 1, 'a': {}} | tojson(sort_keys=true) }}|{{ [] | tojson(indent=2) }}|{{ {'a': []} | tojson(indent=0) }}|{{ 'x' | tojson }}",
    "{{ nothing is defined }}{{ nothing is undefined }}{{ none is none }}{{ 1 is number }}{{ true is number }}{{ true is boolean }}{{ 1 is integer }}{{ 1.0 is float }}{{ 'a' is string }}{{ [] is sequence }}{{ {} is mapping }}{{ 'a' is iterable }}{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ 9 is divisibleby(2) }}{{ 1 is eq 1 }}{{ 1 is ne 1 }}{{ 'ab' is lower }}{{ 'AB' is upper }}{{ true is true }}{{ 1 is true }}{{ false is false }}",
    "{{ messages | length }} {{ messages[0] | length }} {{ nothing | length }} {{ messages[0].content | length }} {{ messages | map(attribute='role') | list if false else 'x' }} {{ messages | map(attribute='role') | join(',') }} {{ (1, 'a') }} {{ (1,) }} {{ () }} {{ (1, 2) == [1, 2] }} {{ (1, 2) | tojson }}",
    # errors jinja2 raises
    "{{ nothing.attr }}",
    "{{ messages[0].nope.deeper }}",
    "{{ 1 + 'a' }}",
    "{{ 'a' < 1 }}",
    "{{ 1 / 0 }}",
    "{{ 1 // 0 }}",
    "{{ nothing + 1 }}",
    "{{ nothing | tojson }}",
    "{{ raise_exception('custom: ' ~ messages | length) }}",
    "{% for a, b in [[1, 2, 3]] %}{% endfor %}",
    "{% set x = 1 %}{% set x.y = 2 %}",
    "{{ 5 | join }}",
    "{{ 'a'.split('') }}",
    "{{ 'abc'.nomethod() }}",
    "{{ messages() }}",
]


def render(template, messages, agp, bos, eos, date_string, tools=None):
    kwargs = {"bos_token": bos, "eos_token": eos}
    if date_string is not None:
        kwargs["date_string"] = date_string
    rendered, _ = render_jinja_template(
        conversations=[messages], chat_template=template, add_generation_prompt=agp, tools=tools, **kwargs
    )
    return rendered[0]


def make(name, template):
    bos, eos = TOKENS[name]
    cases = []
    for label, messages in CONVERSATIONS:
        for agp in (True, False):
            for date_string in (["23 Jul 2025", None] if name == "llama3" and label == "user_only" else ["23 Jul 2025"]):
                case = {
                    "name": f"{label}{'' if agp else '_nogen'}{'' if date_string else '_nodate'}",
                    "messages": messages,
                    "add_generation_prompt": agp,
                    "bos_token": bos,
                    "eos_token": eos,
                }
                if date_string is not None:
                    case["date_string"] = date_string
                try:
                    case["expected"] = render(template, messages, agp, bos, eos, date_string)
                except jinja2.exceptions.TemplateError as e:
                    case["error"] = str(e)
                cases.append(case)
    for label, messages in TOOL_CASES.get(name, []):
        for agp in (True, False):
            case = {"name": f"{label}{'' if agp else '_nogen'}", "messages": messages, "tools": TOOLS,
                    "add_generation_prompt": agp, "bos_token": bos, "eos_token": eos, "date_string": "23 Jul 2025"}
            try:
                case["expected"] = render(template, messages, agp, bos, eos, "23 Jul 2025", TOOLS)
            except jinja2.exceptions.TemplateError as e:
                case["error"] = str(e)
            cases.append(case)
    for label, messages in ERRORS.get(name, []):
        case = {"name": label, "messages": messages, "add_generation_prompt": False,
                "bos_token": bos, "eos_token": eos, "date_string": "23 Jul 2025"}
        try:
            case["expected"] = render(template, messages, False, bos, eos, "23 Jul 2025")
            raise SystemExit(f"{name}/{label}: expected raise_exception, got {case['expected']!r}")
        except jinja2.exceptions.TemplateError as e:
            case["error"] = str(e)
        cases.append(case)
    return {"template": template, "cases": cases}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "chat_templates")
    os.makedirs(out, exist_ok=True)
    snippets = []
    for src in SNIPPETS:
        entry = {"template": src}
        try:
            entry["expected"] = render(src, SNIPPET_MESSAGES, True, "<s>", "</s>", None)
        except Exception as e:  # jinja2 errors, TypeError, ZeroDivisionError, ...
            entry["error"] = f"{type(e).__name__}: {e}"
        snippets.append(entry)
    with open(os.path.join(out, "snippets.json"), "w", encoding="utf-8") as f:
        json.dump({"messages": SNIPPET_MESSAGES, "add_generation_prompt": True, "bos_token": "<s>",
                   "eos_token": "</s>", "snippets": snippets}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"snippets: {len(snippets)} ({sum('error' in x for x in snippets)} errors)")
    for name, template in TEMPLATES.items():
        data = make(name, template)
        with open(os.path.join(out, f"{name}.json"), "w", encoding="utf-8") as f:
            json.dump(data, f, ensure_ascii=False, indent=1)
            f.write("\n")
        n_err = sum("error" in c for c in data["cases"])
        print(f"{name}: {len(data['cases'])} cases ({n_err} errors)")


if __name__ == "__main__":
    main()
